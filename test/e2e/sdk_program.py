"""The e2e workload contract (a random token and a counter written to STATE
every 10 ms, no file kept open) from a Python program using the phos SDK:
phos.step() at every iteration. With --self-checkpoint IMAGES CONFIG it asks
criu to dump itself (phos.checkpoint, leave_running) at iteration 20 and
writes criu's answer to STATE.checkpoint. With --periodic ROOT CONFIG it
checkpoints itself periodically (phos.Periodic: every 0.3 s, the last 2
kept) and, after 4 checkpoints, writes their directories to STATE.periodic.

usage: sdk_program.py STATE [--self-checkpoint IMAGES CONFIG | --periodic ROOT CONFIG]
"""
import json
import os
import sys
import time

import phos


def write(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.rename(path + ".tmp", path)


def main():
    state = sys.argv[1]
    self_checkpoint = sys.argv[3:5] if len(sys.argv) >= 5 and sys.argv[2] == "--self-checkpoint" else None
    periodic = None
    if len(sys.argv) >= 5 and sys.argv[2] == "--periodic":
        periodic = phos.Periodic(sys.argv[3], interval_s=0.3, first_s=0.2, keep=2, config_file=sys.argv[4])
    made = []
    token = os.urandom(8).hex()
    counter = 0
    while True:
        if periodic:
            made += [d for d in [periodic.step()] if d]
            if len(made) == 4:
                write(state + ".periodic", " ".join(made) + "\n")
        else:
            phos.step()
        counter += 1
        write(state, "%s %d\n" % (token, counter))
        if self_checkpoint and counter == 20:
            try:
                answer = phos.checkpoint(self_checkpoint[0], leave_running=True, config_file=self_checkpoint[1])
            except phos.CheckpointError as e:
                answer = {"error": str(e)}
            write(state + ".checkpoint", json.dumps(answer) + "\n")
        time.sleep(0.01)


if __name__ == "__main__":
    main()
