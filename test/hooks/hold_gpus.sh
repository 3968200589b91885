#!/usr/bin/env bash
# phosctl hold-gpus against the fake libcuda with 2 GPUs: it retains a
# context on each, sets each one's stack, printf FIFO and malloc heap limits
# to their least (a limit the driver refuses stays, and it holds all the
# same), says so, and on SIGTERM (SIGINT) releases them and exits 0; a GPU
# in the exclusive-process compute mode is left alone and said; an argument
# is refused (exit 2).
set -euo pipefail
BUILD=${PHOS_BUILD:?}
fail() { echo "[hold_gpus] FAIL: $*"; exit 1; }
work=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$work"' EXIT
export LD_LIBRARY_PATH=$BUILD/test/hooks${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} FAKE_CUDA_DEVICES=2

hold() {  # hold SIGNAL GPUS [ENV=VALUE...]: started, waited for, signalled; its output in $work/out
  local sig=$1 gpus=$2; shift 2
  : > "$work/log"
  env FAKE_CUDA_LOG="$work/log" "$@" "$BUILD/plugin/phosctl" hold-gpus > "$work/out" 2>&1 &
  pid=$!
  # Up to 20 s: a loaded machine starts it slowly.
  for _ in $(seq 400); do grep -q "until SIGTERM or SIGINT" "$work/out" && break; sleep 0.05; done
  grep -q "holding $gpus GPU(s) until SIGTERM or SIGINT" "$work/out" || fail "not holding $gpus GPU(s): $(cat "$work/out")"
  kill -0 "$pid" || fail "it exited while holding"
  kill "-$sig" "$pid"
  local rc=0
  for _ in $(seq 400); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  kill -0 "$pid" 2>/dev/null && fail "still running 20 s after SIG$sig"
  wait "$pid" || rc=$?
  pid=
  [ "$rc" = 0 ] || fail "SIG$sig: exit status $rc: $(cat "$work/out")"
  grep -q "released the contexts" "$work/out" || fail "SIG$sig: nothing says the contexts were released: $(cat "$work/out")"
}

hold TERM 2
for gpu in 0 1; do
  grep -q "holding a CUDA context on GPU $gpu (Fake GPU)" "$work/out" || fail "GPU $gpu not named: $(cat "$work/out")"
done
for ctx in 1 2; do
  for limit in stack printf_fifo malloc_heap; do
    grep -qx "limit $ctx $limit 0" "$work/log" || fail "context $ctx: $limit not set to its least: $(cat "$work/log")"
  done
done
echo "[hold_gpus] 2 GPUs held, every limit at its least, released at SIGTERM"

hold INT 2 FAKE_LIMIT_REFUSE=malloc_heap
grep -q "malloc_heap" "$work/log" && fail "a refused limit was set: $(grep malloc_heap "$work/log")"
grep -qx "limit 2 stack 0" "$work/log" || fail "with the heap refused, the stack was not lowered: $(cat "$work/log")"
echo "[hold_gpus] a refused limit stays, the GPUs held all the same; released at SIGINT"

hold TERM 1 FAKE_CUDA_EXCLUSIVE_DEVICE=1
grep -q "holding a CUDA context on GPU 0" "$work/out" || fail "exclusive GPU 1: GPU 0 not held: $(cat "$work/out")"
grep -q "GPU 1 (Fake GPU) not held: compute mode exclusive-process" "$work/out" ||
  fail "exclusive GPU 1: not said: $(cat "$work/out")"
grep -q "^limit 2 " "$work/log" && fail "exclusive GPU 1: its context was made: $(cat "$work/log")"
echo "[hold_gpus] a GPU in the exclusive-process compute mode left alone, the other held"

rc=0
"$BUILD/plugin/phosctl" hold-gpus extra > "$work/out" 2>&1 || rc=$?
[ "$rc" = 2 ] || fail "an argument: exit status $rc, not 2"
grep -q "no arguments" "$work/out" || fail "an argument: not said: $(cat "$work/out")"
echo "[hold_gpus] an argument refused (exit 2)"
