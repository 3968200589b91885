"""A two-process tree for criu_pages_tcp.sh (lib.sh's contract:
pages_tcp_tree.py STATE [MIB]): the parent holds MIB (default 1024) of
private memory, every page written, and its child runs tcp_server.py STATE
(a loopback TCP connection that carries data each tick). criu dumps the
parent's pages first, then reaches the child's connection."""
import os
import sys
import time

state = sys.argv[1]
mib = int(sys.argv[2]) if len(sys.argv) > 2 else 1024
memory = bytearray(mib << 20)
for at in range(0, len(memory), 4096):
    memory[at] = (at >> 12) & 0xFF
if os.fork() == 0:
    del memory
    here = os.path.dirname(os.path.abspath(__file__))
    os.execv(sys.executable, [sys.executable, os.path.join(here, "tcp_server.py"), state])
while True:
    time.sleep(1)
