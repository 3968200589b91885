#!/usr/bin/env bash
# A multi-process NCCL job through real criu dumps of its whole tree,
# against the fake libnccl (which fails a call on a communicator it
# destroyed): a launcher and two ranks sharing a communicator of 2 ranks.
# - A leave-running dump: criu's CUDA (contexts, the copy's staging)
#   starts at the launcher's pause, not at the ranks' hold, and no held
#   rank's allocations are listed ahead; the plugin holds both ranks before one call
#   number and makes their release pending, each rank's quiesce releases
#   its communicator, and after the dump both make it again from one new
#   unique id (rank 0 draws it, rank 1 finds it at the rendezvous): the job
#   goes on.
# - A dump and a restore: the same in the restored job, from yet another id.
# - A dump while the ranks still make their communicator again after the
#   last one (NCCL's creation slowed to 2 s): refused, saying so, and the
#   job goes on; once made, the next dump goes through.
# - A rank without phos's agent, or one whose communicator holds a buffer
#   registration (which phos cannot make again): the dump is refused for
#   the whole job before any rank lets go of its communicator, and both
#   ranks carry on.
export PHOS_WORKLOAD=${PHOS_BUILD:?}/test/hooks/nccl_job_client FAKE_NCCL_STRICT=1 FAKE_NCCL_RANDOM_IDS=1
source "$(dirname "$0")/../e2e/lib.sh"
export PHOS_NCCL_RENDEZVOUS_DIR=$WORK/rendezvous
# state: TOKEN COUNTER MADE0 MADE1 ID0 ID1
made() { echo "$(state_field 3) $(state_field 4)"; }
ids() { echo "$(state_field 5) $(state_field 6)"; }
same_new_id() {  # same_new_id OLD: both ranks on one id, not OLD
  local a b
  read -r a b <<< "$(ids)"
  [ "$a" = "$b" ] && [ "$a" != "$1" ] && [ "$a" != 0000000000000000 ]
}
new_job() {  # new_job [CLIENT ARGS...]: the last job ended, a new one counting, an empty image dir
  for p in $(workload_pids); do kill -9 "$p" 2>/dev/null || true; done
  sleep 0.3
  rm -rf "$IMG" "$WORK"/state* && mkdir -p "$IMG"
  start_workload --preload "$@"
  wait_counter_above 5 10
}
# refused_dump WHAT PATTERN MADE: a leave-running dump fails, its log says
# PATTERN, and the job goes on with MADE communicators made per rank.
refused_dump() {
  if criu_dump --leave-running; then fail "$1 was dumped"; fi
  grep -q "$2" "$WORK/dump.log" || fail "the refusal of $1 does not say why: $(grep -v rlimit "$WORK/dump.log" | grep -m1 -A1 Error)"
  local at; at=$(state_counter)
  wait_counter_above $((at + 20)) 15
  [ "$(made)" = "$3" ] || fail "after the refused dump of $1 the ranks made $(made) communicators, not $3"
}

start_workload --preload
wait_counter_above 5
[ "$(made)" = "1 1" ] || fail "the ranks made $(made) communicators, not 1 each"
first_id=$(state_field 5)
criu_dump --leave-running || fail "criu dump --leave-running failed: $(grep -m1 -A1 Error "$WORK/dump.log")"
held=$(grep -o 'NCCL communicator [0-9a-f]*: its 2 ranks (pids [0-9 ]*) held before call [0-9]* in [0-9.]* ms' "$WORK/dump.log") ||
  fail "the dump log does not say both ranks were held"
# criu's CUDA, with contexts on the ranks' GPUs, started from the launcher
# (CUDA loaded, no device memory), paused before its ranks, not at their
# hold; the copy's staging made then too, not at each rank's gate.
started=$(grep -n "criu's CUDA contexts on [0-9]* of the host's [0-9]* GPU(s) made ahead of the processes that hold device memory" "$WORK/dump.log" | cut -d: -f1)
at_hold=$(grep -n "its 2 ranks (pids [0-9 ]*) held before call" "$WORK/dump.log" | cut -d: -f1)
[ -n "$started" ] && [ "$started" -lt "$at_hold" ] ||
  fail "criu's CUDA was not started ahead of the ranks' hold: $(grep -o "phos: criu's CUDA.*" "$WORK/dump.log")"
grep -q "the processes with device memory: the copy's staging made before the gate, in the background: [0-9]* rings" "$WORK/dump.log" ||
  fail "the copy's staging was not made with criu's contexts: $(grep -o "phos: .*staging.*" "$WORK/dump.log" | head -n2)"
! grep -q "listed ahead\|staging made before the gate: [0-9]" "$WORK/dump.log" ||
  fail "a held rank's allocations were listed, or its staging made, at its own pause: $(grep -o "phos: .*\(listed ahead\|staging\).*" "$WORK/dump.log" | head -n2)"
[ "$(grep -c '1 NCCL communicator(s) released in' "$WORK/dump.log")" = 2 ] || fail "not both ranks released their communicator"
[ "$(grep -c 'gate reopened after [0-9.]* ms stopped: quiesce [0-9.]* ms (NCCL release [0-9.]* ms)' "$WORK/dump.log")" = 2 ] ||
  fail "the stall's breakdown does not give each rank's NCCL release"
at=$(state_counter)
wait_counter_above $((at + 20)) 10
[ "$(made)" = "2 2" ] || fail "after the leave-running dump the ranks made $(made) communicators, not 2 each"
same_new_id "$first_id" || fail "the ranks did not meet on one new unique id: $(ids) (first $first_id)"
for p in $(pgrep -f "^$PHOS_WORKLOAD $WORK/state --rank"); do
  "$PHOSCTL" status "$p" | grep -q "nccl_rebuilds: 1" || fail "process $p: the status counts no rebuild: $("$PHOSCTL" status "$p" | grep nccl_)"
done
[ "$(ls "$PHOS_NCCL_RENDEZVOUS_DIR" | grep -vc '\.r[0-9]*$')" = 1 ] || fail "not one id at the rendezvous: $(ls "$PHOS_NCCL_RENDEZVOUS_DIR")"
[ "$(ls "$PHOS_NCCL_RENDEZVOUS_DIR" | grep -c '\.r[01]$')" = 2 ] || fail "not both ranks arrived at the rendezvous: $(ls "$PHOS_NCCL_RENDEZVOUS_DIR")"
[ "$(stat -c %a "$PHOS_NCCL_RENDEZVOUS_DIR")" = 700 ] || fail "the rendezvous is open to others"
say "leave-running: $held; both released, made again from one new id ($(state_field 5)), the job went on"

rm -rf "$IMG" && mkdir -p "$IMG"
token=$(state_token) second_id=$(state_field 5)
criu_dump || fail "criu dump failed: $(grep -m1 -A1 Error "$WORK/dump.log")"
dumped=$(state_counter)
sleep 0.2
[ -z "$(workload_pids)" ] || fail "the job still runs after the dump"
criu_restore || fail "criu restore failed: $(grep -m1 -A1 Error "$WORK/restore.log")"
restored_pid > /dev/null || fail "no restored process"
wait_counter_above $((dumped + 20)) 10
[ "$(state_token)" = "$token" ] || fail "token changed after restore"
[ "$(made)" = "3 3" ] || fail "after the restore the ranks made $(made) communicators, not 3 each"
same_new_id "$second_id" || fail "the restored ranks did not meet on one new unique id: $(ids)"
say "dump and restore: the restored ranks made their communicator again from one new id, the job went on (counter $dumped -> $(state_counter))"

# A dump while the last one's rebuild still runs: refused, the job goes on.
FAKE_NCCL_INIT_MS=2000 new_job
criu_dump --leave-running || fail "the first leave-running dump failed: $(grep -v rlimit "$WORK/dump.log" | grep -m1 -A1 Error)"
rm -rf "$IMG" && mkdir -p "$IMG"
refused_dump "a job still making its communicator again" "still being made again after the last checkpoint" "2 2"
rm -rf "$IMG" && mkdir -p "$IMG"
criu_dump --leave-running || fail "the dump after the rebuild failed: $(grep -v rlimit "$WORK/dump.log" | grep -m1 -A1 Error)"
at=$(state_counter)
wait_counter_above $((at + 20)) 15
[ "$(made)" = "3 3" ] || fail "after the third dump the ranks made $(made) communicators, not 3 each"
say "a dump during the last one's rebuild (NCCL's creation slowed to 2 s): refused ('NCCL communicators still being made again after the last checkpoint'), the job went on; the dump after the rebuild went through"

# Rank 1 without phos's agent: refused for the whole job, both go on.
new_job --bare-rank1
refused_dump "a job with a rank without an agent" "rank(s) 1 of 2 not found among the processes dumped" "1 1"
say "a rank without an agent: dump refused ($(grep -o 'rank(s) 1 of 2 not found[^;]*' "$WORK/dump.log" | head -n1)); both ranks went on"

new_job --register-rank1
refused_dump "a job with a buffer registration" "rank 1 (process [0-9]*) used NCCL communicator (rank 1 of 2): 1 buffer registration" "1 1"
grep -q "NCCL communicator(s) released" "$WORK/dump.log" && fail "a rank released its communicator before the refusal"
# criu pauses rank 1 too after rank 0's refusal: refused at once, not
# waiting for a frozen rank's agent until criu's own timeout.
grep -q "Timeout reached\|BUG at" "$WORK/dump.log" && fail "criu timed out on the refused job: $(grep -m1 'Timeout reached\|BUG at' "$WORK/dump.log")"
say "rank 1 with a buffer registration: dump refused before any release ($(grep -o 'rank 1 (process [0-9]*) used [^,]*' "$WORK/dump.log" | head -n1)); both ranks went on"
# cuMem host memory off: NCCL's abort of one rank would wait for the other's,
# and the ranks are released one after another: refused before any release.
NCCL_CUMEM_HOST_ENABLE=0 new_job
refused_dump "a job with cuMem host memory off" "cuMem host memory off (NCCL_CUMEM_HOST_ENABLE=0)" "1 1"
grep -q "NCCL communicator(s) released" "$WORK/dump.log" && fail "a rank released its communicator before the refusal"
say "cuMem host memory off (NCCL_CUMEM_HOST_ENABLE=0): dump refused before any release; both ranks went on"
say "PASS"
