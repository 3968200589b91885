#!/usr/bin/env bash
# PHOS_SHRINK_DRIVER_STATE=1 against the fake libcuda (it logs every
# cuCtxSetLimit as "limit CTX NAME VALUE"): a checkpoint's round trip (gate
# closed, memory released with its handles, mapped back, gate open) lowers
# the context's stack, printf FIFO and malloc heap limits after the release
# and sets them back to the program's own values before the gate opens;
# a limit the driver refuses stays untouched; with PHOS_SHRINK_DRIVER_STATE=0
# nothing is set. It is on by default.
set -euo pipefail
BUILD=${PHOS_BUILD:?}
fail() { echo "[driver_limits] FAIL: $*"; exit 1; }
source "$(dirname "$0")/gate_open_lib.sh"

round
expected=$(cat <<'LINES'
limit 1 stack 4096
mark ready
limit 1 stack 0
limit 1 printf_fifo 0
limit 1 malloc_heap 0
limit 1 stack 4096
limit 1 printf_fifo 1048576
limit 1 malloc_heap 8388608
mark after
LINES
)
diff <(echo "$expected") <(grep -E '^(limit|mark)' "$work/log") || fail "limits not lowered and set back in order (diff above)"
grep -q '^after stack=4096 printf_fifo=1048576 malloc_heap=8388608$' "$work/out" ||
  fail "the program does not find its own limits after the round trip: $(grep after "$work/out")"
grep -q "context limits lowered: stack 4096 -> 0, printf FIFO 1048576 -> 0, malloc heap 8388608 -> 0" "$work/err" ||
  fail "no log line of the lowering: $(cat "$work/err")"
grep -q "context limits set back: stack 4096, printf FIFO 1048576, malloc heap 8388608" "$work/err" ||
  fail "no log line of the setting back: $(cat "$work/err")"
echo "[driver_limits] lowered after the release and set back before the gate opened"

# The driver refuses the heap (a kernel used malloc): it stays as it is.
round PHOS_SHRINK_DRIVER_STATE=1 FAKE_LIMIT_REFUSE=malloc_heap
grep -q 'malloc_heap' "$work/log" && fail "the refused heap limit was set: $(grep malloc_heap "$work/log")"
grep -q "malloc heap 8388608 kept (CUDA_ERROR_" "$work/err" || fail "the refusal is not said: $(cat "$work/err")"
grep -q '^after stack=4096 printf_fifo=1048576 malloc_heap=8388608$' "$work/out" || fail "limits after a refusal: $(grep after "$work/out")"
echo "[driver_limits] a limit the driver refuses stays untouched"

# Off: no limit set but the program's own.
round PHOS_SHRINK_DRIVER_STATE=0
[ "$(grep -c '^limit' "$work/log")" = 1 ] || fail "limits set with PHOS_SHRINK_DRIVER_STATE=0: $(grep '^limit' "$work/log")"
echo "[driver_limits] PASS"
