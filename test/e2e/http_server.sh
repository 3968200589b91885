#!/usr/bin/env bash
# An HTTP inference server (http_model_server.py: standard library, a model of
# a few layers) under libphos.so, listening on a port: it answers, is dumped
# with --leave-running and answers on; killed and restored from that image,
# it answers the same next request identically (same process token, same
# count of requests served, same tokens) as the original did after the dump.
export PHOS_WORKLOAD=$(cd "$(dirname "$0")" && pwd)/http_model_server.py
export PHOS_WORKLOAD_RUNNER=$(python3 -c 'import sys; print(sys.executable)')
source "$(dirname "$0")/lib.sh"

export CRIU_NET_ARGS="--tcp-established --network-lock nftables"  # both criu runs (lib.sh)
# ask SEED: the server's reply to /generate?seed=SEED&n=16 (the JSON line).
ask() {
  LD_PRELOAD= timeout 30 python3 -c '
import sys, urllib.request
with urllib.request.urlopen("http://127.0.0.1:%s/generate?seed=%s&n=16" % (sys.argv[1], sys.argv[2]), timeout=20) as r:
    print(r.read().decode())' "$(state_field 3)" "$1"
}

start_workload --preload
wait_counter_above 5
first=$(ask 7) || fail "the server did not answer before the dump"
criu_dump --leave-running || fail "criu dump --leave-running failed: $(criu_errors "$WORK/dump.log")"
grep -q "phos: process $WORKLOAD_PID (pid 1 in its namespace): agent" "$WORK/dump.log" ||
  fail "the plugin did not talk to the server's agent"
[ -f "$IMG/phos-1-complete.img" ] || fail "no complete phos image"
original=$(ask 11) || fail "the server did not answer after the leave-running dump"
say "answers before the dump: $first"
say "the original's next answer after the dump: $original"

WORKLOAD_PID=$(restored_pid)
kill -9 "$WORKLOAD_PID"; wait_pid_free
rm -f "$WORK/state"  # the original's; the restored process writes its own
criu_restore || fail "criu restore failed: $(criu_errors "$WORK/restore.log")"
restored_pid >/dev/null || fail "no restored process"
wait_counter_above 0
restored=$(ask 11) || fail "the restored server did not answer"
say "the restored server's answer to the same request: $restored"
[ "$restored" = "$original" ] || fail "the restored server answered otherwise than the original after the dump"
grep -q '"served": 2' <<<"$restored" || fail "the restored server did not count the request served before the dump"
say "PASS"
