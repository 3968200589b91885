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


if __name__ == "__main__":
    unittest.main()
