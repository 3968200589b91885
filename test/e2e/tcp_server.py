"""A workload with TCP sockets, for the end-to-end tests (lib.sh's contract:
tcp_server.py STATE, writing "TOKEN COUNTER PORT" to STATE).

It listens on 127.0.0.1 (an ephemeral port) and holds one established
loopback connection to itself. Each tick it sends a numbered message through
that connection and counts only once the message came back out of the
accepted end: the counter moves only while the connection carries data.

Clients of the listening port send lines; each gets back
"echo LINE COUNTER\n". Connections are served one line at a time with a
poll loop, no threads, so CRIU may dump the process between any two ticks.
"""
import os
import secrets
import select
import socket
import sys
import time

state = sys.argv[1]
token = secrets.token_hex(8)

listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", 0))
listener.listen(8)
port = listener.getsockname()[1]

# The loopback pair: `out` connects, `inside` is the accepted end.
out = socket.create_connection(("127.0.0.1", port))
inside, _ = listener.accept()

clients = {}  # socket -> bytes received so far
counter = 0


def write_state():
    tmp = state + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{token} {counter} {port}\n")
    os.rename(tmp, state)


def recv_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise SystemExit("tcp_server: the loopback connection closed")
        data += chunk
    return data


write_state()
while True:
    message = b"%016d" % (counter + 1)
    out.sendall(message)
    if recv_exact(inside, len(message)) != message:
        raise SystemExit("tcp_server: the loopback connection mixed up its data")
    counter += 1
    write_state()

    ready, _, _ = select.select([listener] + list(clients), [], [], 0.02)
    for sock in ready:
        if sock is listener:
            conn, _ = listener.accept()
            clients[conn] = b""
            continue
        data = sock.recv(4096)
        if not data:
            del clients[sock]
            sock.close()
            continue
        clients[sock] += data
        while b"\n" in clients[sock]:
            line, clients[sock] = clients[sock].split(b"\n", 1)
            sock.sendall(b"echo %s %d\n" % (line, counter))
