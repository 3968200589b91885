"""phos.lightning.PhosCallback without Lightning installed: a stand-in
`lightning.pytorch.callbacks.Callback` module, a trainer with a global step,
and phos.step / phos.checkpoint recorded instead of run."""
import importlib
import os
import sys
import types
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import phos  # noqa: E402


class StandInCallback:
    pass


def install_lightning():
    lightning = types.ModuleType("lightning")
    pytorch = types.ModuleType("lightning.pytorch")
    callbacks = types.ModuleType("lightning.pytorch.callbacks")
    callbacks.Callback = StandInCallback
    lightning.pytorch = pytorch
    pytorch.callbacks = callbacks
    sys.modules.update({"lightning": lightning, "lightning.pytorch": pytorch, "lightning.pytorch.callbacks": callbacks})


def remove_lightning():
    for name in ["lightning", "lightning.pytorch", "lightning.pytorch.callbacks"]:
        sys.modules.pop(name, None)


class Trainer:
    def __init__(self):
        self.global_step = 0


class Recorder:
    """phos.step and phos.checkpoint, recorded."""

    def __init__(self, test):
        self.steps = 0
        self.checkpoints = []
        test.addCleanup(setattr, phos, "step", phos.step)
        test.addCleanup(setattr, phos, "checkpoint", phos.checkpoint)
        phos.step = self.step
        phos.checkpoint = self.checkpoint

    def step(self):
        self.steps += 1
        return True

    def checkpoint(self, images_dir, **kwargs):
        self.checkpoints.append((images_dir, kwargs))
        return {"success": True}


def run(callback, trainer, batches):
    for i in range(batches):
        callback.on_train_batch_start(trainer, None, None, i)
        trainer.global_step += 1


class Base(unittest.TestCase):
    def test_a_lightning_callback_where_lightning_is(self):
        install_lightning()
        self.addCleanup(remove_lightning)
        import phos.lightning as pl
        importlib.reload(pl)
        self.assertTrue(issubclass(pl.PhosCallback, StandInCallback))

    def test_a_plain_class_without_lightning(self):
        remove_lightning()
        import phos.lightning as pl
        importlib.reload(pl)
        self.assertIs(pl.PhosCallback.__mro__[1], object)


class Callback(unittest.TestCase):
    def setUp(self):
        install_lightning()
        self.addCleanup(remove_lightning)
        import phos.lightning as pl
        self.pl = importlib.reload(pl)
        self.calls = Recorder(self)

    def test_every_batch_is_a_boundary(self):
        cb = self.pl.PhosCallback()
        run(cb, Trainer(), 7)
        self.assertEqual(self.calls.steps, 7)
        self.assertEqual(self.calls.checkpoints, [])

    def test_every_n_steps_at_multiples_not_at_zero(self):
        cb = self.pl.PhosCallback(every_n_steps=3, images_dir="/ckpt/step-{step}", config_file="/etc/criu/phos.conf")
        run(cb, Trainer(), 10)
        self.assertEqual([d for d, _ in self.calls.checkpoints], ["/ckpt/step-3", "/ckpt/step-6", "/ckpt/step-9"])
        self.assertEqual(self.calls.checkpoints[0][1], {"config_file": "/etc/criu/phos.conf"})
        self.assertEqual(len(cb.checkpoints), 3)

    def test_a_step_seen_twice_checkpoints_once(self):
        # Gradient accumulation: several batches share a global step.
        cb = self.pl.PhosCallback(every_n_steps=2, images_dir="/ckpt/{step}")
        t = Trainer()
        t.global_step = 2
        for i in range(3):
            cb.on_train_batch_start(t, None, None, i)
        self.assertEqual([d for d, _ in self.calls.checkpoints], ["/ckpt/2"])

    def test_every_s_by_the_clock(self):
        now = [100.0]
        cb = self.pl.PhosCallback(every_s=10, images_dir="/ckpt/{step}", clock=lambda: now[0])
        t = Trainer()
        for _ in range(25):
            cb.on_train_batch_start(t, None, None, 0)
            t.global_step += 1
            now[0] += 1.0
        self.assertEqual([d for d, _ in self.calls.checkpoints], ["/ckpt/10", "/ckpt/20"])

    def test_an_interval_needs_a_directory(self):
        with self.assertRaises(ValueError):
            self.pl.PhosCallback(every_n_steps=5)
        with self.assertRaises(ValueError):
            self.pl.PhosCallback(every_s=5)
        with self.assertRaises(ValueError):
            self.pl.PhosCallback(every_n_steps=-1, images_dir="/x")

    def test_a_failed_checkpoint_reaches_the_training_loop(self):
        def refuse(images_dir, **kwargs):
            raise phos.CheckpointError("criu dump failed")
        phos.checkpoint = refuse
        cb = self.pl.PhosCallback(every_n_steps=1, images_dir="/ckpt/{step}")
        t = Trainer()
        t.global_step = 1
        with self.assertRaises(phos.CheckpointError):
            cb.on_train_batch_start(t, None, None, 0)


if __name__ == "__main__":
    unittest.main()
