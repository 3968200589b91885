#!/usr/bin/env bash
# The give-back of a dump that kills its processes is phos-keeper's, after
# criu exits: a process criu ends gets none (criu spends no time on it), and
# one that lives on because --leave-running came from where the plugin cannot
# see it (a criu config file, as with criu swrk's RPC) gets its GPU side back
# from the keeper: its gate opens.
source "$(dirname "$0")/lib.sh"

# 1. Without --leave-running: the process ends with criu, nothing given back.
start_workload --preload
wait_counter_above 5
criu_dump || fail "criu dump failed"
grep -q "given back only if it outlives criu" "$WORK/dump.log" || fail "the plugin did not hand the give-back over"
grep -q "gate reopened" "$WORK/dump.log" && fail "the plugin gave the process back its GPU side before criu killed it"
sleep 0.3
[ -z "$(workload_pids)" ] || fail "the process runs after a dump without --leave-running"
for _ in $(seq 100); do grep -q "nothing to give back" "$IMG/phos-keeper.log" 2>/dev/null && break; sleep 0.05; done
grep -qE "(is gone|ended with criu); nothing to give back" "$IMG/phos-keeper.log" ||
  fail "phos-keeper did not see the process end: $(cat "$IMG/phos-keeper.log" 2>/dev/null)"
say "without --leave-running: no give-back, the keeper saw the process end with criu"

# 2. --leave-running from a config file: the keeper gives the process back.
wait_pid_free
rm -rf "$IMG" && mkdir -p "$IMG"
start_workload --preload
wait_counter_above 5
printf 'leave-running\n' > "$WORK/criu.conf"
criu_dump --config "$WORK/criu.conf" || fail "criu dump --config (leave-running) failed"
at=$(state_counter)
gate_opens "$WORKLOAD_PID" ||
  fail "gate not open 10 s after a leave-running dump from a config file: $(cat "$IMG/phos-keeper.log" 2>/dev/null)"
wait_counter_above $((at + 5))
grep -q "given back what the dump took" "$IMG/phos-keeper.log" || fail "the keeper log does not say it gave the process back"
say "--leave-running from a config file: the keeper gave the process back, gate open, counting ($at -> $(state_counter))"
say "PASS"
