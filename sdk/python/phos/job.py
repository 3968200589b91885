"""Checkpoints of a job whose ranks run on several hosts, from Python:
`phosctl job dump` and `phosctl job restore` (README, "A job across
hosts"), each host's tree dumped (restored) by its own criu.

    import phos
    r = phos.job.dump(hosts=2, via="ssh node{i} {cmd}", pids={0: 4711, 1: 815},
                      dirs="/ckpt/job-7/node{i}", lib="/usr/local/lib/phos",
                      listen="10.0.0.5", leave_running=True,
                      criu_args=["--tcp-established"])
    r.held_call, r.hold_ms, r.total_ms
    for h in r.hosts: h.host, h.ranks, h.held_call, h.criu_ms
    phos.job.restore(hosts=2, via="ssh node{i} {cmd}", dirs="/ckpt/job-7/node{i}",
                     lib="/usr/local/lib/phos", listen="10.0.0.5",
                     criu_args=["--tcp-established"])

A failed dump or restore raises JobError, naming the host that failed and
why (its `host` and `reason`); every rank then goes on (a dump) or what the
other hosts restored is killed again (a restore), as phosctl does it.
"""
import os
import re
import shutil
import subprocess
import threading

__all__ = ["dump", "restore", "JobError", "JobResult", "HostResult"]


class HostResult:
    """One host's part, as its step said it: its ranks, the call they were
    held before, criu's exit status and time, its image directory."""

    def __init__(self, host):
        self.host = host
        self.ranks = None        # ranks of the job on this host
        self.held_call = None    # the call its ranks were held before (a dump)
        self.criu_status = None  # criu's exit status
        self.criu_ms = None      # criu's run, ms
        self.dir = None          # where its images went (a committed dump)
        self.root_pid = None     # the restored tree's root (a restore)
        self.error = None        # why its step failed, where it did

    def __repr__(self):
        return "HostResult(%r)" % {k: v for k, v in self.__dict__.items() if v is not None}


class JobResult:
    """What `phosctl job` printed, read: the run, the call every rank was
    held before and how long holding them took (a dump), the whole
    command's time, and each host's figures (`hosts`, by index). `output`
    is phosctl's text (its own lines and every host's step's)."""

    def __init__(self, kind, nhosts, output):
        self.kind = kind
        self.run = None
        self.communicator = None
        self.ranks = None
        self.held_call = None
        self.hold_ms = None
        self.total_ms = None
        self.hosts = [HostResult(i) for i in range(nhosts)]
        self.output = output

    def __repr__(self):
        return "JobResult(%s run %s: %d hosts, held before call %s, %s ms)" % (
            self.kind, self.run, len(self.hosts), self.held_call, self.total_ms)


class JobError(RuntimeError):
    """A job's dump or restore failed. host: the host that failed (None
    where phosctl named none, e.g. it could not start); reason: why, as
    phosctl said it; result: what was read of the run before it failed."""

    def __init__(self, kind, host, reason, result):
        where = "host %d" % host if host is not None else "the job"
        super().__init__("phos.job.%s failed on %s: %s" % (kind, where, reason))
        self.host = host
        self.reason = reason
        self.result = result


def _phosctl(phosctl):
    found = phosctl or os.environ.get("PHOSCTL") or shutil.which("phosctl")
    if not found:
        raise FileNotFoundError("phosctl not found (set PHOSCTL or put it on PATH)")
    return found


def _dir_template(dirs, hosts):
    """`dirs` as phosctl's --dir: a template with {i}, or one directory per
    host that differ only by the host's index."""
    if isinstance(dirs, str):
        if hosts > 1 and "{i}" not in dirs:
            raise ValueError("dirs %r names one directory for %d hosts: put {i} where the index goes" % (dirs, hosts))
        return dirs
    dirs = [os.fspath(d) for d in dirs]
    if len(dirs) != hosts:
        raise ValueError("dirs names %d directories for %d hosts" % (len(dirs), hosts))
    if hosts == 1:
        return dirs[0]
    # The part before host 0's "0" and after it, the same for every host.
    for at in range(len(dirs[0])):
        if dirs[0][at] != "0":
            continue
        head, tail = dirs[0][:at], dirs[0][at + 1:]
        if all(d == head + str(i) + tail for i, d in enumerate(dirs)):
            return head + "{i}" + tail
    raise ValueError("dirs %r differ by more than the host's index: phosctl job takes one template" % (dirs,))


def _pid_args(pids, hosts):
    items = pids.items() if isinstance(pids, dict) else enumerate(pids)
    out = {}
    for host, pid in items:
        if not 0 <= int(host) < hosts:
            raise ValueError("pids names host %s, not one of the %d" % (host, hosts))
        out[int(host)] = int(pid)
    if sorted(out) != list(range(hosts)):
        raise ValueError("pids names hosts %s: one tree root is needed for each of the %d" % (sorted(out), hosts))
    args = []
    for host in range(hosts):
        args += ["--pid", "%d:%d" % (host, out[host])]
    return args


def _common_args(hosts, via, dirs, lib, listen, timeout, criu, host_phosctl):
    if hosts < 1:
        raise ValueError("hosts must be at least 1")
    args = ["--hosts", str(hosts), "--via", via, "--dir", _dir_template(dirs, hosts), "--lib", os.fspath(lib),
            "--listen", str(listen)]
    if timeout is not None:
        if int(timeout) < 1:
            raise ValueError("timeout must be a whole number of seconds, at least 1")
        args += ["--timeout", str(int(timeout))]
    if criu:
        args += ["--criu", os.fspath(criu)]
    if host_phosctl:
        args += ["--phosctl", os.fspath(host_phosctl)]
    return args


_RUN = r"phos job (?P<run>[0-9a-f]+)"
_DRIVER = [
    (re.compile(_RUN + r": all (?P<ranks>\d+) ranks of NCCL communicator (?P<comm>[0-9a-f]+) held before call "
                r"(?P<call>\d+) on \d+ hosts in (?P<ms>[0-9.]+) ms"), "held"),
    (re.compile(_RUN + r": the job's dump committed: \d+ hosts, (?P<ranks>\d+) ranks held before call (?P<call>\d+); "
                r"(?P<ms>[0-9.]+) ms in all"), "committed"),
    (re.compile(_RUN + r": the job is restored on \d+ hosts in (?P<ms>[0-9.]+) ms"), "restored"),
    (re.compile(_RUN + r": (?:the job's dump is given up before any rank let go|the job's dump is aborted on every "
                r"host|the restore is refused before any host restores|the job's restore failed|the job's dump "
                r"committed, but not every host's images are whole): (?P<why>.*?)"
                r"(?:; every rank goes on|; what the other hosts restored was killed again)?$"), "failed"),
]
_STEP = [
    (re.compile(_RUN + r" host (?P<host>\d+): (?P<ranks>\d+) rank\(s\) of NCCL communicator"), "ranks"),
    (re.compile(_RUN + r" host (?P<host>\d+): its ranks held before call (?P<call>\d+)"), "held"),
    (re.compile(_RUN + r" host (?P<host>\d+): criu exited with status (?P<status>\d+) in (?P<ms>[0-9.]+) ms"), "criu"),
    (re.compile(_RUN + r" host (?P<host>\d+): dumped into (?P<dir>.*) \(the job committed\)"), "dumped"),
    (re.compile(_RUN + r" host (?P<host>\d+): restored \(root process (?P<pid>\d+)\)"), "restored"),
    (re.compile(_RUN + r" host (?P<host>\d+): the (?:dump|restore) failed: (?P<why>.*)"), "step_failed"),
]
# How phosctl names the host that failed a run: "host 1: ...", "host 1's step ...".
_FAILED_HOST = re.compile(r"\bhost (\d+)(?::|'s)")


def _read_driver_line(r, line, failure):
    for pattern, what in _DRIVER:
        m = pattern.search(line)
        if not m:
            continue
        r.run = r.run or m.group("run")
        if what == "held":
            r.ranks, r.communicator = int(m.group("ranks")), m.group("comm")
            r.held_call, r.hold_ms = int(m.group("call")), float(m.group("ms"))
        elif what == "committed":
            r.ranks, r.held_call, r.total_ms = int(m.group("ranks")), int(m.group("call")), float(m.group("ms"))
        elif what == "restored":
            r.total_ms = float(m.group("ms"))
        elif what == "failed" and failure[0] is None:
            failure[0] = m.group("why")
        return True
    return False


def _read_step_line(r, line):
    for pattern, what in _STEP:
        m = pattern.search(line)
        if not m:
            continue
        host = int(m.group("host"))
        if not 0 <= host < len(r.hosts):
            return
        h = r.hosts[host]
        if what == "ranks":
            h.ranks = int(m.group("ranks"))
        elif what == "held":
            h.held_call = int(m.group("call"))
        elif what == "criu":
            h.criu_status, h.criu_ms = int(m.group("status")), float(m.group("ms"))
        elif what == "dumped":
            h.dir = m.group("dir")
        elif what == "restored":
            h.root_pid = int(m.group("pid"))
        elif what == "step_failed":
            h.error = m.group("why")
        return


def _read_output(kind, hosts, text):
    """phosctl's lines read into a JobResult, and the failure phosctl named
    (None where it named none)."""
    r = JobResult(kind, hosts, text)
    failure = [None]
    for line in text.splitlines():
        if not _read_driver_line(r, line, failure):
            _read_step_line(r, line)
    return r, failure[0]


def _own_error(error):
    """A step's failure of its own, not the job's abort it heard of."""
    return bool(error) and "was given up" not in error and "was aborted" not in error


def _failed_host(reason, result):
    """The host a failure names (the first host phosctl's reason names, else
    the one step that said it failed for a reason of its own)."""
    if reason:
        m = _FAILED_HOST.search(reason)
        if m:
            return int(m.group(1))
    own = [h.host for h in result.hosts if _own_error(h.error)]
    return own[0] if len(own) == 1 else None


def _run(kind, hosts, argv, wall_timeout, log):
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except OSError as e:
        raise JobError(kind, None, "phosctl: %s" % e, JobResult(kind, hosts, ""))
    lines = []

    def pump():  # phosctl's lines as they come: a driver may watch them
        for line in proc.stdout:
            lines.append(line)
            if log is not None:
                log.write(line)
                log.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        status = proc.wait(timeout=wall_timeout)
    except subprocess.TimeoutExpired:
        # phosctl gone, its steps lose the coordinator and let their ranks
        # go (or their stops' lease runs out).
        proc.kill()
        proc.wait()
        reader.join()
        r, _ = _read_output(kind, hosts, "".join(lines))
        raise JobError(kind, None, "phosctl job %s ran past %s s" % (kind, wall_timeout), r)
    reader.join()
    text = "".join(lines)
    r, failure = _read_output(kind, hosts, text)
    if status != 0:
        reason = failure
        if reason is None:
            last = [l for l in text.splitlines() if l.strip()]
            reason = "phosctl job %s exited with status %d%s" % (kind, status, (": " + last[-1]) if last else "")
        host = _failed_host(failure, r)
        if host is not None and _own_error(r.hosts[host].error) and r.hosts[host].error not in reason:
            reason += " (host %d's step: %s)" % (host, r.hosts[host].error)
        raise JobError(kind, host, reason, r)
    return r


def dump(hosts, via, pids, dirs, lib, listen, leave_running=False, timeout=None, criu=None, criu_args=(),
         phosctl=None, host_phosctl=None, vote=None, wall_timeout=None, log=None):
    """Dumps a job whose ranks run on `hosts` hosts, each host's tree by its
    own criu, through `phosctl job dump`.

    via: how host i's step runs, {i} the index and {cmd} the step's command
    line ("ssh node{i} {cmd}"; "-" prints the steps for node agents).
    pids: each host's tree root as that host sees it ({host: pid}, or a list
    by host). dirs: each host's image directory: a template with {i}, or a
    list by host. lib: criu's --lib on the hosts. listen: this machine's
    address as every host reaches it. leave_running: the job runs on.
    timeout: the longest any host may stay silent at a stage, s (phosctl's
    default where None). criu: criu on the hosts. criu_args: criu's own
    options (e.g. --tcp-established). phosctl: the phosctl to run here
    (default: PHOSCTL, else PATH); host_phosctl, vote: phosctl and
    phos-job-vote on the hosts, where not at this one's path.
    wall_timeout: the longest this call waits for phosctl, s (None: no
    bound of its own); past it phosctl is killed, and every host's step
    lets its ranks go (or their stops' lease runs out). log: a text stream
    phosctl's lines (its own and its steps') are written to as they come.

    Returns a JobResult; raises JobError naming the host that failed.
    """
    argv = [_phosctl(phosctl), "job", "dump"] + _common_args(hosts, via, dirs, lib, listen, timeout, criu,
                                                             host_phosctl)
    argv += _pid_args(pids, hosts)
    if vote:
        argv += ["--vote", os.fspath(vote)]
    if leave_running:
        argv.append("--leave-running")
    criu_args = list(criu_args)
    if criu_args:
        argv += ["--"] + criu_args
    return _run("dump", hosts, argv, wall_timeout, log)


def restore(hosts, via, dirs, lib, listen, timeout=None, criu=None, criu_args=(), phosctl=None, host_phosctl=None,
            wall_timeout=None, log=None):
    """Restores a job that `dump` (or `phosctl job dump`) checkpointed, each
    host's tree by its own criu, through `phosctl job restore`; the same
    arguments as dump's. Every host's record is checked before any host
    restores. Returns a JobResult; raises JobError naming the host that
    failed (what the others restored is killed again)."""
    argv = [_phosctl(phosctl), "job", "restore"] + _common_args(hosts, via, dirs, lib, listen, timeout, criu,
                                                                host_phosctl)
    criu_args = list(criu_args)
    if criu_args:
        argv += ["--"] + criu_args
    return _run("restore", hosts, argv, wall_timeout, log)
