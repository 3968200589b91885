#!/usr/bin/env python3
"""The copy-on-write pool plot from test/gpu/bench_cow.sh's CSV, as SVG (no
plotting library: the machines that draw it have none): for each pool size,
the stall (the program stopped by the dump) and the time its calls then
waited for the engine, stacked, so the bar is all the time the dump held the
program. usage: plot_cow.py CSV SVG [TITLE]"""
import csv
import sys


def main():
    rows = [r for r in csv.DictReader(open(sys.argv[1])) if r["kind"] == "pool"]
    title = sys.argv[3] if len(sys.argv) > 3 else "stall and waits against the copy-on-write pool"
    if not rows:
        sys.exit("plot_cow.py: no pool rows in " + sys.argv[1])
    w, h, left, bottom, top = 560, 340, 70, 50, 40
    top_ms = max(float(r["stall_ms"]) + float(r["wait_ms"]) for r in rows) * 1.15
    bar = (w - left - 20) / len(rows)
    y = lambda ms: h - bottom - (h - bottom - top) * ms / top_ms
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<text x="{w / 2}" y="20" text-anchor="middle" font-size="14">{title}</text>',
           f'<line x1="{left}" y1="{y(0)}" x2="{w - 20}" y2="{y(0)}" stroke="black"/>',
           f'<line x1="{left}" y1="{y(0)}" x2="{left}" y2="{top}" stroke="black"/>',
           f'<text x="15" y="{h / 2}" transform="rotate(-90 15 {h / 2})" text-anchor="middle">ms</text>']
    step = 250 if top_ms < 2500 else 500
    for ms in range(0, int(top_ms) + 1, step):
        out.append(f'<text x="{left - 6}" y="{y(ms) + 4}" text-anchor="end">{ms}</text>')
        out.append(f'<line x1="{left}" y1="{y(ms)}" x2="{w - 20}" y2="{y(ms)}" stroke="#ddd"/>')
    for i, r in enumerate(rows):
        x = left + i * bar + bar * 0.2
        stall, wait = float(r["stall_ms"]), float(r["wait_ms"])
        out.append(f'<rect x="{x}" y="{y(stall)}" width="{bar * 0.6}" height="{y(0) - y(stall)}" fill="#4472c4"/>')
        out.append(f'<rect x="{x}" y="{y(stall + wait)}" width="{bar * 0.6}" height="{y(stall) - y(stall + wait)}" fill="#ed7d31"/>')
        out.append(f'<text x="{x + bar * 0.3}" y="{y(0) + 16}" text-anchor="middle">{r["mode"]}{"" if r["mode"] == "auto" else " MiB"}</text>')
        out.append(f'<text x="{x + bar * 0.3}" y="{y(stall + wait) - 4}" text-anchor="middle">{stall + wait:.0f}</text>')
    out += [f'<rect x="{left + 10}" y="{top}" width="12" height="12" fill="#4472c4"/>',
            f'<text x="{left + 28}" y="{top + 10}">stall</text>',
            f'<rect x="{left + 80}" y="{top}" width="12" height="12" fill="#ed7d31"/>',
            f'<text x="{left + 98}" y="{top + 10}">calls waiting for the engine</text>',
            f'<text x="{w / 2}" y="{h - 12}" text-anchor="middle">copy-on-write pool</text>', '</svg>']
    open(sys.argv[2], "w").write("\n".join(out) + "\n")


main()
