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


if __name__ == "__main__":
    unittest.main()
