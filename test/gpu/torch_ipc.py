"""Two processes sharing GPU memory through torch.multiprocessing, for the
GPU suite's torch_ipc case (the e2e workload contract): a tensor-parallel
pair in miniature. The parent allocates the shared activations ACT and OUT
and the child's weights W2, and hands them to a spawned child through an
mp.Queue (CUDA IPC handles, each with an IPC event: cudaIpcGetMemHandle,
cudaIpcGetEventHandle); every step the parent writes ACT = tanh(X @ W1),
the child computes OUT = relu(ACT @ W2) into the shared OUT, and the parent
mixes OUT into X. Each step appends "STEP SUM" (X's sum as a float hex,
exact) to LOSSES and writes "TOKEN STEP" to STATE: a pair that was dumped and
restored must write exactly the curve of an uninterrupted one, which it can
only if both processes see the same memory after the restore. An exception
ends it with its traceback in STATE.error.

usage: torch_ipc.py STATE LOSSES STEPS [PACE_MS]
"""
import os
import sys
import time
import traceback

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch
import torch.multiprocessing as mp

N = 1024


def child(act, out, w2, ask, done):
    torch.cuda.set_device(0)
    while True:
        step = ask.get()
        if step is None:
            return
        with torch.no_grad():
            torch.matmul(act, w2, out=out)
            out.relu_()
        torch.cuda.synchronize()
        done.put(step)


def main():
    state, losses, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    pace = int(sys.argv[4]) / 1000 if len(sys.argv) > 4 else 0.02
    torch.use_deterministic_algorithms(True)
    mp.set_sharing_strategy("file_system")
    ctx = mp.get_context("spawn")
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(256, N, device="cuda", generator=g)
    w1 = torch.randn(N, N, device="cuda", generator=g) / 32
    w2 = torch.randn(N, N, device="cuda", generator=g) / 32
    act = torch.zeros(256, N, device="cuda")
    out = torch.zeros(256, N, device="cuda")
    ask, done = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=child, args=(act, out, w2, ask, done), daemon=True)
    p.start()
    token = os.urandom(8).hex()
    for step in range(1, steps + 1):
        with torch.no_grad():
            torch.matmul(x, w1, out=act)
            act.tanh_()
        torch.cuda.synchronize()
        ask.put(step)
        if done.get(timeout=60) != step:
            raise RuntimeError(f"the child answered another step than {step}")
        with torch.no_grad():
            x = out * 0.5 + x * 0.5
        total = x.double().sum().item()
        with open(losses, "a") as f:
            f.write(f"{step} {total.hex()}\n")
        with open(state + ".tmp", "w") as f:
            f.write(f"{token} {step}\n")
        os.rename(state + ".tmp", state)
        time.sleep(pace)
    ask.put(None)
    p.join(timeout=30)


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        with open(sys.argv[1] + ".error", "w") as f:
            f.write(traceback.format_exc())
        raise
