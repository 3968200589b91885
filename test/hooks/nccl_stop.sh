#!/usr/bin/env bash
# A job-wide quiesce's stop on one rank, against the fake libnccl: the
# agent's status names the process's communicator (rank 0 of 2, its job
# id, the calls issued); `phosctl nccl-stop` arms a stop a few calls ahead,
# and the rank's thread waits before issuing that call, the status saying
# it is held there; `phosctl nccl-go` lets it go on. A stop at a call
# already issued, or on a job the process has no communicator of, is
# refused. Then two ranks of one job (two processes, the fake's unique ids
# alike, each calling at its own pace): `phosctl nccl-quiesce` holds both
# before one call number, the same on each.
set -euo pipefail
BUILD=${PHOS_BUILD:?}
dir=$BUILD/test/hooks
libphos=$BUILD/cuda_hooks/libphos.so
phosctl=$BUILD/plugin/phosctl
fail() { echo "[nccl_stop] FAIL: $*"; exit 1; }
work=$(mktemp -d)
LD_PRELOAD=$libphos "$dir/nccl_loop_client" "$work/state" > "$work/out" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 200); do [ -s "$work/state" ] && break; sleep 0.02; done
[ -s "$work/state" ] || fail "the client issues no calls: $(cat "$work/out")"
comm() {  # comm FIELD: the first communicator's FIELD in phosctl status --json
  "$phosctl" status "$pid" --json | python3 -c "import json, sys; print(json.load(sys.stdin)['nccl_communicators'][0]['$1'])"
}
job=$(comm job_id)
[ "$(comm rank)" = 0 ] && [ "$(comm nranks)" = 2 ] || fail "not rank 0 of 2: $("$phosctl" status "$pid")"
at=$(( $(comm calls) + 2000 ))  # two seconds ahead: phosctl and python take tens of ms, more on a loaded machine
"$phosctl" nccl-stop "$pid" "$job" "$at" | sed 's/^/[nccl_stop] /'
for _ in $(seq 600); do [ "$(comm held)" = True ] && break; sleep 0.02; done
[ "$(comm held)" = True ] || fail "no call held at $at: $("$phosctl" status "$pid" | grep NCCL)"
[ "$(comm calls)" = "$at" ] || fail "held after $(comm calls) calls, not $at"
n=$(cat "$work/state")
sleep 0.2
[ "$(cat "$work/state")" = "$n" ] || fail "the held rank went on issuing calls ($n -> $(cat "$work/state"))"
[ "$n" = "$at" ] || fail "the program says it issued $n calls, not $at"
"$phosctl" status "$pid" | grep 'NCCL communicator' | sed 's/^/[nccl_stop] /'
if "$phosctl" nccl-stop "$pid" "$job" 3 2>"$work/err"; then fail "a stop at a call already issued was armed"; fi
grep -q "short of call 3" "$work/err" || fail "the refusal does not say why: $(cat "$work/err")"
if "$phosctl" nccl-stop "$pid" 1234 99999999 2>/dev/null; then fail "a stop on a job it has no communicator of was armed"; fi
"$phosctl" nccl-go "$pid" "$job" | sed 's/^/[nccl_stop] /'
for _ in $(seq 200); do [ "$(cat "$work/state")" -gt $((at + 5)) ] && break; sleep 0.02; done
[ "$(cat "$work/state")" -gt $((at + 5)) ] || fail "the rank did not go on after nccl-go (at $(cat "$work/state"))"
[ "$(comm held)" = False ] || fail "still held after nccl-go"
say_one="rank 0 of 2 held before call $at of communicator $job, went on after nccl-go (now $(cat "$work/state"))"

# Two ranks of one job, started apart: their call counts differ.
sleep 0.3
LD_PRELOAD=$libphos "$dir/nccl_loop_client" "$work/state2" > "$work/out2" 2>&1 &
pid2=$!
trap 'kill $pid $pid2 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 200); do [ -s "$work/state2" ] && break; sleep 0.02; done
"$phosctl" nccl-quiesce "$pid" "$pid2" > "$work/quiesce" 2>&1 || fail "nccl-quiesce: $(cat "$work/quiesce")"
sed 's/^/[nccl_stop] /' "$work/quiesce"
k=$(grep -o 'before call [0-9]*' "$work/quiesce" | grep -o '[0-9]*$')
[ -n "$k" ] || fail "nccl-quiesce names no call: $(cat "$work/quiesce")"
a=$(cat "$work/state") b=$(cat "$work/state2")
sleep 0.2
[ "$a" = "$k" ] && [ "$b" = "$k" ] && [ "$(cat "$work/state")" = "$k" ] && [ "$(cat "$work/state2")" = "$k" ] ||
  fail "the ranks are not both held at call $k: $a and $b, then $(cat "$work/state") and $(cat "$work/state2")"
"$phosctl" nccl-go "$pid" "$job" > /dev/null
"$phosctl" nccl-go "$pid2" "$job" > /dev/null
for _ in $(seq 200); do [ "$(cat "$work/state2")" -gt $((k + 5)) ] && break; sleep 0.02; done
[ "$(cat "$work/state2")" -gt $((k + 5)) ] || fail "the second rank did not go on"
echo "[nccl_stop] PASS: $say_one; two ranks held by nccl-quiesce before call $k, each, and went on"
