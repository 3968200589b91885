"""The SDK without libphos.so: the interval, step() and idle() as no-ops,
status() without phosctl. test/e2e/sdk.sh runs it under libphos.so with the
real criu."""
import math
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import phos  # noqa: E402


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


class WithoutLibphos(unittest.TestCase):
    def test_step_is_harmless(self):
        if phos.preloaded():
            self.skipTest("libphos.so is loaded")
        self.assertFalse(phos.step())

    def test_idle_is_harmless(self):
        phos.idle(True)
        phos.idle(False)

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
