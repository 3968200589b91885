"""A 2-process tensor-parallel MLP, one process per GPU, for the GPU suite's
tp_mlp_2proc cases (the e2e workload contract; issue 31's evidence).

Rank 0 (this process, on GPU 0) spawns rank 1 (on GPU 1) with
torch.multiprocessing: one process tree. Each rank holds half of each of
BLOCKS blocks: W1's columns (column-parallel) and W2's rows (row-parallel),
so each block's output is the sum of the two ranks' partial products:
  h_r = gelu(x @ W1[:, half r]);  p_r = h_r @ W2[half r, :];  y = p_0 + p_1
The sum is made two ways, in turns:
  even blocks: NCCL all-reduce (a process group over a file store);
  odd blocks:  by hand through CUDA memory shared with torch.multiprocessing
               (CUDA IPC handles): each rank writes p_r into its slot on its
               own GPU, the slots were exchanged at start, and each copies
               the other's slot across GPUs and adds p_0 + p_1 in rank order
               (both ranks get the same bits). CPU queues say when a slot is
               written and when it was read.
Then x = layer_norm(x + y). x carries from step to step, so a pair whose
memory or exchange went wrong after a restore writes another curve.
Each step rank 0 appends "STEP SUM" (x's sum as a float hex, exact) to
LOSSES and writes "TOKEN STEP" to STATE; rank 1 appends its own sum to
LOSSES.r1. An exception ends a rank with its traceback in STATE.error.R.

usage: tp_mlp.py STATE LOSSES STEPS [PACE_MS] [--blocks N] [--width N]
"""
import argparse
import os
import sys
import time
import traceback

BATCH = 128


def parse_args(argv):
    p = argparse.ArgumentParser(description="2-process tensor-parallel MLP (CUDA IPC + NCCL), one GPU each")
    p.add_argument("state", help="TOKEN STEP, rewritten every step by rank 0")
    p.add_argument("losses", help="STEP SUM lines (rank 1: LOSSES.r1)")
    p.add_argument("steps", type=int)
    p.add_argument("pace_ms", type=int, nargs="?", default=20, help="sleep between steps (default 20 ms)")
    p.add_argument("--blocks", type=int, default=4, help="MLP blocks (default 4; even ones NCCL, odd ones IPC)")
    p.add_argument("--width", type=int, default=1024, help="model width (default 1024; hidden 4x)")
    a = p.parse_args(argv)
    if a.steps < 1 or a.blocks < 2 or a.width % 2:
        p.error("STEPS >= 1, --blocks >= 2 and an even --width are needed")
    return a


def weights(a, rank, device):
    """This rank's halves, cut from full weights drawn on the CPU from one
    seed: both ranks cut from the same matrices."""
    import torch
    g = torch.Generator().manual_seed(31)
    hidden = 4 * a.width
    half = hidden // 2
    out = []
    for _ in range(a.blocks):
        w1 = torch.randn(a.width, hidden, generator=g) / a.width ** 0.5
        w2 = torch.randn(hidden, a.width, generator=g) / hidden ** 0.5
        out.append((w1[:, rank * half:(rank + 1) * half].contiguous().to(device),
                    w2[rank * half:(rank + 1) * half, :].contiguous().to(device)))
    x = torch.randn(BATCH, a.width, generator=g).to(device)
    return out, x


def exchange(k, rank, mine, peer, tmp, to_peer, from_peer, p):
    """p_0 + p_1 through the shared slots (block k)."""
    import torch
    mine.copy_(p)
    torch.cuda.synchronize(mine.device)
    to_peer.put(("written", k))
    if from_peer.get(timeout=120) != ("written", k):
        raise RuntimeError(f"rank {rank}: the peer wrote another block than {k}")
    tmp.copy_(peer)  # across GPUs: the peer's slot, mapped here through CUDA IPC
    torch.cuda.synchronize(tmp.device)
    to_peer.put(("read", k))
    if from_peer.get(timeout=120) != ("read", k):
        raise RuntimeError(f"rank {rank}: the peer read another block than {k}")
    return p + tmp if rank == 0 else tmp + p


def run(a, rank, mine, peer, to_peer, from_peer):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    device = torch.device(f"cuda:{rank}")
    dist.init_process_group("nccl", init_method=f"file://{a.state}.store", rank=rank, world_size=2,
                            device_id=device)
    blocks, x = weights(a, rank, device)
    tmp = torch.empty(BATCH, a.width, device=device)
    token = os.urandom(8).hex()
    losses = a.losses if rank == 0 else f"{a.losses}.r1"
    for step in range(1, a.steps + 1):
        with torch.no_grad():
            for k, (w1, w2) in enumerate(blocks):
                part = F.gelu(x @ w1) @ w2
                if k % 2 == 0:
                    dist.all_reduce(part)
                    y = part
                else:
                    y = exchange(k, rank, mine, peer, tmp, to_peer, from_peer, part)
                x = F.layer_norm(x + y, (a.width,))
        total = x.double().sum().item()
        with open(losses, "a") as f:
            f.write(f"{step} {total.hex()}\n")
        if rank == 0:
            with open(a.state + ".tmp", "w") as f:
                f.write(f"{token} {step}\n")
            os.rename(a.state + ".tmp", a.state)
        time.sleep(a.pace_ms / 1000)
    dist.destroy_process_group()


def deterministic():
    import torch
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True)


def rank1(a, slot0, slots, to_peer, from_peer):
    """The spawned rank: sends its own slot back, then runs."""
    try:
        import torch
        torch.cuda.set_device(1)
        deterministic()
        mine = torch.zeros(BATCH, a.width, device="cuda:1")
        slots.put(mine)
        run(a, 1, mine, slot0, to_peer, from_peer)
    except BaseException:
        with open(f"{a.state}.error.1", "w") as f:
            f.write(traceback.format_exc())
        raise


def main(a):
    import torch
    import torch.multiprocessing as mp
    if torch.cuda.device_count() < 2:
        raise SystemExit(f"tp_mlp.py needs 2 GPUs, torch sees {torch.cuda.device_count()}")
    torch.cuda.set_device(0)
    deterministic()
    mp.set_sharing_strategy("file_system")
    ctx = mp.get_context("spawn")
    mine = torch.zeros(BATCH, a.width, device="cuda:0")
    slots, to_1, to_0 = ctx.Queue(), ctx.Queue(), ctx.Queue()
    child = ctx.Process(target=rank1, args=(a, mine, slots, to_0, to_1), daemon=True)
    child.start()
    peer = slots.get(timeout=300)  # rank 1's slot on GPU 1, opened here
    run(a, 0, mine, peer, to_1, to_0)
    child.join(timeout=60)
    if child.exitcode != 0:
        raise RuntimeError(f"rank 1 exited with {child.exitcode}")


if __name__ == "__main__":
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    args = parse_args(sys.argv[1:])
    try:
        main(args)
    except BaseException:
        with open(f"{args.state}.error.0", "w") as f:
            f.write(traceback.format_exc())
        raise
