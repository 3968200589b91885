#!/usr/bin/env bash
# The main job (README): sets everything up, then checkpoints and restores a
# program with real CRIU and the phos plugin.
#
# On a GPU host this is meant to checkpoint a sample CUDA program; that sample
# is test/gpu/checkpoint.sh (from the GPU bundle) for now, and this script says
# so and runs the CPU-side demo on every host: a program running with
# libphos.so is dumped, its GPU image shown, restored, and it carries on.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
cd "$src"
"$src/contrib/scripts/install-deps.sh"
if [ -f build/build.ninja ]; then meson configure build >/dev/null; else meson setup build >/dev/null; fi
ninja -C build >/dev/null
echo "phos: built in $src/build"

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  echo "phos: GPU found: $(nvidia-smi -L | head -n1)"
  echo "phos: GPU checkpoint and restore of a CUDA program is shown by test/gpu/checkpoint.sh on a GPU host"
  echo "phos: (from the bundle test/gpu/make-bundle.sh builds); this demo runs the CPU-side one"
else
  echo "phos: no GPU on this host; running the CPU-side demo"
fi

PHOS_BUILD=$src/build
TEST_NAME=demo
source "$src/test/e2e/lib.sh"
run() { echo "+ $*"; "$@"; }

start_workload --preload
wait_counter_above 20
echo "phos: a program runs with LD_PRELOAD=libphos.so as pid $WORKLOAD_PID, state: $(cat "$WORK/state")"
run "$PHOSCTL" status "$WORKLOAD_PID"
run "$CRIU" dump -t "$WORKLOAD_PID" -D "$IMG" --lib "$PLUGIN_DIR" -o "$WORK/dump.log"
echo "phos: dumped at counter $(state_counter); images:"
ls -l "$IMG" | sed 's/^/    /'
run "$PHOSCTL" show "$IMG"
run "$CRIU" restore -D "$IMG" --lib "$PLUGIN_DIR" -d -o "$WORK/restore.log"
pid=$(restored_pid)
sleep 1
echo "phos: restored as pid $pid, it carries on: $(cat "$WORK/state")"
run "$PHOSCTL" status "$pid"
echo "phos: demo done (the restored program is stopped now)"
