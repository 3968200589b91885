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
sockets() {  # each socket of the process, with its line in /proc/net (inet) or its kind
  for fd in /proc/$pid/fd/*; do
    l=$(readlink "$fd"); case $l in socket:*) ;; *) continue ;; esac
    ino=${l#socket:[}; ino=${ino%]}
    where=$(grep -l " $ino " /proc/$pid/net/{tcp,tcp6,udp,udp6,raw,raw6,unix,netlink,packet} 2>/dev/null | xargs -r -n1 basename | tr '\n' ' ')
    line=$(grep -h " $ino " /proc/$pid/net/{tcp,tcp6,udp,udp6} 2>/dev/null | awk '{print "local " $2 " remote " $3 " state " $4}')
    echo "  fd ${fd##*/} inode $ino: ${where:-unknown} $line"
  done
}
echo "== sockets"; sockets
echo "== phosctl"; "$PHOS_BUILD/plugin/phosctl" status "$pid" 2>&1 | grep -v '^  module'
# The communicators released (as for a checkpoint) for 3 s: what is left.
"$PHOS_BUILD/test/hooks/phos-agent-tool" hold "$pid" 3000 > "$w/hold" 2>&1 &
for _ in $(seq 100); do grep -q quiesced "$w/hold" && break; sleep 0.05; done
echo "== released: $(head -n 2 "$w/hold" | tr '\n' ' ')"
echo "== sockets while released"; sockets
echo "== threads while released"; for t in /proc/$pid/task/*; do cat "$t/comm"; done | sort | uniq -c
wait
echo "== after the hold: $(tail -n 1 "$w/hold")"; "$PHOS_BUILD/plugin/phosctl" status "$pid" 2>&1 | grep NCCL
kill -9 $pid; wait $pid 2>/dev/null
echo "== output"; tail -n 20 "$w/out"; cat "$w/state.error" 2>/dev/null | tail -n 5
rm -rf "$w"
