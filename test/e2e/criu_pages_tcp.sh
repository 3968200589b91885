#!/usr/bin/env bash
# A dump that holds many page pipes, then dumps a TCP connection (contrib/
# criu/0003-*): a tree whose first task holds 1 GiB of private memory and
# whose second holds a loopback TCP connection that carries data, dumped
# with --tcp-established --network-lock nftables. criu's page writers
# (0002) keep each task's page pipes until the dump ends, two descriptors
# for every pipe; below FD_SETSIZE they pushed the netlink socket that
# libnftables opens for the network lock past it, and libnftables'
# select() made criu abort ("bit out of range 0 - FD_SETSIZE on fd_set"),
# a torchrun job on the GPU host first.
#   1. leave-running dump: criu exits 0 having written both tasks' pages
#      with its writers; the connection carries data on;
#   2. killed, restored from that image: the connection carries data again.
export PHOS_WORKLOAD=$(cd "$(dirname "$0")" && pwd)/pages_tcp_tree.py
export PHOS_WORKLOAD_RUNNER=$(python3 -c 'import sys; print(sys.executable)')
source "$(dirname "$0")/lib.sh"

if ! "$CRIU" --help 2>&1 | grep -q -- --page-write-threads; then
  say "SKIP: $CRIU has no --page-write-threads (not the patched criu: contrib/scripts/install-criu.sh)"
  exit 77
fi
export CRIU_NET_ARGS="--tcp-established --network-lock nftables"
MIB=${PHOS_PAGES_TCP_MIB:-1024}

start_workload "$MIB"
wait_counter_above 5 60
criu_dump --leave-running ||
  fail "leave-running dump failed (rc $?): $(tail -n 2 "$WORK/dump.err" | tr '\n' ' ') $(criu_errors "$WORK/dump.log")"
grep -q 'Wrote [0-9]* bytes of pages of 2 tasks with [0-9]* threads' "$WORK/dump.log" ||
  fail "criu's writers did not write both tasks' pages: $(grep -m1 -E 'Writing pages|Wrote' "$WORK/dump.log")"
at=$(state_counter)
wait_counter_above $((at + 5)) 10
say "leave-running dump of $MIB MiB and a TCP connection: $(grep -o 'Wrote [0-9]* bytes of pages of 2 tasks with [0-9]* threads' "$WORK/dump.log"); the connection carries on"

at=$(state_counter)
for p in $(workload_pids) $(pgrep -f "tcp_server.py $WORK/state" || true); do kill -9 "$p" 2>/dev/null || true; done
sleep 1
criu_restore || fail "restore failed: $(criu_errors "$WORK/restore.log")"
wait_counter_above $((at + 5)) 20
say "PASS: restored, the connection carries data again (counter $(state_counter))"
# The restored tree's server is no workload_pids match: ended here, or it
# writes into $WORK while the cleanup removes it ("Directory not empty").
for p in $(workload_pids) $(pgrep -f "tcp_server.py $WORK/state" || true); do kill -9 "$p" 2>/dev/null || true; done
