"""A launch-bound eager PyTorch training step, for what phos's hooks cost
per CUDA call: a 6-layer transformer encoder of width 256, batch 8, AdamW;
several hundred kernels a step, each too small to hide its launch.

usage: torch_launch_bound.py [--steps N] [--warmup N]
Prints "time p10_ms=.. median_ms=.." over the timed
steps (each ends with loss.item(), as a training loop does), and "result
loss=.." so that runs with and without libphos.so can be compared.
"""
import argparse
import statistics
import time

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=20)
    a = p.parse_args()
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=256, nhead=4, dim_feedforward=1024, dropout=0.0,
                                             batch_first=True)
    model = torch.nn.TransformerEncoder(layer, num_layers=6, enable_nested_tensor=False).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(8, 64, 256, device="cuda")
    target = torch.randn(8, 64, 256, device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    times = []
    loss = 0.0
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = step()
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    p10 = times[len(times) // 10]
    print(f"result loss={loss:.6f}")
    print(f"time p10_ms={p10:.4f} median_ms={statistics.median(times):.4f}")


if __name__ == "__main__":
    main()
