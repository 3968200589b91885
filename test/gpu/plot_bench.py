#!/usr/bin/env python3
"""Table and plot of bench_checkpoint.sh's results.

Reads one or more CSVs (run,tool,size_mib,storage,measurement,value,note; a
later row for the same tool, size, storage and measurement replaces an
earlier one, so several calls and reruns can be concatenated), prints a
markdown table and the checkpoint targets to stdout and, with matplotlib, draws
dump, restore and leave-running stall time against size, phos against the
cuda plugin, one column per storage, log scales.

usage: plot_bench.py CSV [CSV...] [--png FILE] [--no-plot]
"""
import argparse
import csv
import math
import sys

TOOLS = ["phos", "cuda_plugin"]
STORAGES = ["shm", "disk"]
TOOL_LABEL = {"phos": "criu + phos", "cuda_plugin": "criu + cuda plugin"}
GB = 1e9
MIB = 1 << 20

# (measurement, plot title) per row of the figure
PLOTS = [
    ("dump", "dump (process ends): s"),
    ("restore_running_s", "restore until the process runs: s"),
    ("stall_s", "application stall, leave-running dump: s"),
]


def load(paths):
    """{(tool, mib, storage): {measurement: (value, note)}}, the last row winning."""
    cases = {}
    for path in paths:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                if row.get("run") in (None, "run") or not row.get("tool"):
                    continue  # a repeated header line of concatenated files
                try:
                    key = (row["tool"], int(row["size_mib"]), row["storage"])
                except (KeyError, ValueError):
                    print(f"plot_bench: {path}: skipping a malformed row: {row}", file=sys.stderr)
                    continue
                cases.setdefault(key, {})[row["measurement"]] = (row["value"], row.get("note") or "")
    return cases


def num(case, measurement):
    """The measurement as a float, or None."""
    if not case or measurement not in case:
        return None
    try:
        v = float(case[measurement][0])
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def dump_time(case, storage):
    """Dump time compared between tools: on disk until the image is synced
    (CRIU does not sync its own images, the phos plugin syncs its data)."""
    if storage == "disk" and num(case, "dump_sync_s") is not None:
        return num(case, "dump_sync_s")
    return num(case, "dump_s")


def fmt(v, digits=2):
    return "–" if v is None else f"{v:.{digits}f}"


def speedup(slow, fast):
    return f"{slow / fast:.1f}x" if slow and fast else "–"


def result_text(case):
    if not case or "result" not in case:
        return "not run"
    value, note = case["result"]
    if value == "skip":
        return f"SKIP: {note}"
    if value == "failed":
        return f"FAILED: {note}"
    parts = []
    for m, label in (("leave_running", "leave-running"), ("restored_intact", "restored intact")):
        if m in case:
            parts.append(f"{label} {case[m][0]}")
    return ", ".join(parts) or value


def table(cases):
    sizes = sorted({k[1] for k in cases})
    storages = [s for s in STORAGES if any(k[2] == s for k in cases)]
    storages += sorted({k[2] for k in cases} - set(storages))
    head = ["storage", "GiB", "tool", "dump s", "dump+sync s", "leave-running dump s", "stall s", "restore s",
            "restore→running s", "image GiB", "device→image GB/s", "image→device GB/s", "size/dump GB/s",
            "dump speedup", "restore speedup", "result"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for storage in storages:
        for mib in sizes:
            cuda = cases.get(("cuda_plugin", mib, storage))
            for tool in TOOLS + sorted({k[0] for k in cases} - set(TOOLS)):
                c = cases.get((tool, mib, storage))
                if c is None:
                    continue
                d = dump_time(c, storage)
                e2e = mib * MIB / GB / num(c, "dump_s") if num(c, "dump_s") else None
                su_dump = su_restore = "–"
                if tool == "phos":
                    su_dump = speedup(dump_time(cuda, storage), d)
                    su_restore = speedup(num(cuda, "restore_running_s"), num(c, "restore_running_s"))
                row = [storage, fmt(mib / 1024, 0 if mib % 1024 == 0 else 2), TOOL_LABEL.get(tool, tool),
                       fmt(num(c, "dump_s")), fmt(num(c, "dump_sync_s")), fmt(num(c, "dump_leave_running_s")),
                       fmt(num(c, "stall_s"), 3), fmt(num(c, "restore_s")), fmt(num(c, "restore_running_s")),
                       fmt(num(c, "image_gib")), fmt(num(c, "phos_copy_gbps"), 1),
                       fmt(num(c, "phos_restore_gbps"), 1), fmt(e2e, 1), su_dump, su_restore, result_text(c)]
                lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def targets(cases):
    """The checkpoint targets (README), each with what this data says."""
    out = []
    # Both directions, at every size from 32 GiB (smaller ones are bound by
    # fixed costs, not by the copy).
    for key, what in (("phos_copy_gbps", "device→image"), ("phos_restore_gbps", "image→device")):
        shm = sorted(m for (t, m, s) in cases if t == "phos" and s == "shm" and num(cases[(t, m, s)], key))
        if not shm:
            out.append(f"- {what} ≥ 45 GB/s to memory-backed storage: no phos data on shm")
            continue
        rates = ", ".join(f"{m // 1024 if m % 1024 == 0 else m / 1024} GiB {num(cases[('phos', m, 'shm')], key):.1f}"
                          for m in shm)
        large = [m for m in shm if m >= 32768]
        short = [m for m in large if num(cases[("phos", m, "shm")], key) < 45]
        verdict = ("no size from 32 GiB" if not large else
                   "met from 32 GiB on" if not short else
                   "NOT met at " + ", ".join(f"{m // 1024} GiB" for m in short))
        out.append(f"- {what} ≥ 45 GB/s to memory-backed storage: {verdict} (GB/s: {rates})")
    for storage in STORAGES:
        stall = num(cases.get(("phos", 32768, storage)), "stall_s")
        if stall is not None:
            out.append(f"- 32 GiB leave-running stall < 1.5 s ({storage}): {stall:.3f} s, {'met' if stall < 1.5 else 'NOT met'}")
    for storage in STORAGES:
        p, c = cases.get(("phos", 32768, storage)), cases.get(("cuda_plugin", 32768, storage))
        if p and c:
            ds = dump_time(c, storage) / dump_time(p, storage) if dump_time(c, storage) and dump_time(p, storage) else None
            rs = (num(c, "restore_running_s") / num(p, "restore_running_s")
                  if num(c, "restore_running_s") and num(p, "restore_running_s") else None)
            met = ds is not None and rs is not None and ds >= 10 and rs >= 10
            out.append(f"- ≥ 10x faster than the cuda plugin at 32 GiB ({storage}): dump {fmt(ds, 1)}x, "
                       f"restore {fmt(rs, 1)}x: {'met' if met else 'NOT met'}")
    if not any(k[1] == 32768 for k in cases):
        out.append("- the 32 GiB targets: no 32 GiB data")
    return "\n".join(out)


def plot(cases, png):
    sys.stdout.flush()  # the table first, then what the plot says on stderr
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import FixedLocator, NullLocator
    except ImportError:
        print(f"plot_bench: no matplotlib here, no plot ({png})", file=sys.stderr)
        return False
    storages = [s for s in STORAGES if any(k[2] == s for k in cases)] or STORAGES[:1]
    sizes = sorted({k[1] for k in cases})
    fig, axes = plt.subplots(len(PLOTS), len(storages), figsize=(5.5 * len(storages), 3.6 * len(PLOTS)),
                             squeeze=False)
    styles = {"phos": dict(color="tab:blue", marker="o"), "cuda_plugin": dict(color="tab:orange", marker="s")}
    for col, storage in enumerate(storages):
        for row, (measurement, title) in enumerate(PLOTS):
            ax = axes[row][col]
            for tool in TOOLS:
                pts = []
                for mib in sizes:
                    c = cases.get((tool, mib, storage))
                    v = dump_time(c, storage) if measurement == "dump" else num(c, measurement)
                    if v is not None and v > 0:
                        pts.append((mib / 1024, v))
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], label=TOOL_LABEL[tool], **styles[tool])
                    for x, y in pts:
                        ax.annotate(f"{y:.3g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.xaxis.set_major_locator(FixedLocator([m / 1024 for m in sizes]))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.set_xticklabels([f"{m / 1024:g}" for m in sizes])
            ax.set_xlabel("device memory, GiB")
            label = title + (" (+ sync)" if measurement == "dump" and storage == "disk" else "")
            ax.set_title(f"{storage}: {label}", fontsize=10)
            ax.grid(True, which="both", alpha=0.3)
            if ax.lines:
                ax.legend(fontsize=8)
            else:
                ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center")
    fig.suptitle("GPU checkpoint/restore with CRIU 4.1.1: phos vs CRIU's cuda plugin")
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    print(f"plot_bench: plot in {png}", file=sys.stderr)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv", nargs="+")
    ap.add_argument("--png", help="the plot (default: the first CSV's name with .png)")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args()
    cases = load(args.csv)
    if not cases:
        print("plot_bench: no results in " + ", ".join(args.csv), file=sys.stderr)
        return 1
    print(table(cases))
    print()
    print("Times in seconds; dump s and restore s: criu's wall time; dump+sync: until the image is on disk; "
          "stall: the longest gap the program saw between its ~10 ms steps during the leave-running dump; "
          "restore→running: from the start of criu restore until the restored program made a step (disk: page "
          "cache dropped first); device→image and image→device: the phos plugin's own copy rates; speedups: cuda "
          "plugin time / phos time (dump on disk: + sync; restore: until running).")
    print()
    print(targets(cases))
    if not args.no_plot:
        png = args.png or (args.csv[0].rsplit(".", 1)[0] + ".png")
        plot(cases, png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
