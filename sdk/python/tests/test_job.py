"""phos.job against a fake phosctl on PATH: the command line it builds,
the per-host figures it reads from phosctl's lines (as phosctl job and its
steps print them), and the JobError naming the host that failed.
test/hooks/nccl_job_hosts.sh runs it with the real phosctl and criu."""
import io
import json
import os
import stat
import sys
import tempfile
import textwrap
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import phos  # noqa: E402
from phos import job  # noqa: E402

RUN = "00c0ffee12345678"
COMMITTED = """\
phos job {r}: coordinating 2 hosts at 10.77.0.1:40111
phos job {r} host 0: 1 rank(s) of NCCL communicator 1f2e3d4c5b6a7980 here (of 2)
phos job {r} host 1: 1 rank(s) of NCCL communicator 1f2e3d4c5b6a7980 here (of 2)
phos job {r} host 1: its ranks held before call 139, their release pending; their stops leased for 10000 ms, renewed every 2500 ms until criu runs
phos job {r} host 0: its ranks held before call 139, their release pending; their stops leased for 10000 ms, renewed every 2500 ms until criu runs
phos job {r}: all 2 ranks of NCCL communicator 1f2e3d4c5b6a7980 held before call 139 on 2 hosts in 212.5 ms; each host's criu runs
phos job {r} host 0: running criu dump -t 4711 -D /img/h0
phos job {r} host 1: running criu dump -t 815 -D /img/h1
phos job {r} host 1: criu exited with status 0 in 1402.3 ms
phos job {r} host 0: criu exited with status 0 in 1530.9 ms
phos job {r} host 0: dumped into /img/h0 (the job committed)
phos job {r} host 1: dumped into /img/h1 (the job committed)
phos job {r}: the job's dump committed: 2 hosts, 2 ranks held before call 139; 1901.7 ms in all
""".format(r=RUN)
ABORTED = """\
phos job {r}: coordinating 2 hosts at 10.77.0.1:40111
phos job {r} host 0: its ranks held before call 139, their release pending
phos job {r} host 1: its ranks held before call 139, their release pending
phos job {r}: all 2 ranks of NCCL communicator 1f2e3d4c5b6a7980 held before call 139 on 2 hosts in 212.5 ms; each host's criu runs
phos job {r} host 1: criu exited with status 1 in 802.0 ms
phos job {r} host 0: criu exited with status 1 in 1200.0 ms
phos job {r} host 1: the dump failed: the job's dump was aborted (host 1: criu dump exited with status 1 (/img/h1/dump.log)); every rank here goes on
phos job {r} host 0: the dump failed: the job's dump was aborted (host 1: criu dump exited with status 1 (/img/h1/dump.log)); every rank here goes on
phos job {r}: the job's dump is aborted on every host: host 1: criu dump exited with status 1 (/img/h1/dump.log); every rank goes on
""".format(r=RUN)
GIVEN_UP = """\
phos job {r}: coordinating 2 hosts at 10.77.0.1:40111
phos job {r}: the job's dump is given up before any rank let go: host 1's step exited with status 137 before holding the ranks
phos job {r}: every host lifted its stops; every rank goes on
""".format(r=RUN)
RESTORED = """\
phos job {r}: coordinating the restore of 2 hosts at 10.77.0.1:40111
phos job {r} host 0: criu exited with status 0 in 733.1 ms
phos job {r} host 1: criu exited with status 0 in 650.4 ms
phos job {r} host 0: restored (root process 4711)
phos job {r} host 1: restored (root process 815)
phos job {r}: the job is restored on 2 hosts in 1012.0 ms (resume run {r})
""".format(r=RUN)
REFUSED = """\
phos job {r}: coordinating the restore of 2 hosts at 10.77.0.1:40111
phos job {r} host 1: the restore failed: the job's restore was given up: ...
phos job {r}: the restore is refused before any host restores: host 1's phos-job is of dump run 00000000000000ab, host 0's of 1111111111111111: not one checkpoint
""".format(r=RUN)


class FakePhosctl:
    """A phosctl on PATH that records its argv and prints OUTPUT, exiting
    with STATUS."""

    def __init__(self, output, status=0, sleep=0):
        self.dir = tempfile.TemporaryDirectory()
        self.argv_file = os.path.join(self.dir.name, "argv.json")
        out_file = os.path.join(self.dir.name, "output")
        with open(out_file, "w") as f:
            f.write(output)
        self.path = os.path.join(self.dir.name, "phosctl")
        with open(self.path, "w") as f:
            f.write(textwrap.dedent("""\
                #!{py}
                import json, sys, time
                json.dump(sys.argv[1:], open({argv!r}, "w"))
                sys.stdout.write(open({out!r}).read())
                sys.stdout.flush()
                time.sleep({sleep})
                sys.exit({status})
                """).format(py=sys.executable, argv=self.argv_file, out=out_file, status=status, sleep=sleep))
        os.chmod(self.path, stat.S_IRWXU)
        self.old_path = os.environ.get("PATH", "")
        self.old_phosctl = os.environ.pop("PHOSCTL", None)
        os.environ["PATH"] = self.dir.name + os.pathsep + self.old_path

    def argv(self):
        with open(self.argv_file) as f:
            return json.load(f)

    def close(self):
        os.environ["PATH"] = self.old_path
        if self.old_phosctl is not None:
            os.environ["PHOSCTL"] = self.old_phosctl
        self.dir.cleanup()


def dump_args(**more):
    args = dict(hosts=2, via="ssh node{i} {cmd}", pids={0: 4711, 1: 815}, dirs="/img/h{i}", lib="/usr/lib/phos",
                listen="10.77.0.1")
    args.update(more)
    return args


class Dump(unittest.TestCase):
    def tearDown(self):
        self.fake.close()

    def test_command_line(self):
        self.fake = FakePhosctl(COMMITTED)
        phos.job.dump(**dump_args(leave_running=True, timeout=60, criu="/sbin/criu",
                                  criu_args=["--tcp-established", "--network-lock", "nftables"]))
        self.assertEqual(self.fake.argv(), [
            "job", "dump", "--hosts", "2", "--via", "ssh node{i} {cmd}", "--dir", "/img/h{i}", "--lib",
            "/usr/lib/phos", "--listen", "10.77.0.1", "--timeout", "60", "--criu", "/sbin/criu",
            "--pid", "0:4711", "--pid", "1:815", "--leave-running",
            "--", "--tcp-established", "--network-lock", "nftables"])

    def test_defaults_add_nothing(self):
        self.fake = FakePhosctl(COMMITTED)
        phos.job.dump(**dump_args(pids=[4711, 815]))
        argv = self.fake.argv()
        for absent in ("--leave-running", "--timeout", "--criu", "--", "--phosctl", "--vote"):
            self.assertNotIn(absent, argv)
        self.assertEqual(argv[-4:], ["--pid", "0:4711", "--pid", "1:815"])

    def test_per_host_figures(self):
        self.fake = FakePhosctl(COMMITTED)
        r = phos.job.dump(**dump_args())
        self.assertEqual(r.run, RUN)
        self.assertEqual((r.ranks, r.communicator, r.held_call), (2, "1f2e3d4c5b6a7980", 139))
        self.assertAlmostEqual(r.hold_ms, 212.5)
        self.assertAlmostEqual(r.total_ms, 1901.7)
        self.assertEqual([h.ranks for h in r.hosts], [1, 1])
        self.assertEqual([h.held_call for h in r.hosts], [139, 139])
        self.assertEqual([h.criu_status for h in r.hosts], [0, 0])
        self.assertEqual([h.criu_ms for h in r.hosts], [1530.9, 1402.3])
        self.assertEqual([h.dir for h in r.hosts], ["/img/h0", "/img/h1"])
        self.assertEqual([h.error for h in r.hosts], [None, None])
        self.assertIn("the job's dump committed", r.output)

    def test_lines_logged_as_they_come(self):
        self.fake = FakePhosctl(COMMITTED)
        log = io.StringIO()
        r = phos.job.dump(**dump_args(log=log))
        self.assertEqual(log.getvalue(), COMMITTED)
        self.assertEqual(r.output, COMMITTED)

    def test_a_phosctl_past_the_wall_timeout_is_killed(self):
        self.fake = FakePhosctl(COMMITTED, sleep=30)
        with self.assertRaises(phos.job.JobError) as caught:
            phos.job.dump(**dump_args(wall_timeout=0.5))
        self.assertIsNone(caught.exception.host)
        self.assertIn("ran past 0.5 s", caught.exception.reason)

    def test_a_host_whose_dump_fails_is_named(self):
        self.fake = FakePhosctl(ABORTED, status=1)
        with self.assertRaises(phos.job.JobError) as caught:
            phos.job.dump(**dump_args())
        e = caught.exception
        self.assertEqual(e.host, 1)
        self.assertEqual(e.reason, "host 1: criu dump exited with status 1 (/img/h1/dump.log)")
        self.assertIn("failed on host 1: host 1: criu dump exited with status 1", str(e))
        self.assertEqual([h.criu_status for h in e.result.hosts], [1, 1])
        self.assertEqual(e.result.held_call, 139)

    def test_a_step_gone_before_go_is_named(self):
        self.fake = FakePhosctl(GIVEN_UP, status=1)
        with self.assertRaises(phos.job.JobError) as caught:
            phos.job.dump(**dump_args())
        self.assertEqual(caught.exception.host, 1)
        self.assertIn("step exited with status 137", caught.exception.reason)

    def test_a_failure_phosctl_names_no_host_for(self):
        self.fake = FakePhosctl("phosctl job: --hosts 0 is not 1..4096\n", status=2)
        with self.assertRaises(phos.job.JobError) as caught:
            phos.job.dump(**dump_args())
        self.assertIsNone(caught.exception.host)
        self.assertIn("exited with status 2: phosctl job: --hosts 0 is not 1..4096", caught.exception.reason)


class Restore(unittest.TestCase):
    def tearDown(self):
        self.fake.close()

    def test_command_line_and_figures(self):
        self.fake = FakePhosctl(RESTORED)
        r = phos.job.restore(hosts=2, via="-", dirs=["/img/h0", "/img/h1"], lib="/usr/lib/phos", listen="10.77.0.1",
                             criu_args=["--tcp-established"])
        self.assertEqual(self.fake.argv(), [
            "job", "restore", "--hosts", "2", "--via", "-", "--dir", "/img/h{i}", "--lib", "/usr/lib/phos",
            "--listen", "10.77.0.1", "--", "--tcp-established"])
        self.assertAlmostEqual(r.total_ms, 1012.0)
        self.assertEqual([h.root_pid for h in r.hosts], [4711, 815])
        self.assertEqual([h.criu_ms for h in r.hosts], [733.1, 650.4])

    def test_refused_names_the_host(self):
        self.fake = FakePhosctl(REFUSED, status=1)
        with self.assertRaises(phos.job.JobError) as caught:
            phos.job.restore(hosts=2, via="-", dirs="/img/h{i}", lib="/l", listen="10.77.0.1")
        self.assertEqual(caught.exception.host, 1)
        self.assertIn("not one checkpoint", caught.exception.reason)


class Arguments(unittest.TestCase):
    def test_dirs(self):
        self.assertEqual(job._dir_template("/c/n{i}", 2), "/c/n{i}")
        self.assertEqual(job._dir_template(["/c/n0/img", "/c/n1/img"], 2), "/c/n{i}/img")
        self.assertEqual(job._dir_template(["/c/10/n0", "/c/10/n1"], 2), "/c/10/n{i}")
        self.assertEqual(job._dir_template(["/c/only"], 1), "/c/only")
        for bad in (["/a/0", "/b/1"], ["/a/0"], "/c/same"):
            with self.assertRaises(ValueError):
                job._dir_template(bad, 2)

    def test_pids(self):
        self.assertEqual(job._pid_args({1: 20, 0: 10}, 2), ["--pid", "0:10", "--pid", "1:20"])
        for bad in ({0: 10}, {0: 10, 2: 20}, [10]):
            with self.assertRaises(ValueError):
                job._pid_args(bad, 2)

    def test_no_phosctl(self):
        old_path, old = os.environ.get("PATH", ""), os.environ.pop("PHOSCTL", None)
        os.environ["PATH"] = "/nonexistent"
        try:
            with self.assertRaises(FileNotFoundError):
                phos.job.dump(**dump_args())
        finally:
            os.environ["PATH"] = old_path
            if old is not None:
                os.environ["PHOSCTL"] = old


if __name__ == "__main__":
    unittest.main()
