#!/usr/bin/env bash
# Side by side, on a GPU host (after run-on-host.sh): the same CUDA process
# holding MIB MiB of device memory, dumped and restored by criu 4.1.1 with
# the phos plugin, and by criu 4.1.1 with its own cuda plugin (through the
# cuda-checkpoint tool). Images in DIR (default /dev/shm: memory-backed).
# Prints one line per tool: dump seconds, restore seconds, image size, and
# whether the restored process carried on with intact device memory.
# The full benchmark (sizes, storages, leave-running stall, table and plot)
# is bench_checkpoint.sh.
# usage: compare.sh [MIB] [DIR]
MIB=${1:-8192}
BASE=${2:-/dev/shm}
here=$(cd "$(dirname "$0")" && pwd)
export PATH=$PHOS_BUILD/test/bench:$PATH   # cuda-checkpoint, for CRIU's cuda plugin
export PHOS_WORKLOAD=$PHOS_BUNDLE/gpu/gpu_counter PHOS_NO_PIDNS=1
now() { date +%s.%N; }
dt() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", b - a}'; }

run_one() {  # run_one NAME PLUGIN_SO [--preload]
  local name=$1 plugin=$2 preload=${3:-}
  (
    source "$here/../e2e/lib.sh"
    TEST_NAME=compare_$name
    IMG=$(mktemp -d "$BASE/phos-compare.XXXXXX")
    rm -f "$PLUGIN_DIR"/*.so && ln -s "$plugin" "$PLUGIN_DIR/"
    trap 'cleanup; rm -rf "$IMG"' EXIT
    start_workload $preload "$MIB"
    wait_counter_above 5
    local token; token=$(state_token)
    local t0 t1 t2 t3
    t0=$(now); criu_dump || fail "dump failed"; t1=$(now)
    local dumped size; dumped=$(state_counter); size=$(du -sh "$IMG" | cut -f1)
    t2=$(now); criu_restore || fail "restore failed"; t3=$(now)
    restored_pid >/dev/null || fail "no restored process"
    wait_counter_above $((dumped + MIB / 64 + 5)) $((MIB / 64 / 20 + 10))
    local ok=no
    local tok host device errors
    read -r tok host device errors _ < "$WORK/state"   # one read: rewritten every step
    [ "$tok" = "$token" ] && [ "$host" = "$device" ] && [ "$errors" = 0 ] && ok=yes
    printf "compare: %-18s %6d MiB  dump %7s s  restore %7s s  image %6s  carried on intact: %s\n" \
      "$name" "$MIB" "$(dt "$t0" "$t1")" "$(dt "$t2" "$t3")" "$size" "$ok"
  )
}

run_one phos "$PHOS_BUILD/plugin/phos_plugin.so" --preload
run_one criu+cuda_plugin "$PHOS_BUNDLE/criu/cuda_plugin.so"
