#!/usr/bin/env bash
# The main job (README): sets everything up, then checkpoints and restores a
# program with real CRIU and the phos plugin.
#
# On a GPU host (nvidia-smi sees a GPU and nvcc is there) the program is a
# CUDA sample (test/gpu/gpu_counter.cu) holding 1 GiB of device memory that
# it re-verifies all the time: a leave-running dump, then a dump and a
# restore into a new process that carries on with the same device memory.
# Elsewhere it is the CPU-side demo: a program running with libphos.so is
# dumped, its (empty) GPU image shown, restored, and it carries on.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
cd "$src"
"$src/contrib/scripts/install-deps.sh"
if [ -f build/build.ninja ]; then meson configure build >/dev/null; else meson setup build >/dev/null; fi
ninja -C build >/dev/null
echo "phos: built in $src/build"

nvcc=$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")
workload_args=()
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && [ -x "$nvcc" ]; then
  echo "phos: GPU found: $(nvidia-smi -L | head -n1)"
  "$nvcc" -O2 -std=c++17 -o "$src/build/gpu_counter" "$src/test/gpu/gpu_counter.cu"
  echo "phos: built the CUDA sample build/gpu_counter (1 GiB of device memory, re-verified slice by slice)"
  export PHOS_WORKLOAD=$src/build/gpu_counter
  # The driver's fd-exportable memory fails in a pid namespace that sees the
  # host's /proc (containers mount their own); no pid namespace here.
  export PHOS_NO_PIDNS=1
  workload_args=(1024)
else
  echo "phos: no GPU (or no nvcc) on this host; running the CPU-side demo"
fi

PHOS_BUILD=$src/build
TEST_NAME=demo
source "$src/test/e2e/lib.sh"
run() { echo "+ $*"; "$@"; }

start_workload --preload "${workload_args[@]}"
wait_counter_above 20 60
echo "phos: a program runs with LD_PRELOAD=libphos.so as pid $WORKLOAD_PID, state: $(cat "$WORK/state")"
run "$PHOSCTL" status "$WORKLOAD_PID"
if [ -n "${workload_args[*]}" ]; then
  run "$CRIU" dump -t "$WORKLOAD_PID" -D "$IMG" --lib "$PLUGIN_DIR" -o "$WORK/dump.log" --leave-running
  echo "phos: leave-running dump done; the program carries on: $(cat "$WORK/state")"
  grep -o "phos: .*" "$WORK/dump.log" | grep -E "copied|given back" | sed 's/^/    /'
  rm -rf "$IMG" && mkdir "$IMG"
fi
run "$CRIU" dump -t "$WORKLOAD_PID" -D "$IMG" --lib "$PLUGIN_DIR" -o "$WORK/dump.log"
echo "phos: dumped at counter $(state_counter); images:"
ls -l "$IMG" | sed 's/^/    /'
run "$PHOSCTL" show "$IMG"
for _ in $(seq 100); do [ -e "/proc/$WORKLOAD_PID" ] || break; sleep 0.05; done  # the dumped pid is free again
run "$CRIU" restore -D "$IMG" --lib "$PLUGIN_DIR" -d -o "$WORK/restore.log"
pid=$(restored_pid)
sleep 1
echo "phos: restored as pid $pid, it carries on: $(cat "$WORK/state")"
[ -n "${workload_args[*]}" ] && echo "    (TOKEN COUNTER DEVICE_COUNTER ERRORS SLICES: the device counter keeps step, 0 errors)"
run "$PHOSCTL" status "$pid"
echo "phos: demo done (the restored program is stopped now)"
