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

__all__ = ["step", "free_blocks", "idle", "checkpoint", "status", "interval", "preloaded", "CheckpointError", "job"]


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
               log_level=4, service=None):
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
    inside the tree it dumps). Returns criu's answer as a dict; raises
    CheckpointError with criu's message.
    """
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
            answer = _criu_rpc.dump_self(criu, images_dir, **args)
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
