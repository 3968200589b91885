#!/usr/bin/env bash
# The order an on-demand restore fills first: with launches recorded
# (PHOS_RECORD_LAUNCHES=1), the agent's quiesce reply names the allocations in
# the order the recorded calls first touched them. fill_window_client sets
# its second buffer, then reads its first: the order is second, first. Without
# recording the reply names none.
set -euo pipefail
BUILD=${PHOS_BUILD:?}
dir=$BUILD/test/hooks
libphos=$BUILD/cuda_hooks/libphos.so
fail() { echo "[touch_order] FAIL: $*"; exit 1; }
work=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; rm -rf "$work"' EXIT

run() {  # run ENV...: the client with ENV, its calls made; sets pid, first, second
  : > "$work/out"
  env LD_PRELOAD=$libphos "$@" "$dir/fill_window_client" "$work/go" > "$work/out" 2>&1 &
  pid=$!
  for _ in $(seq 100); do grep -q '^ready' "$work/out" && break; sleep 0.05; done
  read -r _ _ first second < <(grep '^ready' "$work/out") || fail "the client did not start: $(cat "$work/out")"
  touch "$work/go"
  for _ in $(seq 100); do grep -q '^unknown' "$work/out" && break; sleep 0.05; done
}

run PHOS_RECORD_LAUNCHES=1
"$dir/phos-agent-tool" hold "$pid" 10 > "$work/tool" 2>&1 || fail "phos-agent-tool: $(cat "$work/tool")"
sed 's/^/[touch_order] /' "$work/tool"
line=$(grep '^touch order:' "$work/tool") || fail "no touch order with launches recorded"
[ "$line" = "touch order: $(printf '0x%x 0x%x' "$second" "$first")" ] ||
  fail "expected the second buffer ($second), then the first ($first): $line"
kill $pid; wait $pid 2>/dev/null || true; rm -f "$work/go"

run
"$dir/phos-agent-tool" hold "$pid" 10 > "$work/tool" 2>&1 || fail "phos-agent-tool: $(cat "$work/tool")"
! grep -q '^touch order:' "$work/tool" || fail "a touch order without recording: $(cat "$work/tool")"
echo "[touch_order] PASS: $line (recorded); none without recording"
