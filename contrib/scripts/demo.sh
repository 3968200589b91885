#!/usr/bin/env bash
# The main job (README): sets everything up, then checkpoints and restores a
# program with real CRIU and the phos plugin.
#
#   demo.sh            install what is missing (Debian packages, CRIU 4.2.1)
#                      and build phos into build/
#   demo.sh --bundle   take phos, criu and the libraries the host lacks from
#                      bundle/ instead (test/gpu/make-bundle.sh builds it on a
#                      machine with package registries; copy the checkout
#                      with it): for GPU hosts that have none
#
# The program, by what the host has:
#   - PyTorch with a GPU: test/gpu/torch_train.py, an MLP trained for 150
#     steps; a leave-running dump while it trains (criu's time and the
#     program's stall), a dump, the image shown, a restore; the restored
#     run's loss curve must equal an uninterrupted run's, bit for bit;
#   - a GPU and nvcc (or the bundle's build): the CUDA sample
#     test/gpu/gpu_counter.cu with 1 GiB of device memory it re-verifies all
#     the time: the same dumps and restore, the memory intact after each;
#   - neither: the CPU-side demo: a program running with libphos.so is
#     dumped, its (empty) GPU image shown, restored, and it carries on.
# Runs as root (criu needs it): `sudo demo.sh`, or as is in a root shell.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
cd "$src"
[ "$(id -u)" = 0 ] || { echo "phos: demo.sh needs root (criu does): run it with sudo, or as root" >&2; exit 1; }

bundle=
case "${1:-}" in
  --bundle) bundle=1 ;;
  "") ;;
  *) echo "usage: demo.sh [--bundle]" >&2; exit 2 ;;
esac

if [ -n "$bundle" ]; then
  [ -x "$src/bundle/bin/criu" ] || { echo "phos: no bundle/ here: build it with test/gpu/make-bundle.sh" >&2; exit 1; }
  # PHOS_BUILD, CRIU, PHOS_BUNDLE, and the carried libraries on the path
  # (the script probes with ldd, which fails on files that are not
  # programs: not under errexit).
  set +eo pipefail
  source "$src/test/gpu/run-on-host.sh"
  set -eo pipefail
  echo "phos: using the bundle: phos from $PHOS_BUILD, criu $("$CRIU" --version | awk '/Version/ {print $2}')"
else
  "$src/contrib/scripts/install-deps.sh"
  if [ -f build/build.ninja ]; then meson configure build >/dev/null; else meson setup build >/dev/null; fi
  ninja -C build >/dev/null
  echo "phos: built in $src/build"
  export PHOS_BUILD=$src/build
fi

gpu=
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && gpu=1
python=$(command -v python3 || true)
torch=
[ -n "$gpu" ] && [ -n "$python" ] && "$python" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null && torch=1
nvcc=$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")

workload_args=()
steps=150
if [ -n "$torch" ]; then
  echo "phos: GPU and PyTorch found: $(nvidia-smi -L | head -n1); the program trains an MLP for $steps steps"
  # The interpreter itself (what the process's command line shows).
  PHOS_WORKLOAD_RUNNER=$("$python" -c 'import sys; print(sys.executable)')
  export PHOS_WORKLOAD=$src/test/gpu/torch_train.py PHOS_WORKLOAD_RUNNER
  export CUBLAS_WORKSPACE_CONFIG=:4096:8
elif [ -n "$gpu" ] && { [ -n "$bundle" ] || [ -x "$nvcc" ]; }; then
  echo "phos: GPU found: $(nvidia-smi -L | head -n1)"
  if [ -n "$bundle" ]; then
    export PHOS_WORKLOAD=$PHOS_BUNDLE/gpu/gpu_counter
  else
    "$nvcc" -O2 -std=c++17 -o "$src/build/gpu_counter" "$src/test/gpu/gpu_counter.cu"
    export PHOS_WORKLOAD=$src/build/gpu_counter
  fi
  echo "phos: the program is the CUDA sample gpu_counter (1 GiB of device memory, re-verified slice by slice)"
  workload_args=(1024)
else
  echo "phos: no GPU (or no nvcc) on this host; running the CPU-side demo"
fi
# The driver's fd-exportable memory fails in a pid namespace that sees the
# host's /proc (containers mount their own); no pid namespace on a GPU host.
[ -n "$gpu" ] && export PHOS_NO_PIDNS=1

source "$src/test/e2e/lib.sh"
run() { echo "+ $*"; "$@"; }
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", b - a}'; }
stall() { grep -o "gate reopened after [0-9.]* ms" "$1" | tail -n1 || true; }

if [ -n "$torch" ]; then
  echo "phos: an uninterrupted run first, for its loss curve"
  LD_PRELOAD=$LIBPHOS "$PHOS_WORKLOAD_RUNNER" "$PHOS_WORKLOAD" "$WORK/ref.state" "$WORK/ref.losses" $steps 0 >/dev/null 2>&1
  workload_args=("$WORK/run.losses" $steps)
fi

start_workload --preload "${workload_args[@]}"
wait_counter_above 20 120
echo "phos: a program runs with LD_PRELOAD=libphos.so as pid $WORKLOAD_PID, state: $(cat "$WORK/state")"
# (the loaded modules one per line: left out here)
run "$PHOSCTL" status "$WORKLOAD_PID" | grep -v '^  module [0-9]*:'
if [ -n "$gpu" ]; then
  t0=$(now)
  run "$CRIU" dump -t "$WORKLOAD_PID" -D "$IMG" --lib "$PLUGIN_DIR" -v4 -o "$WORK/dump.log" --leave-running
  t1=$(now)
  echo "phos: leave-running dump in $(secs "$t0" "$t1") s; the program's $(stall "$WORK/dump.log"); it carries on: $(cat "$WORK/state")"
  rm -rf "$IMG" && mkdir "$IMG"
fi
t0=$(now)
run "$CRIU" dump -t "$WORKLOAD_PID" -D "$IMG" --lib "$PLUGIN_DIR" -v4 -o "$WORK/dump.log"
t1=$(now)
dumped=$(state_counter)
echo "phos: dumped in $(secs "$t0" "$t1") s at counter $dumped; images:"
ls -l "$IMG" | sed 's/^/    /'
run "$PHOSCTL" show "$IMG"
for _ in $(seq 100); do [ -e "/proc/$WORKLOAD_PID" ] || break; sleep 0.05; done  # the dumped pid is free again
t0=$(now)
run "$CRIU" restore -D "$IMG" --lib "$PLUGIN_DIR" -d -v4 -o "$WORK/restore.log"
t1=$(now)
pid=$(restored_pid)
echo "phos: restored in $(secs "$t0" "$t1") s as pid $pid"
if [ -n "$torch" ]; then
  wait_counter_above $((steps - 1)) 120
  for _ in $(seq 100); do [ -e "/proc/$pid" ] || break; sleep 0.05; done
  if cmp -s "$WORK/ref.losses" "$WORK/run.losses"; then
    echo "phos: the restored run's loss curve equals the uninterrupted run's, bit for bit ($steps steps, dumped at step $dumped; final loss $(tail -n1 "$WORK/run.losses" | cut -d' ' -f2))"
  else
    echo "phos: the loss curves differ: $(diff "$WORK/ref.losses" "$WORK/run.losses" | head -n 2 | tr '\n' ' ')" >&2
    exit 1
  fi
else
  sleep 1
  echo "phos: it carries on: $(cat "$WORK/state")"
  [ -n "${workload_args[*]}" ] && echo "    (TOKEN COUNTER DEVICE_COUNTER ERRORS SLICES: the device counter keeps step, 0 errors)"
  run "$PHOSCTL" status "$pid"
fi
echo "phos: demo done"
