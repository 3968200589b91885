"""A launch-bound eager PyTorch training step, for what phos's hooks cost
per CUDA call: a 6-layer transformer encoder of width 256, batch 8, AdamW;
several hundred kernels a step, each too small to hide its launch.

usage: torch_launch_bound.py [--steps N] [--warmup N] [--phos-cycles]
Prints "time p10_ms=.. median_ms=.." over the timed
steps (each ends with loss.item(), as a training loop does), and "result
loss=.." so that runs with and without libphos.so can be compared.

--phos-cycles (under libphos.so with PHOS_CALL_CYCLES=on): phos's call
counter is read through its agent (phosctl status --json; phosctl from
PHOSCTL, PHOS_PHOSCTL_BIN or PATH) before and after the timed steps, and
what the steps added is printed per step:
  phos_cycles steps=N step_ms=MEAN phos_us=T share=S% net_us=T' net_share=S'%
              calls=C ns_per_call=M floor_ns=F clock_ghz=G
  census CALL calls=C phos_us=T ns_per_call=M      (one line per kind, most time first)
T: the CPU time phos's own code took per step as counted, summed over the
program's threads; S: T over the mean step time. Both hold the counter's
own bookkeeping between its clock reads (an upper bound); T' and S' are
less its floor, F ns a call measured apart (a lower bound: in a real hook
part of the floor overlaps phos's own work).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import time

import torch


def phos_call_counts():
    """The call counter's totals by kind, from this process's agent:
    {call: (calls, ns)}, and the counter's clock and floor."""
    phosctl = os.environ.get("PHOSCTL") or os.environ.get("PHOS_PHOSCTL_BIN") or shutil.which("phosctl")
    if not phosctl:
        raise SystemExit("--phos-cycles: no phosctl (set PHOSCTL or put it on PATH)")
    out = subprocess.run([phosctl, "status", str(os.getpid()), "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit("--phos-cycles: phosctl status: " + (out.stderr.strip() or "exit %d" % out.returncode))
    cc = json.loads(out.stdout).get("call_cycles")
    if cc is None:
        raise SystemExit("--phos-cycles: the call counter is off (run under libphos.so with PHOS_CALL_CYCLES=on)")
    return {c["call"]: (c["calls"], c["ns"]) for c in cc["calls"]}, cc["cycles_per_second"], cc["floor_ns_per_call"]


def print_phos_cycles(before, after, steps, step_ms):
    counts0, _, _ = before
    counts1, rate, floor_ns = after
    per_kind = []
    for call, (calls, ns) in counts1.items():
        c0, n0 = counts0.get(call, (0, 0))
        if calls > c0:
            per_kind.append((call, (calls - c0) / steps, (ns - n0) / steps))
    per_kind.sort(key=lambda k: -k[2])
    calls = sum(k[1] for k in per_kind)
    ns = sum(k[2] for k in per_kind)
    net_ns = max(ns - floor_ns * calls, 0.0)
    step_ns = step_ms * 1e6
    print(f"phos_cycles steps={steps} step_ms={step_ms:.4f} phos_us={ns / 1e3:.2f} share={ns / step_ns * 100:.3f}% "
          f"net_us={net_ns / 1e3:.2f} net_share={net_ns / step_ns * 100:.3f}% calls={calls:.1f} "
          f"ns_per_call={ns / calls if calls else 0:.1f} floor_ns={floor_ns:.1f} clock_ghz={rate / 1e9:.3f}")
    for call, c, n in per_kind:
        print(f"census {call} calls={c:.2f} phos_us={n / 1e3:.3f} ns_per_call={n / c:.1f}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--phos-cycles", action="store_true", help="print phos's counted time per step (see above)")
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
    before = phos_call_counts() if a.phos_cycles else None
    times = []
    loss = 0.0
    for _ in range(a.steps):
        t0 = time.perf_counter()
        loss = step()
        times.append((time.perf_counter() - t0) * 1000)
    if a.phos_cycles:
        # Each step ends in loss.item(): nothing of it is left running here.
        print_phos_cycles(before, phos_call_counts(), a.steps, sum(times) / len(times))
    times.sort()
    p10 = times[len(times) // 10]
    print(f"result loss={loss:.6f}")
    print(f"time p10_ms={p10:.4f} median_ms={statistics.median(times):.4f}")


if __name__ == "__main__":
    main()
