"""Runs a command as a child subreaper (prctl PR_SET_CHILD_SUBREAPER) that
reaps every orphan below it at once, and exits with the command's status.

The GPU suite's workloads run detached (setsid in a subshell that exits),
so their parent is the nearest subreaper or PID 1. On the test hosts PID 1
reaps orphans only every 1.5-2 s, and without a pid namespace a restore
needs the dumped process's pid free: that wait is the harness's, not
phos's (a container's runtime reaps at once). Under this the workloads and
the processes criu restores are reaped when they end.

usage: subreaper.py COMMAND [ARG...]
"""
import ctypes
import os
import sys

PR_SET_CHILD_SUBREAPER = 36


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sys.exit(f"subreaper.py: prctl: {os.strerror(ctypes.get_errno())}")
    child = os.fork()
    if child == 0:
        os.execvp(sys.argv[1], sys.argv[1:])
    while True:
        pid, status = os.wait()
        if pid == child:
            sys.exit(os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main()
