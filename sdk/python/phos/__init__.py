"""phos from inside the program it checkpoints (the program runs with
libphos.so preloaded; without it every call here is harmless).

    import phos
    for batch in loader:
        phos.step()                 # an iteration boundary: a checkpoint lands here
        train_step(batch)
    phos.status()                   # what `phosctl status` shows
    phos.interval(mtbf_s=3600, overhead_s=1.5)   # seconds between checkpoints

A dump asked for between two steps waits for the next one, at most
PHOS_STEP_WAIT_MS (2000 ms by default, read by libphos.so at start): a
checkpoint at the start of an iteration writes the fewest buffers.
"""
import ctypes
import json
import math
import os
import shutil
import subprocess

__all__ = ["step", "idle", "status", "interval", "preloaded"]


def _libphos():
    try:
        this = ctypes.CDLL(None)
        return this if hasattr(this, "phos_step") else None
    except OSError:
        return None


def preloaded():
    """Whether libphos.so is in this process."""
    return _libphos() is not None


def step():
    """Marks an iteration boundary. Returns False where libphos.so is not
    loaded (nothing to mark). A checkpoint pending at this moment closes the
    process's gate here; the call returns once the checkpoint has let the
    program go on."""
    lib = _libphos()
    if lib is None:
        return False
    lib.phos_step()
    return True


def idle(at_boundary):
    """The program stays at an iteration boundary (True: it waits, for a
    checkpoint it asked for, say) until it says otherwise (False): a
    checkpoint then does not wait for its next step()."""
    lib = _libphos()
    if lib is not None:
        lib.phos_step_idle(ctypes.c_int(1 if at_boundary else 0))


def status(pid=None, phosctl=None):
    """What `phosctl status PID --json` shows for this process (or `pid`):
    the agent's counters, the gate, the allocations. phosctl: its path
    (default: PHOSCTL, else `phosctl` on PATH)."""
    phosctl = phosctl or os.environ.get("PHOSCTL") or shutil.which("phosctl")
    if not phosctl:
        raise FileNotFoundError("phosctl not found (set PHOSCTL or put it on PATH)")
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
    return math.sqrt(2.0 * overhead_s * mtbf_s)
