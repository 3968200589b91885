#!/usr/bin/env bash
# A preloaded process whose main thread is inside dlopen() (holding glibc's
# loader lock, as `import torch` holds it in a program's first seconds) is
# dumped with --leave-running and restored. The agent's paths that run
# while criu holds the rest of the process stopped (hello, quiesce, release,
# remap, resume, the restore's) must not wait for that lock, nor the
# quiesce while the program still runs. Each case: the dump and the
# restore each done within QUICK_S, the program still inside its dlopen
# after the dump, finishing it and counting on after both, its token kept.
#   1. in a library's constructor, a program without CUDA;
#   2. in a library's relocation (glibc's TLS lock held too), a program with
#      4 MiB of device memory and an NCCL communicator of one rank (the fake
#      libcuda with real memory and the fake libnccl): the release and the
#      rebuild of the communicator call NCCL on the agent's thread;
#   3. in a constructor, the same program;
#   4. the same, its constructor calling cuInit every 10 ms (held at the
#      gate the dump closed);
#   5. the same, its constructor holding stdio's lock on stderr (as one
#      frozen inside an fprintf(stderr) does): the agent's messages (context
#      limits lowered and set back around the driver's checkpoint) must not
#      wait for it.
#   6. in a relocation (the TLS lock held), with device memory and an NCCL
#      communicator whose creation starts a thread, as NCCL's does: the
#      give-back's rebuild of it waits in pthread_create for the TLS lock.
#      The dump fails within QUICK_S naming the wait (not 10 s later), its
#      image is not completed (a restore would wait the same), and the
#      program is given back (phos-keeper, once criu lets it run): it
#      finishes its dlopen, its gate open, its memory intact.
# Without phos resolving those NCCL functions ahead of time, 2 to 5 wait
# in dlsym for the loader lock: the quiesce until the dlopen ends (criu's
# freeze timer runs out first), a give-back for good; with the agent's
# messages written through stdio, 5 waits for the stderr lock so.
export PHOS_WORKLOAD=${PHOS_BUILD:?}/test/e2e/phos-test-slow-dlopen
export LD_LIBRARY_PATH=$PHOS_BUILD/test/hooks${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} FAKE_CUDA_MEMORY=1 FAKE_NCCL_STRICT=1
source "$(dirname "$0")/lib.sh"
MARK=$WORK/in-dlopen
export PHOS_TEST_CONSTRUCTOR_MARK=$MARK PHOS_TEST_RELOCATION_MARK=$MARK
# The dlopen lasts this long: past the dump, and past the restore.
export PHOS_TEST_CONSTRUCTOR_MS=4000 PHOS_TEST_RELOCATION_MS=4000
CRIU_TIMEOUT=60
QUICK_S=3

since() { echo "$(date +%s.%N) - $1" | bc; }
quick() { (( $(echo "$1 < $QUICK_S" | bc) )); }

# one_case LABEL LIBRARY [WORKLOAD ARGS...]
one_case() {
  local label=$1 library=$2 t0 took pid token at
  shift 2
  rm -f "$MARK" && rm -rf "${IMG:?}"/*
  start_workload --preload "$BUILD/test/e2e/libphos-test-slow-$library.so" "$@"
  for _ in $(seq 100); do [ -e "$MARK" ] && break; sleep 0.05; done
  [ -e "$MARK" ] || fail "$label: the program did not reach the slow $library"
  [ "$(state_field 3)" = loading ] || fail "$label: the program is not inside its dlopen: $(cat "$WORK/state")"
  token=$(state_token)

  t0=$(date +%s.%N)
  criu_dump --leave-running || fail "$label: criu dump --leave-running failed: $(criu_errors "$WORK/dump.log")"
  took=$(since "$t0")
  grep -q "phos: process $WORKLOAD_PID (pid 1 in its namespace): agent" "$WORK/dump.log" ||
    fail "$label: the plugin did not talk to the agent"
  grep -q "gate reopened after" "$WORK/dump.log" ||
    fail "$label: the dump did not give the process back: $(criu_errors "$WORK/dump.log")"
  quick "$took" || fail "$label: the leave-running dump took $took s (over $QUICK_S s)"
  [ "$(state_field 3)" = loading ] || fail "$label: the program left its dlopen before the dump ended"
  if [ $# -gt 0 ]; then
    grep -q "1 NCCL communicator(s) released" "$WORK/dump.log" || fail "$label: the communicator was not released"
  fi
  wait_counter_above 10 15
  [ "$(state_token)" = "$token" ] || fail "$label: token changed"
  [ $# -eq 0 ] || [ "$(state_field 3)" = ok ] || fail "$label: the program found its device memory wrong: $(state_field 3)"
  say "$label: dumped inside dlopen in $took s; the program finished loading and counts on"

  kill -9 "$WORKLOAD_PID"
  wait_pid_free
  rm -f "$WORK/state"  # the restored program writes it once its dlopen returns
  t0=$(date +%s.%N)
  criu_restore || fail "$label: criu restore failed: $(criu_errors "$WORK/restore.log")"
  took=$(since "$t0")
  pid=$(restored_pid) || fail "$label: no restored process"
  quick "$took" || fail "$label: the restore took $took s (over $QUICK_S s)"
  grep -q "phos: process $pid (pid 1 in its namespace): GPU state restored, gate open" "$WORK/restore.log" ||
    fail "$label: the plugin did not resume the restored agent"
  [ ! -e "$WORK/state" ] || fail "$label: the restored program is not inside its dlopen: $(cat "$WORK/state")"
  wait_counter_above 10 15
  [ "$(state_token)" = "$token" ] || fail "$label: token changed after restore"
  [ $# -eq 0 ] || [ "$(state_field 3)" = ok ] || fail "$label: the restored program found its device memory wrong: $(state_field 3)"
  say "$label: restored in $took s; the program finished loading and counts on, token kept"
  kill -9 "$pid"
  WORKLOAD_PID=$pid
  wait_pid_free
}

one_case "1. constructor, no CUDA" constructor
one_case "2. relocation, device memory and NCCL" relocation --cuda --nccl
one_case "3. constructor, device memory and NCCL" constructor --cuda --nccl
# 4. The constructor calls cuInit every 10 ms: the closed gate holds it there.
PHOS_TEST_CONSTRUCTOR_CUINIT=1 one_case "4. constructor at the closed gate, device memory and NCCL" constructor --cuda --nccl
PHOS_TEST_CONSTRUCTOR_STDERR=1 one_case "5. constructor holding stderr's lock, device memory and NCCL" constructor \
  --cuda --nccl
# 6.
label="6. relocation, a communicator whose creation starts a thread"
rm -f "$MARK" && rm -rf "${IMG:?}"/*
FAKE_NCCL_INIT_THREAD=1 start_workload --preload "$BUILD/test/e2e/libphos-test-slow-relocation.so" --cuda --nccl
for _ in $(seq 100); do [ -e "$MARK" ] && break; sleep 0.05; done
[ "$(state_field 3)" = loading ] || fail "$label: the program is not inside its dlopen: $(cat "$WORK/state")"
t0=$(date +%s.%N)
rc=0
criu_dump --leave-running || rc=$?
took=$(since "$t0")
[ $rc -ne 0 ] && [ $rc -lt 128 ] || fail "$label: criu dump exited $rc, not failing on its own"
quick "$took" || fail "$label: the failed dump took $took s (over $QUICK_S s)"
grep -q "no answer to resume can come: the agent's thread ([0-9]*) has waited [0-9]* ms in futex" "$WORK/dump.log" ||
  fail "$label: the log does not name the agent's wait: $(criu_errors "$WORK/dump.log")"
! ls "$IMG"/phos-*-complete.img >/dev/null 2>&1 || fail "$label: the image was completed"
wait_counter_above 10 15
[ "$(state_field 3)" = ok ] || fail "$label: the program found its device memory wrong: $(state_field 3)"
gate_opens "$WORKLOAD_PID" || fail "$label: the gate is not open after the failed dump"
say "$label: the dump failed in $took s naming the wait; no complete image; the program runs on, gate open"
say "PASS"
