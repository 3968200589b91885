#!/usr/bin/env bash
# (b) A process with libphos.so preloaded is dumped: the plugin talks to the
# agent and writes a GPU manifest with zero allocations; phosctl show prints
# it; restore works and the agent's gate is open again.
source "$(dirname "$0")/lib.sh"

start_workload --preload
wait_counter_above 5
token=$(state_token)
"$PHOSCTL" status "$WORKLOAD_PID" | grep -q "gate: open" || fail "phosctl status: agent not answering"
criu_dump || fail "criu dump failed"
dumped=$(state_counter)
grep -q "phos: process $WORKLOAD_PID (pid 1 in its namespace): agent" "$WORK/dump.log" ||
  fail "the plugin did not talk to the agent"
grep -q "settings .* sparse=auto" "$WORK/dump.log" || fail "the settings line does not show sparse=auto"
for f in phos-1-manifest.img phos-1-complete.img; do
  [ -f "$IMG/$f" ] || fail "$f missing"
  [ "$(stat -c %a "$IMG/$f")" = 600 ] || fail "$f is not mode 0600"
done
"$PHOSCTL" show "$IMG" | tee "$WORK/show.txt"
grep -q "complete: yes" "$WORK/show.txt" || fail "phosctl show: image not complete"
grep -q "size: 0 B logical, 0 B stored; 0 zero chunks" "$WORK/show.txt" ||
  fail "phosctl show: no logical and stored size"
json=$("$PHOSCTL" show --json "$IMG")
python3 - "$json" <<'PY' || fail "phosctl show --json: unexpected content"
import json, sys
img = json.loads(sys.argv[1])["images"]
assert len(img) == 1, img
m = img[0]
assert m["pid"] == 1 and m["complete"] and m["allocations"] == [] and m["protocol"] == "stop-the-world", m
# No zero chunk: the oldest format that holds it, which a phos from before
# sparse images reads.
assert m["format_version"] == 1, m
assert m["size"] == {"logical_bytes": 0, "stored_bytes": 0, "zero_chunks": 0, "zero_bytes": 0, "dead_chunks": 0,
                     "dead_bytes": 0}, m["size"]
PY
"$PHOSCTL" verify "$IMG" || fail "phosctl verify failed"
say "dump ok: counter $dumped, manifest with 0 allocations"

criu_restore || fail "criu restore failed"
pid=$(restored_pid) || fail "no restored process"
grep -q "phos: process $pid (pid 1 in its namespace): GPU state restored, gate open" "$WORK/restore.log" ||
  fail "the plugin did not resume the restored agent"
wait_counter_above $((dumped + 10))
[ "$(state_token)" = "$token" ] || fail "token changed after restore"
"$PHOSCTL" status "$pid" | tee "$WORK/status.txt"
grep -q "gate: open" "$WORK/status.txt" || fail "restored agent's gate is not open"
say "restore ok: pid $pid, counter $dumped -> $(state_counter), token kept, agent answers"
say "PASS"
