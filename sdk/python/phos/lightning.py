"""A PyTorch Lightning callback: each training batch starts at an iteration
boundary (phos.step()), so a checkpoint asked for from outside lands there
(and does not store the caching allocator's free blocks, which phos.step()
hands it), and, if asked, the program checkpoints itself every N steps or S
seconds (such a checkpoint stores all memory: it is taken outside step()).

    from phos.lightning import PhosCallback
    trainer = Trainer(callbacks=[PhosCallback(every_n_steps=1000, images_dir="/ckpt/step-{step}")])

Works with `lightning` and with `pytorch_lightning`; without either it is a
plain class whose hooks a hand-written loop may call the same way.
"""
import time

import phos


def _callback_base():
    try:
        from lightning.pytorch.callbacks import Callback
        return Callback
    except ImportError:
        pass
    try:
        from pytorch_lightning.callbacks import Callback
        return Callback
    except ImportError:
        return object


class PhosCallback(_callback_base()):
    """every_n_steps / every_s: checkpoint the process (phos.checkpoint,
    leave_running unless told otherwise) when the trainer's global step is a
    multiple of every_n_steps, or every_s seconds after the last one (at a
    batch's start, the boundary); 0 for neither. images_dir: where, with
    "{step}" replaced by the global step. The other keyword arguments go to
    phos.checkpoint (criu, config_file, service, ...). clock: for tests."""

    def __init__(self, every_n_steps=0, every_s=0.0, images_dir=None, clock=time.monotonic, **checkpoint_args):
        super().__init__()
        if (every_n_steps or every_s) and not images_dir:
            raise ValueError("PhosCallback: a checkpoint interval needs images_dir")
        if every_n_steps < 0 or every_s < 0:
            raise ValueError("PhosCallback: intervals cannot be negative")
        self.every_n_steps = every_n_steps
        self.every_s = every_s
        self.images_dir = images_dir
        self.checkpoint_args = checkpoint_args
        self.clock = clock
        self.checkpoints = []  # criu's answers, in order
        self._last_step = None
        self._last_time = None

    def _due(self, step):
        if step == self._last_step:
            return False
        if self.every_n_steps and step and step % self.every_n_steps == 0:
            return True
        if self.every_s:
            now = self.clock()
            if self._last_time is None:
                self._last_time = now
            return now - self._last_time >= self.every_s
        return False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx, *args):
        phos.step()
        step = trainer.global_step
        if not self._due(step):
            return
        answer = phos.checkpoint(self.images_dir.format(step=step), **self.checkpoint_args)
        self._last_step = step
        self._last_time = self.clock()
        self.checkpoints.append(answer)
