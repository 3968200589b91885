"""PyTorch MLP training for the checkpoint tests (the e2e workload contract):
the deterministic MLP of torch_workloads.py, trained for STEPS steps. Every
step appends "STEP LOSS" (the loss as a float hex, exact) to LOSSES and
writes "TOKEN STEP" to STATE (atomically); no file stays open, since CRIU
checks the size of open regular files. A run that was dumped and restored
must write exactly the loss curve of an uninterrupted one. An exception ends
it with its traceback in STATE.error (its output goes nowhere under the e2e
tests).

With PHOS_SDK_STEP=1 each iteration starts with phos.step() (the SDK in
sdk/python): a checkpoint asked for mid-iteration lands on the next one.

With PHOS_TEST_SCRATCH_MIB=N each iteration also takes N MiB of scratch from
PyTorch's caching allocator, writes it, reads it and lets it go (as
activations are): at phos.step() it is a free block, dead memory a
checkpoint there does not store; the loss does not depend on it.

With PHOS_TEST_DDP=1 the model trains under DistributedDataParallel in a
job of one rank (backend nccl, a file store next to STATE): every backward
all-reduces its gradients through an NCCL communicator.

usage: torch_train.py STATE LOSSES STEPS [PACE_MS]
"""
import os
import sys
import time
import traceback

from torch_workloads import build  # also sets CUBLAS_WORKSPACE_CONFIG before CUDA starts
import torch


def step_marker():
    if os.environ.get("PHOS_SDK_STEP") != "1":
        return lambda: None
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "sdk", "python"))
    import phos
    return phos.step


def deterministic():
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True)


def use_scratch(mib, step):
    """N MiB taken, written and read back, then let go: a free block of the
    caching allocator at the next boundary. A restore that left it unfilled
    is never seen: the program writes it before reading it."""
    if not mib:
        return
    scratch = torch.empty(mib << 18, dtype=torch.float32, device="cuda")
    scratch.fill_(float(step))
    if scratch[-1].item() != float(step):
        raise RuntimeError(f"scratch holds {scratch[-1].item()}, not {step}")
    del scratch


def train(model, opt, x, y, steps, pace, losses, state=None, mark=lambda: None):
    """STEPS steps, "STEP LOSS" appended to LOSSES after each and, with
    STATE, "TOKEN STEP" written to it (atomically)."""
    token = os.urandom(8).hex()
    loss_fn = torch.nn.CrossEntropyLoss()
    scratch_mib = int(os.environ.get("PHOS_TEST_SCRATCH_MIB", "0"))
    for step in range(1, steps + 1):
        mark()
        use_scratch(scratch_mib, step)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        with open(losses, "a") as f:
            f.write(f"{step} {loss.item().hex()}\n")
        if state:
            with open(state + ".tmp", "w") as f:
                f.write(f"{token} {step}\n")
            os.rename(state + ".tmp", state)
        time.sleep(pace)


def main():
    state, losses, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    pace = int(sys.argv[4]) / 1000 if len(sys.argv) > 4 else 0.02
    deterministic()
    model, _, opt, (x, y) = build("mlp")
    if os.environ.get("PHOS_TEST_DDP") == "1":
        import torch.distributed as dist
        dist.init_process_group("nccl", init_method=f"file://{state}.store", rank=0, world_size=1)
        model = torch.nn.parallel.DistributedDataParallel(model)
    train(model, opt, x, y, steps, pace, losses, state, step_marker())


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        with open(sys.argv[1] + ".error", "w") as f:
            f.write(traceback.format_exc())
        raise
