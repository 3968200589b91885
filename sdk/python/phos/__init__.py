"""phos from inside the program it checkpoints (the program runs with
libphos.so preloaded; without it every call here is harmless).

    import phos
    for batch in loader:
        phos.step()                 # an iteration boundary: a checkpoint lands here
        train_step(batch)
    phos.checkpoint("/ckpt/7")      # criu dumps this process, which runs on
    phos.status()                   # what `phosctl status` shows
    phos.interval(mtbf_s=3600, overhead_s=1.5)   # seconds between checkpoints
    phos.job.dump(...), phos.job.restore(...)    # a job across hosts (phos/job.py)

    every = phos.Periodic("/ckpt", mtbf_s=6 * 3600, keep=3)   # periodic mode
    for batch in loader:
        every.step()                # phos.step(), and a checkpoint when one is due
        train_step(batch)

A dump asked for between two steps waits for the next one, at most
PHOS_STEP_WAIT_MS (2000 ms by default, read by libphos.so at start): a
checkpoint at the start of an iteration writes the fewest buffers.

At the step a dump waits for, step() hands phos the free blocks of
PyTorch's caching allocator (torch.cuda.memory_snapshot()): the image does
not store them, copy-on-write does not protect them, and a restore leaves
them unfilled. They are dead only while the program waits in that step
call: a dump that closes anywhere else stores all memory.
PHOS_DEAD_MEMORY=0 in the environment turns this off.
"""
import ctypes
import json
import math
import os
import shutil
import subprocess
import sys

from . import _criu_rpc
from . import job

__all__ = ["step", "free_blocks", "idle", "checkpoint", "status", "interval", "young_daly", "Periodic",
           "series_to_remove", "preloaded", "CheckpointError", "job"]


class CheckpointError(RuntimeError):
    """criu refused or failed a checkpoint; the message is criu's."""


def _libphos():
    try:
        this = ctypes.CDLL(None)
        return this if hasattr(this, "phos_step") else None
    except OSError:
        return None


def preloaded():
    """Whether libphos.so is in this process."""
    return _libphos() is not None


def step(free=None):
    """Marks an iteration boundary. Returns False where libphos.so is not
    loaded (nothing to mark). A checkpoint pending at this moment closes the
    process's gate here; the call returns once the checkpoint has let the
    program go on.

    free: the program's free device memory now, as (address, size) pairs,
    which such a checkpoint does not store (the program must not read any of
    it before writing it). None: PyTorch's caching allocator's free blocks,
    taken only where a checkpoint waits for this step and torch has CUDA
    memory; [] hands none."""
    lib = _libphos()
    if lib is None:
        return False
    if free is None:
        free = _torch_free_blocks(lib)
    if free:
        pairs = [n for address, size in free for n in (address, size)]
        lib.phos_step_dead((ctypes.c_uint64 * len(pairs))(*pairs), ctypes.c_size_t(len(free)))
    else:
        lib.phos_step()
    return True


def free_blocks(snapshot):
    """The free blocks of a PyTorch caching allocator's memory snapshot
    (torch.cuda.memory_snapshot(): segments, each with its blocks in address
    order), as (address, size) pairs: the blocks in state 'inactive'. A
    block being freed while a stream still uses it ('active_pending_free')
    is not free yet. Blocks without an address of their own lie one after
    the other from their segment's."""
    free = []
    for segment in snapshot:
        at = segment["address"]
        for block in segment.get("blocks", []):
            address = block.get("address", at)
            if block["state"] == "inactive" and block["size"] > 0:
                free.append((address, block["size"]))
            at = address + block["size"]
    return free


def _torch_free_blocks(lib):
    # Only for a step a checkpoint waits at (a snapshot costs the program a
    # walk over its allocator's blocks), and only where the program imported
    # torch and gave it CUDA memory (never importing torch here).
    if os.environ.get("PHOS_DEAD_MEMORY", "1") == "0":
        return []
    pending = getattr(lib, "phos_step_pending", None)
    if pending is None or not pending():
        return []
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return []
    return free_blocks(torch.cuda.memory_snapshot())


def idle(at_boundary):
    """The program stays at an iteration boundary (True: it waits, for a
    checkpoint it asked for, say) until it says otherwise (False): a
    checkpoint then does not wait for its next step()."""
    lib = _libphos()
    if lib is not None:
        lib.phos_step_idle(ctypes.c_int(1 if at_boundary else 0))


def checkpoint(images_dir, leave_running=True, criu=None, config_file=None, shell_job=True, log_file="dump.log",
               log_level=4, service=None, env=None):
    """Asks criu to dump this process into `images_dir` through criu's RPC
    (`criu swrk`, as libcriu and runc do). With leave_running the process
    runs on once criu is done (phos gives its GPU state back once criu has
    exited); without it criu ends the process, and this does not return.

    criu: the criu binary (default: CRIU, else `criu` on PATH). config_file:
    criu's configuration, where phos's plugin directory is named (`lib DIR`)
    unless criu finds it where it looks by default. shell_job: the process
    may lead its session or have a terminal (criu's --shell-job).
    service: the socket of a running `criu service` (default:
    PHOS_CRIU_SERVICE) to ask instead of starting criu: needed where the
    process is the init of its pid namespace (criu, started from it, would be
    inside the tree it dumps). env: added to criu's environment (phos's
    PHOS_* options, e.g. PHOS_PARENT_IMAGE; not with a service, whose
    environment is its own). Returns criu's answer as a dict; raises
    CheckpointError with criu's message.
    """
    if env and (service or os.environ.get("PHOS_CRIU_SERVICE")):
        raise CheckpointError("env cannot reach a running criu service (its environment is its own)")
    service = service or os.environ.get("PHOS_CRIU_SERVICE")
    if not service:
        criu = criu or os.environ.get("CRIU") or shutil.which("criu")
        if not criu:
            raise CheckpointError("criu not found (set CRIU or put criu on PATH, or name a criu service)")
    # criu wants the directory to exist; a program asking for step-N of a
    # series should not have to make each one. Only its owner reads it.
    try:
        os.makedirs(images_dir, mode=0o700, exist_ok=True)
    except OSError as e:
        raise CheckpointError("cannot make the images directory %s: %s" % (images_dir, e))
    # This process waits in the dump: at a boundary until the end.
    idle(True)
    try:
        args = dict(leave_running=leave_running, shell_job=shell_job, config_file=config_file, log_file=log_file,
                    log_level=log_level)
        if service:
            answer = _criu_rpc.dump_self_service(service, images_dir, **args)
        else:
            answer = _criu_rpc.dump_self(criu, images_dir, extra_env=env, **args)
    except OSError as e:
        raise CheckpointError("criu: %s" % e)
    finally:
        idle(False)
    if not answer.get("success"):
        raise CheckpointError("criu dump failed: %s (errno %s; see %s in %s)" %
                              (answer.get("errmsg") or "no message", answer.get("errno", 0), log_file, images_dir))
    return answer


def status(pid=None, phosctl=None):
    """What `phosctl status PID --json` shows for this process (or `pid`):
    the agent's counters, the gate, the allocations. phosctl: its path
    (default: PHOSCTL, else `phosctl` on PATH)."""
    phosctl = job._phosctl(phosctl)
    out = subprocess.run([phosctl, "status", str(pid or os.getpid()), "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError("phosctl status: " + (out.stderr.strip() or "exit %d" % out.returncode))
    return json.loads(out.stdout)


def interval(mtbf_s, overhead_s, restore_s=0.0):
    """Seconds between checkpoints that waste the least time, for a job
    that fails on average every `mtbf_s` seconds (the whole job's: a GPU's
    MTBF divided by the GPUs it uses) and whose checkpoint costs it
    `overhead_s`. Minimises failures x (restore + half an interval of lost
    work) + checkpoints x overhead (PhOS, appendix A.1): sqrt(2 x overhead x
    MTBF), Young's interval; the restore time does not move the optimum.
    """
    if mtbf_s <= 0 or overhead_s <= 0:
        raise ValueError("mtbf_s and overhead_s must be positive")
    if restore_s < 0:
        raise ValueError("restore_s must not be negative")
    return young_daly(overhead_s, mtbf_s)["young_s"]


def young_daly(cost_s, mtbf_s):
    """The checkpoint interval, as `phosctl periodic --mtbf` chooses it
    (plugin/src/periodic/interval.cc, the same formula): Daly's (2006)
    sqrt(2CM) (1 + sqrt(C/2M)/3 + C/18M) - C where C < 2M, else M, for a
    checkpoint that costs the job C seconds and failures every M seconds
    on average; Young's sqrt(2CM) beside it. A dict: interval_s, young_s,
    daly_s, cost_s, mtbf_s and explanation (one line: formula and inputs)."""
    if not (cost_s > 0 and math.isfinite(cost_s)):
        raise ValueError("the checkpoint cost must be a positive number of seconds")
    if not (mtbf_s > 0 and math.isfinite(mtbf_s)):
        raise ValueError("the mean time between failures must be a positive number of seconds")
    young = math.sqrt(2.0 * cost_s * mtbf_s)
    r = cost_s / (2.0 * mtbf_s)
    daly = young * (1 + math.sqrt(r) / 3 + r / 9) - cost_s if r < 1 else mtbf_s
    text = ("interval %.3f s (Daly: sqrt(2 C M) (1 + sqrt(C/2M)/3 + C/18M) - C%s, with C = checkpoint cost %.3f s, "
            "M = MTBF %.1f s; Young's sqrt(2 C M) = %.3f s)"
            % (daly, "" if r < 1 else ", which is M itself since C >= 2M", cost_s, mtbf_s, young))
    return dict(interval_s=daly, young_s=young, daly_s=daly, cost_s=cost_s, mtbf_s=mtbf_s, explanation=text)


SERIES_MARKER = "phos-series-complete"


def series_to_remove(series, keep):
    """Which checkpoint directories of a series go (plugin/src/periodic/
    series.cc, the same rule): every incomplete one, and complete ones older
    than the newest `keep` (at least 1) complete ones, unless a kept image's
    chain of parents reaches them. series: (name, complete, parent or None)
    tuples, oldest first."""
    parents = {name: parent for name, _, parent in series}
    kept, complete_kept = set(), 0
    for name, complete, _ in reversed(series):
        if not complete or complete_kept >= max(keep, 1):
            continue
        complete_kept += 1
        while name is not None and name not in kept:
            kept.add(name)
            name = parents.get(name)
    return [name for name, _, _ in series if name not in kept]


def _list_series(root):
    out = []
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if not (name.isdigit() and len(name) >= 6 and os.path.isdir(path) and not os.path.islink(path)):
            continue
        marker = os.path.join(path, SERIES_MARKER)
        complete, parent = os.path.isfile(marker), None
        if complete:
            with open(marker) as f:
                for line in f:
                    if line.startswith("parent=") and line.strip() != "parent=":
                        parent = line.strip()[len("parent="):]
        out.append((name, complete, parent))
    return sorted(out, key=lambda s: int(s[0]))


class Periodic:
    """Periodic checkpoints of this process from inside it, in the layout
    of `phosctl periodic` (which `phosctl supervise` restores from): each
    into ROOT/NNNNNN (criu dump --leave-running, through checkpoint()),
    complete once phos-series-complete is in it; the last `keep` complete
    ones kept, older ones removed only once a newer one is complete, never
    a parent a kept image needs (the chain is kept, not merged).

    interval_s: a fixed interval; or mtbf_s: the job's mean time between
    failures, the interval then Young/Daly's (young_daly) from it and the
    cost of the first checkpoint, measured (its duration: from inside, the
    process's stall is not told apart), printed with the formula and inputs
    through `log`. first_s: the first checkpoint after this long (default:
    the interval; 10 s with mtbf_s). incremental: each image against the
    one before (phos's parent_image), a full one every `full_every`.
    Other keyword arguments go to checkpoint()."""

    def __init__(self, root, interval_s=None, mtbf_s=None, keep=3, incremental=False, full_every=4, first_s=None,
                 log=print, clock=None, **checkpoint_args):
        import time
        if (interval_s is None) == (mtbf_s is None):
            raise ValueError("one of interval_s and mtbf_s is needed")
        if interval_s is not None and interval_s <= 0:
            raise ValueError("interval_s must be positive")
        if mtbf_s is not None and mtbf_s <= 0:
            raise ValueError("mtbf_s must be positive")
        if keep < 1 or full_every < 1:
            raise ValueError("keep and full_every must be at least 1")
        self.root, self.interval_s, self.mtbf_s, self.keep = root, interval_s, mtbf_s, keep
        self.incremental, self.full_every, self.log = incremental, full_every, log
        self.clock = clock or time.monotonic
        self.env = dict(checkpoint_args.pop("env", None) or {})
        self.checkpoint_args = checkpoint_args
        self.choice = None
        os.makedirs(root, mode=0o700, exist_ok=True)
        series = _list_series(root)
        self.next_seq = int(series[-1][0]) + 1 if series else 1
        first = first_s if first_s is not None else (interval_s if interval_s is not None else 10.0)
        self.due = self.clock() + first

    def step(self, free=None):
        """phos.step(free), then a checkpoint if one is due; its directory,
        else None."""
        step(free)
        if self.clock() < self.due:
            return None
        return self.checkpoint_now()

    def _parent(self, series):
        if not self.incremental:
            return None
        complete = [s for s in series if s[1]]
        if not complete:
            return None
        parents = {name: parent for name, _, parent in series}
        name, chain = complete[-1][0], 1
        p = parents.get(name)
        while p is not None and chain < self.full_every:
            chain += 1
            p = parents.get(p)
        return None if chain >= self.full_every else name

    def checkpoint_now(self):
        """One checkpoint now; its directory. A failed one is removed, the
        complete ones stay, and CheckpointError is raised."""
        name = "%06d" % self.next_seq
        self.next_seq += 1
        path = os.path.join(self.root, name)
        parent = self._parent(_list_series(self.root))
        env = dict(self.env)
        if parent:
            env["PHOS_PARENT_IMAGE"] = "../" + parent
        t0 = self.clock()
        try:
            checkpoint(path, leave_running=True, env=env or None, **self.checkpoint_args)
        except CheckpointError:
            self._prune()
            self.due = self.clock() + (self.interval_s or 10.0)
            raise
        took = self.clock() - t0
        tmp = os.path.join(path, SERIES_MARKER + ".tmp")
        with open(tmp, "w") as f:
            f.write("seq=%d\ndump_s=%f\n%s" % (self.next_seq - 1, took, "parent=%s\n" % parent if parent else ""))
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, os.path.join(path, SERIES_MARKER))
        self.log("phos: checkpoint %s complete in %.3f s%s" % (path, took, " (against ../%s)" % parent if parent else ""))
        if self.interval_s is None and self.choice is None:
            self.choice = young_daly(took, self.mtbf_s)
            self.interval_s = max(self.choice["interval_s"], took)
            self.log("phos: periodic checkpoints: %s; the cost measured on the first checkpoint (its duration)"
                     % self.choice["explanation"])
        self._prune()
        self.due = self.clock() + self.interval_s
        return path

    def _prune(self):
        for name in series_to_remove(_list_series(self.root), self.keep):
            path = os.path.join(self.root, name)
            marker = os.path.join(path, SERIES_MARKER)
            if os.path.exists(marker):
                os.unlink(marker)  # first: a directory half removed is never taken for complete
            shutil.rmtree(path)
            self.log("phos: removed %s (kept: the last %d complete images and their parents)" % (path, self.keep))
