#!/usr/bin/env bash
# What a process with an NCCL communicator holds that a checkpoint must
# handle (issue 17): the DDP job of one rank (torch_train.py, PHOS_TEST_DDP=1)
# under libphos.so; prints its open files, sockets, threads and phos's view
# of its communicators, then ends it.
# usage: nccl_process.sh (after run-on-host.sh)
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
w=$(mktemp -d)
PHOS_TEST_DDP=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 LD_PRELOAD=$PHOS_BUILD/cuda_hooks/libphos.so \
  python3 "$here/torch_train.py" "$w/state" "$w/losses" 400 20 > "$w/out" 2>&1 &
pid=$!
for _ in $(seq 300); do [ -s "$w/state" ] && [ "$(cut -d' ' -f2 "$w/state")" -gt 10 ] && break; sleep 0.1; done
echo "== steps: $(cut -d' ' -f2 "$w/state" 2>/dev/null) pid $pid"
echo "== fds"; ls -l /proc/$pid/fd | awk '{print $NF}' | sed 's/[0-9]\{3,\}/N/g' | sort | uniq -c
echo "== sockets (ss)"; ss -xap 2>/dev/null | grep "pid=$pid," | head -n 20; ss -tanp 2>/dev/null | grep "pid=$pid," | head -n 20
echo "== threads"; for t in /proc/$pid/task/*; do cat "$t/comm"; done | sort | uniq -c
echo "== shm maps"; grep -E '/dev/shm|nccl' /proc/$pid/maps | awk '{print $6}' | sort | uniq -c | head
echo "== phosctl"; "$PHOS_BUILD/plugin/phosctl" status "$pid" 2>&1 | tail -n 20
kill -9 $pid; wait $pid 2>/dev/null
echo "== output"; tail -n 20 "$w/out"; cat "$w/state.error" 2>/dev/null | tail -n 5
rm -rf "$w"
