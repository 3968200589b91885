#!/usr/bin/env python3
"""The stall and restore of a job's processes, one row a process, from the
lines phos writes into criu's logs (issue 28's per-rank breakdown).

    job_breakdown.py DUMP_LOG [RESTORE_LOG] [--rebuilt PID=US ...]

Prints a markdown table: per process, the job's hold, its NCCL release, the
driver's checkpoint, criu's freeze, the stopped copy, criu's CPU dump, the
give-back, the stall (a leave-running dump), and from the restore log criu's
CPU restore (the plugin's init to the process's hook), the driver's restore
and the gate's opening; the NCCL rebuild where --rebuilt gives it. Below
the table, for a leave-running dump, the job's stall: from the hold's start
to the last rank's gate opening (a rank's own stall counts from its gate). The
give-back is split into the driver's restore and unlock and the agent's
remap, and "after its pages" is criu's own work from the end of the
process's page dump (criu's "Dumping core (pid: P)" line, which follows it)
to the give-back's start: what a give-back begun right after the pages could
overlap. From the restore log also the memory's creation and what the gate
waited for last (restore_overlap). A process
phos did not stall (no such lines) is left out. Exits 1 where the dump log
has no line of phos at all.
"""
import re
import sys

NUM = r"([0-9.]+)"

STALL = re.compile(
    r"phos: process (\d+): gate reopened after " + NUM + r" ms stopped: quiesce " + NUM + r" ms"
    r"(?: \(NCCL release " + NUM + r" ms\))?, allocations, release and the driver's lock " + NUM + r" ms(?: \([^)]*\))?, "
    r"criu's freeze " + NUM + r" ms, driver checkpoint " + NUM + r" ms, the rest of the copy " + NUM + r" ms, "
    r"criu's CPU dump " + NUM + r" ms, give-back \([^)]*\) " + NUM + r" ms")
RELEASE = re.compile(r"phos: process (\d+): \d+ NCCL communicator\(s\) released in " + NUM + r" ms")
HOLD = re.compile(r"its \d+ ranks \(pids ([0-9 ]+)\) held before call \d+ in " + NUM + r" ms")
GIVE_BACK = re.compile(
    r"phos: process (\d+): gate reopened after .*, give-back \([^)]*\) " + NUM + r" ms: driver restore and unlock " +
    NUM + r" ms, the agent's remap " + NUM + r" ms")
CORE = re.compile(r"Dumping core \(pid: (\d+)\)")
OVERLAP = re.compile(r"phos: process (\d+): restore breakdown .*; overlap=(on|off): .*; the gate waited last for (.*)$", re.M)
# criu's private pages of the tree (contrib/criu/0002, 0005): copied before
# the tasks resumed and written after, or written while they were frozen.
CRIU_PAGES = re.compile(r"(Copied [0-9]+ bytes of pages of [0-9]+ tasks in .*|Wrote [0-9]+ bytes of pages of [0-9]+ tasks .*)$", re.M)
DRIVER_ALL = re.compile(r"phos: driver (checkpoint|restore) of (\d+) processes ([a-z ]+): " + NUM + r" ms")
RESTORE = re.compile(
    r"phos: process (\d+): restore breakdown \(ms after the plugin's init\): GPU memory created " + NUM +
    r", filled [^,]*, resume hook " + NUM + r", waited for the fill until " + NUM + r", driver restore " + NUM +
    r" ms, remap " + NUM + r" ms, gate open " + NUM)


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError as e:
        sys.exit(f"job_breakdown: {path}: {e.strerror}")


def stamp(text, pos):
    """criu's time stamp (s) of the log line holding text[pos], or None."""
    line = text[text.rfind("\n", 0, pos) + 1:]
    m = re.match(r"\(\s*([0-9.]+)\)", line)
    return float(m.group(1)) if m else None


def main(argv):
    args, rebuilt = [], {}
    it = iter(argv)
    for a in it:
        if a == "--rebuilt":
            pid, _, us = next(it, "").partition("=")
            rebuilt[pid] = float(us) / 1000
        else:
            args.append(a)
    if not args:
        sys.exit(__doc__)
    dump = read(args[0])
    restore = read(args[1]) if len(args) > 1 else ""
    if "phos: " not in dump:
        print(f"job_breakdown: {args[0]} has no line of phos", file=sys.stderr)
        return 1
    rows = {}
    for m in STALL.finditer(dump):
        pid = m.group(1)
        rows.setdefault(pid, {}).update(
            stall=m.group(2), driver=m.group(7), freeze=m.group(6), copy=m.group(8), criu=m.group(9),
            give_back=m.group(10))
    core = {m.group(1): stamp(dump, m.start()) for m in CORE.finditer(dump)}  # the last one per pid
    for m in GIVE_BACK.finditer(dump):
        pid, row = m.group(1), rows.setdefault(m.group(1), {})
        row.update(give_back_driver=m.group(3), give_back_remap=m.group(4))
        end, pages = stamp(dump, m.start()), core.get(pid)
        if end is not None and pages is not None:
            row["after_pages"] = f"{max(0.0, (end - pages) * 1000 - float(m.group(2))):.1f}"
    for m in RELEASE.finditer(dump):
        rows.setdefault(m.group(1), {})["release"] = m.group(2)
    for m in HOLD.finditer(dump):
        for pid in m.group(1).split():
            rows.setdefault(pid, {})["hold"] = m.group(2)
    for m in RESTORE.finditer(restore):
        pid = m.group(1)
        if float(m.group(5)) == 0 and pid not in rows:
            continue  # no CUDA state: not part of the job's GPU side
        rows.setdefault(pid, {}).update(cpu_restore=m.group(3), driver_restore=m.group(5), gate_open=m.group(7),
                                        created=m.group(2))
    for m in OVERLAP.finditer(restore):
        if m.group(1) in rows:
            rows[m.group(1)].update(overlap=m.group(2), bound=m.group(3).strip())
    for pid, ms in rebuilt.items():
        rows.setdefault(pid, {})["rebuild"] = f"{ms:.1f}"
    cols = [("hold", "hold"), ("release", "NCCL release"), ("freeze", "criu's freeze"),
            ("driver", "driver checkpoint"), ("copy", "stopped copy"), ("criu", "criu's CPU dump"),
            ("after_pages", "criu after its pages"), ("give_back", "give-back"),
            ("give_back_driver", "give-back: driver"), ("give_back_remap", "give-back: remap"), ("stall", "stall"),
            ("overlap", "restore overlap"), ("created", "memory created"), ("cpu_restore", "restore: its hook"),
            ("driver_restore", "driver restore"), ("gate_open", "gate open"), ("bound", "the gate waited for"),
            ("rebuild", "NCCL rebuild")]
    print("| process | " + " | ".join(name for _, name in cols) + " |")
    print("| --- |" + " --- |" * len(cols))
    for pid in sorted(rows, key=int):
        print(f"| {pid} | " + " | ".join(rows[pid].get(k, "-") for k, _ in cols) + " |")
    # The ranks stop from the hold's start (the first one to reach the call
    # waits there), not from their gates: the job's own stall.
    reopened = {m.group(1): stamp(dump, m.start()) for m in STALL.finditer(dump)}
    for m in HOLD.finditer(dump):
        pids, held_at = m.group(1).split(), stamp(dump, m.start())
        ends = [reopened[p] for p in pids if reopened.get(p) is not None]
        if held_at is not None and ends and len(ends) == len(pids):
            start = held_at - float(m.group(2)) / 1000
            print(f"\nthe job's ranks (pids {' '.join(pids)}) stopped from the hold's start to the last gate's "
                  f"opening: {(max(ends) - start) * 1000:.1f} ms (the hold {m.group(2)} ms of it)")
    for m in DRIVER_ALL.finditer(dump + restore):
        print(f"\ndriver {m.group(1)} of {m.group(2)} processes {m.group(3)}: {m.group(4)} ms")
    pages = CRIU_PAGES.findall(dump)
    if pages:
        print(f"\ncriu's pages: {pages[-1]}")
    print("\n(ms; the restore's columns in ms after the plugin's init)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
