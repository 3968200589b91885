"""The e2e workload contract (a random token and a counter written to STATE
every 10 ms, no file kept open) from a Python program using the phos SDK:
phos.step() at every iteration.

usage: sdk_program.py STATE
"""
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
    token = os.urandom(8).hex()
    counter = 0
    while True:
        phos.step()
        counter += 1
        write(state, "%s %d\n" % (token, counter))
        time.sleep(0.01)


if __name__ == "__main__":
    main()
