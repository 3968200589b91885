#!/usr/bin/env bash
# A checkpoint's release of NCCL communicators and their rebuild, against
# the fake libnccl (which fails any call on a communicator it destroyed):
# the agent's quiesce destroys the program's four (one rank alone, one split
# from it, a pair of one process) while the gate is open, the program's NCCL
# calls wait meanwhile, and its resume makes them again behind the handles
# the program holds; the program goes on calling NCCL through them. The
# status counts each rebuild. A communicator that cannot be made again (one
# with ranks in other processes) makes the quiesce refuse and leaves the
# program running.
set -euo pipefail
BUILD=${PHOS_BUILD:?}
dir=$BUILD/test/hooks
libphos=$BUILD/cuda_hooks/libphos.so
phosctl=$BUILD/plugin/phosctl
tool=$dir/phos-agent-tool
fail() { echo "[nccl_release] FAIL: $*"; exit 1; }
work=$(mktemp -d)
FAKE_NCCL_STRICT=1 LD_PRELOAD=$libphos "$dir/nccl_rank_client" "$work/state" > "$work/out" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 200); do [ -s "$work/state" ] && break; sleep 0.02; done
[ -s "$work/state" ] || fail "the client issues no calls: $(cat "$work/out")"
field() { cut -d' ' -f"$1" "$work/state"; }
[ "$(field 3)" = 4 ] || fail "the client made $(field 3) communicators, not 4"

"$tool" hold "$pid" 300 > "$work/hold" 2>&1 &
tool_pid=$!
for _ in $(seq 100); do grep -q quiesced "$work/hold" && break; sleep 0.02; done
grep -q "^nccl: 4 communicators released in" "$work/hold" || fail "the quiesce released no communicators: $(cat "$work/hold")"
n=$(field 2)
sleep 0.15
[ "$(field 2)" -le $((n + 1)) ] || fail "the program's NCCL calls went on while released ($n -> $(field 2))"
wait $tool_pid || fail "hold: $(cat "$work/hold")"
for _ in $(seq 100); do [ "$(field 2)" -gt $((n + 10)) ] && break; sleep 0.02; done
[ "$(field 2)" -gt $((n + 10)) ] || fail "the program does not go on after the resume (at $(field 2)): $(cat "$work/out")"
kill -0 $pid || fail "the program ended: $(cat "$work/out")"
[ "$(field 3)" = 8 ] || fail "$(field 3) communicators made in all, not 8 (4, then 4 again)"
rebuilds=$("$phosctl" status "$pid" --json | python3 -c "
import json, sys
c = json.load(sys.stdin)['nccl_communicators']
print(' '.join(str(x['rebuilds']) + ('r' if x['released'] else '') for x in c))")
[ "$rebuilds" = "1 1 1 1" ] || fail "rebuild counts per communicator: $rebuilds (want 1 1 1 1)"
"$phosctl" status "$pid" | grep -q "nccl_rebuilds: 1" || fail "the status counts no rebuild: $("$phosctl" status "$pid" | grep nccl_)"
"$phosctl" status "$pid" | grep -q "nccl_last_rebuild_us: [0-9]" || fail "the status gives no rebuild time"
say_one="$(grep '^nccl:' "$work/hold"); the program's calls waited meanwhile and went on through the same handles, 4 made again (status: rebuilds $rebuilds)"

# Twice more: the handles are reused again and again.
"$tool" hold "$pid" 50 > "$work/hold2" 2>&1 || fail "second hold: $(cat "$work/hold2")"
"$tool" hold "$pid" 50 > "$work/hold3" 2>&1 || fail "third hold: $(cat "$work/hold3")"
m=$(field 2)
for _ in $(seq 100); do [ "$(field 2)" -gt $((m + 5)) ] && break; sleep 0.02; done
[ "$(field 2)" -gt $((m + 5)) ] && [ "$(field 3)" = 16 ] || fail "after three holds: at $(field 2), $(field 3) made: $(cat "$work/out")"
kill $pid; wait $pid 2>/dev/null || true

# A communicator with ranks in other processes: the quiesce is refused,
# nothing released, the gate open, the program goes on.
LD_PRELOAD=$libphos "$dir/nccl_loop_client" "$work/loop" > "$work/out2" 2>&1 &
pid=$!
for _ in $(seq 200); do [ -s "$work/loop" ] && break; sleep 0.02; done
if "$tool" hold "$pid" 50 > "$work/hold4" 2>&1; then fail "a quiesce released a communicator spanning processes"; fi
grep -q "NCCL communicators cannot be released: .*ranks in other processes" "$work/hold4" ||
  fail "the refusal does not say why: $(cat "$work/hold4")"
"$phosctl" status "$pid" | grep -q "gate: open" || fail "the gate is not open after the refusal"
k=$(cat "$work/loop")
sleep 0.1
[ "$(cat "$work/loop")" -gt "$k" ] || fail "the program stopped after the refused quiesce"
# NCCL's proxy threads see their stop only between polls of 500 ms (the fake
# has one such thread a communicator with FAKE_NCCL_PROXY_POLL): by default
# libphos wakes them during the release, so 4 communicators go in far less
# than the ~1 s their joins would otherwise wait; PHOS_NCCL_PROXY_WAKE=off
# shows that wait.
kill $pid; wait $pid 2>/dev/null || true  # the previous case's program
FAKE_NCCL_PROXY_POLL=1 FAKE_NCCL_STRICT=1 LD_PRELOAD=$libphos "$dir/nccl_rank_client" "$work/state5" > "$work/out5" 2>&1 &
pid=$!
for _ in $(seq 200); do [ -s "$work/state5" ] && break; sleep 0.02; done
sleep 0.6  # every proxy thread in its poll
"$tool" hold "$pid" 50 > "$work/hold5" 2>&1 || fail "hold with proxy threads: $(cat "$work/hold5")"
ms=$(sed -n 's/^nccl: 4 communicators released in \([0-9.]*\) ms.*/\1/p' "$work/hold5")
[ -n "$ms" ] || fail "no release of 4 communicators with proxy threads: $(cat "$work/hold5")"
awk -v ms="$ms" 'BEGIN { exit !(ms < 200) }' || fail "4 communicators with proxy threads released in $ms ms: their polls were not woken"
kill $pid; wait $pid 2>/dev/null || true
PHOS_NCCL_PROXY_WAKE=off FAKE_NCCL_PROXY_POLL=1 FAKE_NCCL_STRICT=1 LD_PRELOAD=$libphos "$dir/nccl_rank_client" "$work/state6" > "$work/out6" 2>&1 &
pid=$!
for _ in $(seq 200); do [ -s "$work/state6" ] && break; sleep 0.02; done
sleep 0.6
"$tool" hold "$pid" 50 > "$work/hold6" 2>&1 || fail "hold with proxy threads, wake off: $(cat "$work/hold6")"
off_ms=$(sed -n 's/^nccl: 4 communicators released in \([0-9.]*\) ms.*/\1/p' "$work/hold6")
[ -n "$off_ms" ] || fail "no release of 4 communicators with the wake off: $(cat "$work/hold6")"
awk -v ms="$off_ms" 'BEGIN { exit !(ms >= 400) }' || fail "with PHOS_NCCL_PROXY_WAKE=off 4 communicators went in $off_ms ms: the setting did not turn the wake off"
kill $pid; wait $pid 2>/dev/null || true
echo "[nccl_release] PASS: $say_one; with NCCL-like proxy threads polling 500 ms, 4 released in $ms ms (in $off_ms ms with PHOS_NCCL_PROXY_WAKE=off); three holds in a row: 16 made in all; a communicator spanning processes: quiesce refused, the program went on"
