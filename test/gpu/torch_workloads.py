"""PyTorch workloads of the GPU suite, deterministic so that runs with and
without libphos.so print identical results.

usage: torch_workloads.py mlp|compile|conv [--steps N] [--pace-ms N] [--ready FILE]
Prints "result MODE ..." and, with PHOS_PHOSCTL set (running under
libphos.so), "counts phos_launches=N profiler_kernels=M" for the profiled
steps: phos's launch counter (read from the agent) against the kernels the
PyTorch profiler (CUPTI) saw.
"""
import argparse
import hashlib
import json
import os
import subprocess
import time

import torch

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def phos_launches():
    tool = os.environ.get("PHOS_PHOSCTL")
    if not tool:
        return None
    out = subprocess.run([tool, "status", str(os.getpid()), "--json"], capture_output=True, text=True)
    if out.returncode != 0:  # not running under libphos.so
        return None
    return json.loads(out.stdout)["counters"]["launches"]


def checksum(tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def build(mode):
    torch.manual_seed(0)
    if mode == "conv":
        model = torch.nn.Sequential(
            torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(32, 32, 3, padding=1),
            torch.nn.ReLU(), torch.nn.AvgPool2d(8), torch.nn.Flatten(), torch.nn.Linear(512, 10)).cuda()
        data = (torch.randn(64, 3, 32, 32, device="cuda"), torch.randint(0, 10, (64,), device="cuda"))
    else:
        model = torch.nn.Sequential(
            torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
            torch.nn.Linear(1024, 10)).cuda()
        data = (torch.randn(256, 512, device="cuda"), torch.randint(0, 10, (256,), device="cuda"))
    step_model = torch.compile(model) if mode == "compile" else model
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return model, step_model, opt, data


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["mlp", "compile", "conv"])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--pace-ms", type=int, default=0)
    p.add_argument("--ready")
    a = p.parse_args()
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    torch.use_deterministic_algorithms(True)
    model, step_model, opt, (x, y) = build(a.mode)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(step_model(x), y)
        loss.backward()
        opt.step()
        return loss

    losses = []
    for _ in range(5):  # warm-up (and compilation)
        losses.append(step().item())
    torch.cuda.synchronize()
    if a.ready:
        open(a.ready, "w").close()
    before = phos_launches()
    kernels = None
    if os.environ.get("GPU_CHECK_NO_CUPTI"):  # the driver's checkpoint API refuses profiled processes
        for _ in range(10):
            losses.append(step().item())
    else:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(10):
                losses.append(step().item())
            torch.cuda.synchronize()
        kernels = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                      and not e.name.startswith(("Memcpy", "Memset")))
    after = phos_launches()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(a.steps - 15):
        losses.append(step().item())
        if a.pace_ms:
            time.sleep(a.pace_ms / 1000)
    torch.cuda.synchronize()
    step_ms = (time.perf_counter() - t0) * 1000 / max(1, a.steps - 15)
    print(f"result {a.mode} steps={len(losses)} final_loss={losses[-1]:.8f} "
          f"loss_curve={hashlib.sha256(repr(losses).encode()).hexdigest()[:16]} "
          f"params={checksum(model.parameters())}")
    if before is not None:
        print(f"counts phos_launches={after - before} profiler_kernels={kernels}")
    print(f"time step_ms={step_ms:.4f}")


if __name__ == "__main__":
    main()
