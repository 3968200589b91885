#!/usr/bin/env bash
# How long a GPU process takes to go away once killed (issue 18: a
# migration without a pid namespace restores only once the source's pid is
# free): torch_loop.py infer (--gib G, default 16) killed with SIGKILL while
# it runs, without and with libphos.so, and killed by `criu dump` (phos,
# stopped copy: the driver checkpointed it first); a CPU process of the
# same resident size beside them. Milliseconds from the kill (from criu's
# exit for the dump) to /proc/PID gone, and to its state Z (exited, not yet
# reaped).
# usage: exit_time.sh [GIB] (after run-on-host.sh)
set -uo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
gib=${1:-16}
python=$(python3 -c 'import sys; print(sys.executable)')
w=$(mktemp -d /dev/shm/exit-time.XXXXXX)
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
# gone_after PID T0: "Z after A ms, gone after B ms" (polling every 2 ms).
gone_after() {
  local z=-
  while [ -e "/proc/$1" ]; do
    [ "$z" = - ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" = Z ] && z=$(ms_since "$2")
    sleep 0.002
  done
  echo "exited (Z) after $z ms, gone after $(ms_since "$2") ms"
}
start_loop() {  # start_loop [LD_PRELOAD=...]: pid of a running torch_loop infer
  rm -f "$w/state"
  ( setsid env "$@" CUBLAS_WORKSPACE_CONFIG=:4096:8 "$python" "$here/torch_loop.py" "$w/state" infer --gib "$gib" \
      </dev/null >"$w/out" 2>&1 & )
  for _ in $(seq 1200); do [ -s "$w/state" ] && [ "$(cut -d' ' -f2 "$w/state")" -gt 20 ] && break; sleep 0.05; done
  pgrep -f "torch_loop.py $w/state"
}
rss_mib() { awk '/VmRSS/ {print int($2 / 1024)}' "/proc/$1/status"; }
for variant in plain phos; do
  env_args=(); [ $variant = phos ] && env_args=("LD_PRELOAD=$PHOS_BUILD/cuda_hooks/libphos.so")
  pid=$(start_loop "${env_args[@]}")
  r=$(rss_mib "$pid")
  t0=$(date +%s%N); kill -9 "$pid"
  echo "exit-time: infer:$gib $variant, killed running (RSS $r MiB): $(gone_after "$pid" "$t0")"
done
mkdir -p "$w/plugins" "$w/img"
ln -s "$PHOS_BUILD/plugin/phos_plugin.so" "$w/plugins/"
pid=$(start_loop "LD_PRELOAD=$PHOS_BUILD/cuda_hooks/libphos.so")
r=$(rss_mib "$pid")
PHOS_RECOPY=off "$CRIU" dump -t "$pid" -D "$w/img" --lib "$w/plugins" -o dump.log -v4 || echo "exit-time: criu dump failed"
t0=$(date +%s%N)
echo "exit-time: infer:$gib phos, killed by criu dump after the driver checkpoint (RSS $r MiB): $(gone_after "$pid" "$t0")"
# A CPU process of that resident size.
python3 -c "
import os, sys, time
b = bytearray(int(sys.argv[1]) << 20)
for i in range(0, len(b), 4096): b[i] = 1
open(sys.argv[2], 'w').write('ready')
time.sleep(600)" "$r" "$w/cpu.ready" &
pid=$!
for _ in $(seq 600); do [ -s "$w/cpu.ready" ] && break; sleep 0.05; done
t0=$(date +%s%N); kill -9 "$pid"
echo "exit-time: a CPU process of $r MiB resident, killed: $(gone_after "$pid" "$t0")"
wait "$pid" 2>/dev/null
# The same size, orphaned as the GPU workloads are (setsid in a subshell
# that exits: its parent is then init, or the nearest subreaper), to tell
# the reaper's delay from the process's own teardown; and what PID 1 is.
( setsid python3 -c "
import sys, time
b = bytearray(int(sys.argv[1]) << 20)
for i in range(0, len(b), 4096): b[i] = 1
open(sys.argv[2], 'w').write('ready')
time.sleep(600)" "$r" "$w/orphan.ready" </dev/null >/dev/null 2>&1 & )
for _ in $(seq 600); do [ -s "$w/orphan.ready" ] && break; sleep 0.05; done
pid=$(pgrep -f "orphan.ready" | head -n1)
echo "exit-time: the orphan's parent: $(ps -o ppid= -p "$pid" | tr -d ' ') ($(ps -o comm= -p "$(ps -o ppid= -p "$pid")"))"
t0=$(date +%s%N); kill -9 "$pid"
echo "exit-time: an orphaned CPU process of $r MiB resident, killed: $(gone_after "$pid" "$t0")"
# A GPU workload killed: its threads while the pid is held.
pid=$(start_loop "LD_PRELOAD=$PHOS_BUILD/cuda_hooks/libphos.so")
t0=$(date +%s%N); kill -9 "$pid"
sleep 0.2
echo "exit-time: 200 ms after the kill of a GPU process: state $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null), $(ls "/proc/$pid/task" 2>/dev/null | wc -l) task(s): $(for t in /proc/$pid/task/*; do echo "$(cat "$t/comm" 2>/dev/null)=$(awk '{print $3}' "$t/stat" 2>/dev/null)"; done | tr '\n' ' ')"
echo "exit-time: $(gone_after "$pid" "$t0")"
echo "exit-time: PID 1 is $(cat /proc/1/comm) ($(tr '\0' ' ' < /proc/1/cmdline | cut -c1-80))"
rm -rf "$w"
