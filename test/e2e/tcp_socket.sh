#!/usr/bin/env bash
# TCP sockets through criu and the phos plugin (criu 4.2 or later on Linux
# 6.16+, where 4.1 failed on every inet socket: "Can't get 1:16 opt"): a
# preloaded process with a listening socket, a loopback connection to itself
# and a connection from a client outside the dump.
#   1. stopped dump (--tcp-established), restore: the process counts on (its
#      counter moves only while its own connection carries data), and the
#      outside client's connection, open all along, still gets answers;
#   2. leave-running dump: the process carries on; killed, then restored from
#      that image: it counts on and a new client is answered on its port.
# No iptables here: the network lock is nftables (--network-lock nftables).
export PHOS_WORKLOAD=$(cd "$(dirname "$0")" && pwd)/tcp_server.py
export PHOS_WORKLOAD_RUNNER=$(python3 -c 'import sys; print(sys.executable)')
source "$(dirname "$0")/lib.sh"

export CRIU_NET_ARGS="--tcp-established --network-lock nftables"  # both criu runs (lib.sh)
port() { state_field 3; }

# client NAME: connects to the server's port, sends "NAME-before", waits for
# $WORK/NAME.go (30 s at most), sends "NAME-after" on the same connection;
# each reply goes to $WORK/NAME.replies, one a line.
client() {
  LD_PRELOAD= timeout 60 python3 - "$(port)" "$WORK/$1" <<'PY' &
import os, socket, sys, time
port, base = int(sys.argv[1]), sys.argv[2]
name = os.path.basename(base)
s = socket.create_connection(("127.0.0.1", port), timeout=30)
f = s.makefile("rb")
def ask(word):
    s.sendall(word.encode() + b"\n")
    line = f.readline().decode()
    with open(base + ".replies", "a") as out:
        out.write(line if line.endswith("\n") else line + "(closed)\n")
ask(name + "-before")
for _ in range(600):
    if os.path.exists(base + ".go"):
        break
    time.sleep(0.05)
ask(name + "-after")
PY
  CLIENT_PID=$!
}
# replies_have NAME WORD: the client's replies include "echo WORD N"; prints N.
reply_counter() {
  for _ in $(seq 200); do
    local n
    n=$(sed -n "s/^echo $2 \([0-9]*\)$/\1/p" "$WORK/$1.replies" 2>/dev/null)
    [ -n "$n" ] && { echo "$n"; return 0; }
    sleep 0.05
  done
  return 1
}

# 1. Stopped dump with a client's connection open across it.
start_workload --preload
wait_counter_above 5
token=$(state_token)
client one
before=$(reply_counter one one-before) || fail "the client got no answer before the dump"
criu_dump || fail "criu dump --tcp-established failed: $(criu_errors "$WORK/dump.log")"
dumped=$(state_counter)
grep -q "phos: process $WORKLOAD_PID (pid 1 in its namespace): agent" "$WORK/dump.log" ||
  fail "the plugin did not talk to the process's agent"
[ -f "$IMG/phos-1-complete.img" ] || fail "no complete phos image"
[ -z "$(workload_pids)" ] || fail "process still running after a dump without --leave-running"
sleep 0.3
criu_restore || fail "criu restore failed: $(criu_errors "$WORK/restore.log")"
WORKLOAD_PID=$(restored_pid) || fail "no restored process"
wait_counter_above $((dumped + 20))
[ "$(state_token)" = "$token" ] || fail "the restored process is another one"
touch "$WORK/one.go"
after=$(reply_counter one one-after) || fail "the connection open across the dump carries nothing after the restore"
wait "$CLIENT_PID" || fail "the client failed"
[ "$after" -gt "$dumped" ] || fail "the answer after the restore came from before it ($after <= $dumped)"
say "stopped dump and restore: counter $dumped -> $(state_counter) (its own loopback connection), client's connection answered before ($before) and after ($after)"

# 2. Leave-running dump; the image restored once the process is gone.
at=$(state_counter)
criu_dump --leave-running || fail "criu dump --leave-running failed: $(criu_errors "$WORK/dump.log")"
dumped=$(state_counter)
wait_counter_above $((dumped + 20))
client two
reply_counter two two-before >/dev/null || fail "the process answers no client after a leave-running dump"
touch "$WORK/two.go"; wait "$CLIENT_PID" || true
say "leave-running dump: counter $at -> $(state_counter), the process carries on and answers"
kill -9 "$WORKLOAD_PID"; wait_pid_free
rm -f "$WORK/state"  # the original's; the restored process writes its own
criu_restore || fail "restore of the leave-running image failed: $(criu_errors "$WORK/restore.log")"
restored_pid >/dev/null || fail "no restored process"
wait_counter_above 0
[ "$(state_counter)" -lt $((dumped + 1000)) ] || fail "the state is not the restored process's"
wait_counter_above $((dumped + 20))
[ "$(state_token)" = "$token" ] || fail "the restored process is another one"
client three
n=$(reply_counter three three-before) || fail "the restored process answers no new client on its port"
touch "$WORK/three.go"; wait "$CLIENT_PID" || true
say "restored from the leave-running image: counter $dumped -> $(state_counter), a new client answered ($n)"
say "PASS"
