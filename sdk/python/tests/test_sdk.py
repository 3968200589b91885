"""The SDK without libphos.so: the interval, the RPC encoding against known
bytes, step() and idle() as no-ops, checkpoint() without criu and status()
without phosctl. test/e2e/sdk.sh runs it under libphos.so with the real
criu."""
import math
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import phos  # noqa: E402
from phos import _criu_rpc  # noqa: E402


class Interval(unittest.TestCase):
    def test_young(self):
        self.assertAlmostEqual(phos.interval(3600, 2), math.sqrt(2 * 2 * 3600))

    def test_more_failures_means_more_checkpoints(self):
        self.assertLess(phos.interval(600, 2), phos.interval(3600, 2))

    def test_cheaper_checkpoints_means_more_of_them(self):
        self.assertLess(phos.interval(3600, 0.5), phos.interval(3600, 5))

    def test_phos_paper_example(self):
        # One failure an hour: 279 checkpoints an hour is an overhead of
        # 3600 / (2 * 279^2) s each (PhOS, figure 12).
        overhead = 3600.0 / (2 * 279 ** 2)
        self.assertAlmostEqual(3600 / phos.interval(3600, overhead), 279, places=6)

    def test_bad_input(self):
        for bad in [(0, 1), (1, 0), (-1, 1)]:
            with self.assertRaises(ValueError):
                phos.interval(*bad)
        with self.assertRaises(ValueError):
            phos.interval(10, 1, restore_s=-1)


class Rpc(unittest.TestCase):
    def test_dump_request_bytes(self):
        b = _criu_rpc.encode_dump(5, 77, True, True, "dump.log", 4, "/etc/x.conf")
        # type=DUMP; opts: images_dir_fd=5, pid=77, leave_running, shell_job,
        # log_level=4, log_file, config_file (field 51: a two-byte key).
        opts = (b"\x08\x05" + b"\x10\x4d" + b"\x18\x01" + b"\x38\x01" + b"\x48\x04" + b"\x52\x08dump.log" +
                b"\x9a\x03\x0b/etc/x.conf")
        self.assertEqual(b, b"\x08\x01" + b"\x12" + bytes([len(opts)]) + opts)

    def test_service_request_names_no_pid(self):
        b = _criu_rpc.encode_dump(5, None, True, True, "d", 4)
        # type, opts' key and length, then images_dir_fd=5 and at once
        # leave_running: no pid (field 2) between them.
        self.assertEqual(b[:3], b"\x08\x01\x12")
        self.assertEqual(b[4:8], b"\x08\x05\x18\x01")

    def test_flags_off_leave_no_field(self):
        b = _criu_rpc.encode_dump(5, 77, False, False, "d", 4)
        self.assertNotIn(b"\x18\x01", b)
        self.assertNotIn(b"\x38\x01", b)

    def test_response(self):
        msg = b"bad thing"
        r = _criu_rpc.decode_response(b"\x08\x01\x10\x00\x38\x0c\x4a" + bytes([len(msg)]) + msg)
        self.assertEqual(r, {"type": 1, "success": False, "errno": 12, "errmsg": "bad thing"})
        self.assertTrue(_criu_rpc.decode_response(b"\x08\x01\x10\x01")["success"])

    def test_truncated_response(self):
        with self.assertRaises(ValueError):
            _criu_rpc.decode_response(b"\x08\x81")


class WithoutLibphos(unittest.TestCase):
    def test_step_is_harmless(self):
        if phos.preloaded():
            self.skipTest("libphos.so is loaded")
        self.assertFalse(phos.step())

    def test_idle_is_harmless(self):
        phos.idle(True)
        phos.idle(False)

    def test_checkpoint_without_criu(self):
        old = os.environ.get("PATH")
        os.environ["PATH"] = "/nonexistent"
        os.environ.pop("CRIU", None)
        try:
            with self.assertRaises(phos.CheckpointError):
                phos.checkpoint("/tmp")
        finally:
            os.environ["PATH"] = old

    def test_checkpoint_makes_its_directory(self):
        import stat
        import tempfile
        with tempfile.TemporaryDirectory() as top:
            images = os.path.join(top, "ckpt", "step-50")
            with self.assertRaises(phos.CheckpointError):  # no such criu: after the directory
                phos.checkpoint(images, criu=os.path.join(top, "no-criu"))
            self.assertTrue(os.path.isdir(images))
            self.assertEqual(stat.S_IMODE(os.stat(images).st_mode) & 0o077, 0)

    def test_checkpoint_into_a_file_says_so(self):
        import tempfile
        with tempfile.NamedTemporaryFile() as f:
            with self.assertRaises(phos.CheckpointError) as caught:
                phos.checkpoint(os.path.join(f.name, "step-1"), criu="/bin/true")
            self.assertIn("cannot make the images directory", str(caught.exception))

    def test_status_without_phosctl(self):
        old = os.environ.get("PATH")
        os.environ["PATH"] = "/nonexistent"
        os.environ.pop("PHOSCTL", None)
        try:
            with self.assertRaises(FileNotFoundError):
                phos.status()
        finally:
            os.environ["PATH"] = old


class FreeBlocks(unittest.TestCase):
    """free_blocks() over snapshots shaped as torch.cuda.memory_snapshot()
    gives them (torch 2.x: blocks with their own address; older: without)."""

    def test_inactive_blocks_only(self):
        snapshot = [
            {"address": 0x1000000, "total_size": 0x600000, "blocks": [
                {"address": 0x1000000, "size": 0x200000, "state": "active_allocated"},
                {"address": 0x1200000, "size": 0x300000, "state": "inactive"},
                {"address": 0x1500000, "size": 0x100000, "state": "active_pending_free"},
            ]},
            {"address": 0x9000000, "total_size": 0x200000, "blocks": [
                {"address": 0x9000000, "size": 0x200000, "state": "inactive"},
            ]},
        ]
        self.assertEqual(phos.free_blocks(snapshot), [(0x1200000, 0x300000), (0x9000000, 0x200000)])

    def test_blocks_without_addresses_follow_each_other(self):
        snapshot = [{"address": 0x4000000, "total_size": 0x700000, "blocks": [
            {"size": 0x100000, "state": "active_allocated"},
            {"size": 0x400000, "state": "inactive"},
            {"size": 0x200000, "state": "inactive"},
        ]}]
        self.assertEqual(phos.free_blocks(snapshot), [(0x4100000, 0x400000), (0x4500000, 0x200000)])

    def test_empty(self):
        self.assertEqual(phos.free_blocks([]), [])
        self.assertEqual(phos.free_blocks([{"address": 1, "total_size": 0, "blocks": []}]), [])


class FakeLib:
    """libphos.so's step functions, recorded."""

    def __init__(self, pending):
        self.pending, self.calls = pending, []

    def phos_step(self):
        self.calls.append("step")

    def phos_step_pending(self):
        self.calls.append("pending")
        return 1 if self.pending else 0

    def phos_step_dead(self, pairs, count):
        self.calls.append(("dead", list(pairs), count.value))


class StepHandsFreeBlocks(unittest.TestCase):
    def setUp(self):
        self.saved = phos._libphos

    def tearDown(self):
        phos._libphos = self.saved

    def step(self, lib, **kwargs):
        phos._libphos = lambda: lib
        self.assertTrue(phos.step(**kwargs))
        return lib.calls

    def test_explicit_free_blocks(self):
        calls = self.step(FakeLib(pending=False), free=[(0x1000, 0x2000), (0x8000, 0x100)])
        self.assertEqual(calls, [("dead", [0x1000, 0x2000, 0x8000, 0x100], 2)])

    def test_none_handed(self):
        self.assertEqual(self.step(FakeLib(pending=True), free=[]), ["step"])

    def test_automatic_takes_nothing_where_no_checkpoint_waits(self):
        self.assertEqual(self.step(FakeLib(pending=False)), ["pending", "step"])

    def test_automatic_without_torch_hands_none(self):
        torch = sys.modules.pop("torch", None)
        try:
            self.assertEqual(self.step(FakeLib(pending=True)), ["pending", "step"])
        finally:
            if torch is not None:
                sys.modules["torch"] = torch

    def test_automatic_with_torch_hands_its_free_blocks(self):
        class Cuda:
            @staticmethod
            def is_initialized():
                return True

            @staticmethod
            def memory_snapshot():
                return [{"address": 0x10000, "total_size": 0x3000, "blocks": [
                    {"size": 0x1000, "state": "active_allocated"}, {"size": 0x2000, "state": "inactive"}]}]

        class Torch:
            cuda = Cuda

        torch = sys.modules.get("torch")
        sys.modules["torch"] = Torch
        try:
            self.assertEqual(self.step(FakeLib(pending=True)), ["pending", ("dead", [0x11000, 0x2000], 1)])
            os.environ["PHOS_DEAD_MEMORY"] = "0"
            self.assertEqual(self.step(FakeLib(pending=True)), ["step"])
        finally:
            os.environ.pop("PHOS_DEAD_MEMORY", None)
            if torch is None:
                sys.modules.pop("torch", None)
            else:
                sys.modules["torch"] = torch


class YoungDaly(unittest.TestCase):
    def test_same_figures_as_phosctl(self):
        # test/unit/test_periodic.cc checks the C++ with the same inputs.
        c = phos.young_daly(60, 6 * 3600)
        self.assertAlmostEqual(c["young_s"], 1609.97, places=2)
        self.assertAlmostEqual(c["daly_s"], 1570.22, places=2)
        self.assertEqual(c["interval_s"], c["daly_s"])
        self.assertIn("C = checkpoint cost 60.000 s, M = MTBF 21600.0 s", c["explanation"])

    def test_cost_past_twice_the_mtbf(self):
        self.assertEqual(phos.young_daly(100, 40)["interval_s"], 40)

    def test_bad_input(self):
        for bad in [(0, 1), (1, 0), (float("nan"), 1)]:
            with self.assertRaises(ValueError):
                phos.young_daly(*bad)


class Series(unittest.TestCase):
    def test_keep_and_chains(self):
        full = [("%06d" % i, True, None) for i in range(1, 6)]
        self.assertEqual(phos.series_to_remove(full, 2), ["000001", "000002", "000003"])
        failed = [("000003", True, None), ("000004", True, None), ("000005", False, None)]
        self.assertEqual(phos.series_to_remove(failed, 2), ["000005"])
        chains = [("000001", True, None), ("000002", True, "000001"), ("000003", True, "000002"),
                  ("000004", True, None), ("000005", True, "000004")]
        self.assertEqual(phos.series_to_remove(chains, 2), ["000001", "000002", "000003"])
        self.assertEqual(phos.series_to_remove(chains, 3), [])


class PeriodicMode(unittest.TestCase):
    """Periodic without criu: checkpoint() replaced by one that writes a
    directory, a clock the test moves."""

    def setUp(self):
        import tempfile
        self.root = tempfile.mkdtemp()
        self.now = 0.0
        self.dumps = []
        self.fail_next = False
        self.saved = phos.checkpoint

        def fake_checkpoint(path, leave_running=True, env=None, **_):
            self.assertTrue(leave_running)
            os.makedirs(path, exist_ok=True)
            open(os.path.join(path, "pages-1.img"), "w").close()
            self.dumps.append((os.path.basename(path), dict(env or {})))
            self.now += 2.0  # the dump takes 2 s
            if self.fail_next:
                self.fail_next = False
                raise phos.CheckpointError("criu dump failed: killed")
        phos.checkpoint = fake_checkpoint

    def tearDown(self):
        import shutil
        phos.checkpoint = self.saved
        shutil.rmtree(self.root)

    def run_steps(self, every, seconds):
        logs = []
        end = self.now + seconds
        while self.now < end:
            every.step(free=[])
            self.now += 1.0
        return logs

    def test_mtbf_interval_keep_and_incremental_chain(self):
        logs = []
        every = phos.Periodic(self.root, mtbf_s=3600, keep=2, incremental=True, full_every=3, first_s=5,
                              log=logs.append, clock=lambda: self.now)
        self.run_steps(every, 600)
        choice = phos.young_daly(2.0, 3600)
        self.assertEqual(every.interval_s, choice["interval_s"])
        self.assertTrue(any(choice["explanation"] in l for l in logs), logs)
        # Parents: 1 full, 2 <- 1, 3 <- 2, 4 full, 5 <- 4, ...
        parents = [d[1].get("PHOS_PARENT_IMAGE") for d in self.dumps]
        self.assertEqual(parents[:5], [None, "../000001", "../000002", None, "../000004"])
        kept = sorted(os.listdir(self.root))
        # The last two complete and the chain they need, nothing else.
        series = phos._list_series(self.root)
        self.assertEqual(phos.series_to_remove(series, 2), [])
        last = self.dumps[-1][0]
        self.assertIn(last, kept)
        self.assertLessEqual(len(kept), 2 + 3 - 1)

    def test_a_failed_dump_leaves_the_complete_ones(self):
        every = phos.Periodic(self.root, interval_s=10, keep=1, first_s=1, log=lambda _: None,
                              clock=lambda: self.now)
        self.run_steps(every, 5)
        self.assertEqual(os.listdir(self.root), ["000001"])
        self.fail_next = True
        self.now += 20
        with self.assertRaises(phos.CheckpointError):
            every.step(free=[])
        self.assertEqual(os.listdir(self.root), ["000001"])  # the failed 000002 removed, 000001 kept
        self.now += 20
        every.step(free=[])
        self.assertEqual(os.listdir(self.root), ["000003"])


if __name__ == "__main__":
    unittest.main()
