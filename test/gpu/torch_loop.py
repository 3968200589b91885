"""The two PyTorch jobs of the recopy benchmark (bench_recopy.sh), sized in
GiB of device memory, each writing "TOKEN STEP" to STATE (atomically) after
every step, as the e2e workload contract asks, and appending
"STEP END_UNIX_S MS [LOSS]" to STATE.steps:

  infer  an inference loop: a stack of fp16 linear layers (weights only
         read) answering a batch per step, whose keys are appended to a
         preallocated KV cache (a ring: each step writes one slot of it)
  train  a training loop: a GPT-style stack (fp32 linear layers with
         AdamW: weights, gradients and two optimizer states, all written
         every step)
  lora   fine-tuning with a frozen base: a stack of bf16 linear layers
         (weights only read, never given gradients) each with a small
         trainable low-rank adapter (fp32, rank --rank), AdamW on the
         adapters alone: per step the adapters, their gradients and
         optimizer states change, and the activations
  transfer  a loop that moves its own data between host and device every
         step (the traffic benchmark, bench_recopy.sh --traffic): a batch
         of --transfer-mib MiB in from pinned host memory, a kernel over it
         and a few of the fp16 weights (read only, most of G), the result
         out to pinned host memory, and a slot of a ring (a tenth of G,
         allocated first: the lowest addresses) written, so one allocation
         is written a little at a time while the rest stays cold

With --phos-step, train starts each iteration with phos.step() (the SDK in
sdk/python): a dump lands there, and the caching allocator's free blocks
(AdamW's temporaries, the activations) are dead memory it does not store.
With --grads-to-none, train lets its gradients go as each iteration ends
(opt.zero_grad(), set_to_none=True, PyTorch's default) instead of zeroing
them as the next starts: at phos.step() they are free blocks too.

usage: torch_loop.py STATE infer|train|lora|transfer --gib G [--pace-ms N] [--width W] [--rank R] [--transfer-mib M] [--phos-step] [--grads-to-none]
"""
import argparse
import os
import sys
import time
import traceback

import torch


def write_state(state, token, step, began, loss=None):
    # STATE.steps: "STEP END_UNIX_S MS [LOSS]" per step, for the benchmarks
    # (which step a dump slowed, and by how much).
    end = time.time()
    with open(state + ".steps", "a") as f:
        f.write(f"{step} {end:.6f} {(end - began) * 1000:.3f}{'' if loss is None else ' ' + loss}\n")
    with open(state + ".tmp", "w") as f:
        f.write(f"{token} {step}\n")
    os.rename(state + ".tmp", state)


def layers_for(gib, width, bytes_per_param, copies):
    per_layer = width * width * bytes_per_param * copies
    return max(1, int(gib * (1 << 30) // per_layer))


def infer(state, token, gib, pace):
    width, batch = 8192, 16
    # Nine tenths weights, one tenth KV cache.
    n = layers_for(gib * 0.9, width, 2, 1)
    weights = [torch.randn(width, width, device="cuda", dtype=torch.float16) * 0.01 for _ in range(n)]
    slots = max(1, int(gib * 0.1 * (1 << 30)) // (batch * width * 2))
    cache = torch.zeros(slots, batch, width, device="cuda", dtype=torch.float16)
    x0 = torch.randn(batch, width, device="cuda", dtype=torch.float16)
    step = 0
    with torch.inference_mode():
        while True:
            began = time.time()
            x = x0
            for w in weights:
                x = torch.relu(x @ w)
            cache[step % slots].copy_(x)
            torch.cuda.synchronize()
            step += 1
            write_state(state, token, step, began)
            time.sleep(pace)


def transfer(state, token, gib, pace, transfer_mib):
    width, batch = 8192, 16
    ring_slot = 32 << 20
    # Allocated first: the ring takes the lowest addresses, which an
    # address-order copy takes first.
    ring = torch.zeros(max(1, int(gib * 0.1 * (1 << 30)) // ring_slot), ring_slot // 2, device="cuda",
                       dtype=torch.float16)
    n = layers_for(gib * 0.9, width, 2, 1)
    weights = [torch.randn(width, width, device="cuda", dtype=torch.float16) * 0.01 for _ in range(n)]
    elems = (transfer_mib << 20) // 2
    host_in = torch.ones(elems, dtype=torch.float16).pin_memory()
    host_out = torch.empty(elems, dtype=torch.float16, pin_memory=True)
    dev_in = torch.empty(elems, device="cuda", dtype=torch.float16)
    dev_out = torch.empty_like(dev_in)
    x0 = torch.randn(batch, width, device="cuda", dtype=torch.float16)
    slot_elems = min(elems, ring.shape[1])
    step = 0
    with torch.inference_mode():
        while True:
            began = time.time()
            dev_in.copy_(host_in, non_blocking=True)  # host to device, queued
            torch.mul(dev_in, 2, out=dev_out)
            x = x0
            for w in weights[:4]:
                x = torch.relu(x @ w)
            ring[step % ring.shape[0], :slot_elems].copy_(dev_out[:slot_elems])
            host_out.copy_(dev_out, non_blocking=True)  # device to host, queued
            torch.cuda.synchronize()
            step += 1
            write_state(state, token, step, began)
            time.sleep(pace)


class Block(torch.nn.Module):
    """A transformer block's MLP half (pre-norm, 4x wide, residual): where a
    GPT's parameters and optimizer state mostly are."""

    def __init__(self, width):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def step_marker(on):
    if not on:
        return lambda: None
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "sdk", "python"))
    import phos
    return phos.step


def train(state, token, gib, pace, width=4096, mark=lambda: None, grads_to_none=False):
    tokens = 1024
    # fp32 weights, gradients and AdamW's two states: 4 copies of 8 width^2
    # parameters per block; activations are left the rest.
    n = layers_for(gib * 0.95, width, 4 * 8, 4)
    with torch.device("cuda"):  # built on the GPU: tens of GiB of CPU init would take minutes
        model = torch.nn.Sequential(*[Block(width) for _ in range(n)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(tokens, width, device="cuda")
    step = 0
    while True:
        mark()
        began = time.time()
        if not grads_to_none:
            opt.zero_grad(set_to_none=False)
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        if grads_to_none:
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        step += 1
        write_state(state, token, step, began, loss.item().hex())
        time.sleep(pace)


class LoraLayer(torch.nn.Module):
    """A frozen bf16 linear layer and its trainable adapter b @ a (fp32,
    rank r; b starts at zero, as LoRA's does), then GELU and a residual."""

    def __init__(self, width, rank):
        super().__init__()
        self.base = torch.nn.Linear(width, width, bias=False, dtype=torch.bfloat16)
        # Half the scale that keeps a layer's output as large as its input:
        # through ~100 residual layers the activations grow ~1.06x each.
        torch.nn.init.normal_(self.base.weight, std=0.5 * width ** -0.5)
        self.base.weight.requires_grad_(False)
        self.a = torch.nn.Parameter(torch.randn(rank, width) * 0.01)
        self.b = torch.nn.Parameter(torch.zeros(width, rank))

    def forward(self, x):
        delta = (x.float() @ self.a.t()) @ self.b.t()
        return x + torch.nn.functional.gelu(self.base(x) + delta.to(x.dtype))


def lora(state, token, gib, pace, width=4096, rank=16, mark=lambda: None):
    tokens = 256
    # The bf16 base is nearly all of it; the adapters and their AdamW states
    # are 4 x 2 x rank x width fp32 values per layer.
    n = layers_for(gib * 0.9, width, 2, 1)
    with torch.device("cuda"):
        model = torch.nn.Sequential(*[LoraLayer(width, rank) for _ in range(n)])
    adapters = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(adapters, lr=1e-3)
    x = torch.randn(tokens, width, device="cuda", dtype=torch.bfloat16)
    step = 0
    while True:
        mark()
        began = time.time()
        opt.zero_grad(set_to_none=True)
        loss = model(x).float().square().mean()
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        step += 1
        write_state(state, token, step, began, loss.item().hex())
        time.sleep(pace)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("state")
    p.add_argument("mode", choices=["infer", "train", "lora", "transfer"])
    p.add_argument("--gib", type=float, default=8)
    p.add_argument("--pace-ms", type=int, default=0)
    p.add_argument("--width", type=int, default=4096, help="train: the model's width (narrower: more, smaller tensors)")
    p.add_argument("--rank", type=int, default=16, help="lora: the adapters' rank")
    p.add_argument("--transfer-mib", type=int, default=256, help="transfer: MiB moved each way per step")
    p.add_argument("--phos-step", action="store_true", help="train, lora: phos.step() as each iteration starts")
    p.add_argument("--grads-to-none", action="store_true", help="train: gradients let go as each iteration ends")
    a = p.parse_args()
    token = os.urandom(8).hex()
    torch.manual_seed(0)
    if a.mode == "infer":
        infer(a.state, token, a.gib, a.pace_ms / 1000)
    elif a.mode == "lora":
        lora(a.state, token, a.gib, a.pace_ms / 1000, a.width, a.rank, step_marker(a.phos_step))
    elif a.mode == "transfer":
        transfer(a.state, token, a.gib, a.pace_ms / 1000, a.transfer_mib)
    else:
        train(a.state, token, a.gib, a.pace_ms / 1000, a.width, step_marker(a.phos_step), a.grads_to_none)


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        with open(sys.argv[1] + ".error", "w") as f:
            f.write(traceback.format_exc())
        raise
