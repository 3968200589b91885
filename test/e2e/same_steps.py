"""A run's per-step output against an uninterrupted run's: every line of
RUN ("STEP VALUE") holds the uninterrupted run's VALUE for its STEP (a
restored job re-runs the steps after its image, so a step may appear more
than once), and every step of REF appears. Prints what it saw; exits 1 with
the first difference.

usage: same_steps.py REF RUN"""
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    ref = dict(line.split()[:2] for line in open(sys.argv[1]) if line.strip())
    steps, lines = set(), 0
    for line in open(sys.argv[2]):
        if not line.strip():
            continue
        step, value = line.split()[:2]
        if ref.get(step) != value:
            sys.exit(f"step {step}: {value}, the uninterrupted run's {ref.get(step)}")
        steps.add(step)
        lines += 1
    missing = sorted(set(ref) - steps, key=int)
    if missing:
        sys.exit(f"{len(missing)} steps missing, from step {missing[0]}")
    print(f"{lines} lines for {len(steps)} steps, {lines - len(steps)} re-run after restores, all equal")


if __name__ == "__main__":
    main()
