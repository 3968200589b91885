#!/usr/bin/env bash
# The order of a restore (issue 30): the GPU memory is created and filled by
# a thread started at the plugin's init, while criu restores the CPU side
# (restore_overlap=on), and the process's gate opens once both are done.
# Through real criu, the plugin's engine on the fake libcuda with real
# memory (FAKE_CUDA_MEMORY=1); the workload (checksum_client.c) checks its
# device memory every step, so a restore that let it run on memory not yet
# filled fails its next check. PHOS_FAULT=slow-memory-create holds the
# creation for 1.5 s, so criu's CPU restore ends first:
#   1. overlap on: the restore succeeds and the program's checks pass; the
#      init returned and criu reached the process's RESUME_DEVICES_LATE hook
#      before its memory existed; the gate waited last for the memory
#   2. overlap off (the order before): criu's hook came after the memory was
#      created (the init waited for it); the program's checks pass
#   3. on-demand (lazy_restore=on), overlap on: the same, the process mapped
#      its memory once created, filled behind it
#   4. the memory cannot be created (PHOS_FAULT=fail-memory-create, the
#      driver's out-of-memory at the last allocation; the fake driver names
#      every error CUDA_ERROR_FAKE): criu restore fails,
#      its log names the allocation and the driver's error, no process runs,
#      criu ends by itself (it used to hang waiting for the killed pid
#      namespace init, whose threads it traced); the same image restores
#      afterwards
#   5. the same failure with overlap off: refused at init, before criu
#      forks a process (as before)
export PHOS_WORKLOAD=${PHOS_BUILD:?}/test/hooks/checksum_client
export FAKE_CUDA_MEMORY=1 LD_LIBRARY_PATH=$PHOS_BUILD/test/hooks${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PHOS_CHUNK_MIB=1 CRIU_TIMEOUT=60
# Its checks read through the driver, as a program must: an on-demand
# restore (case 3) holds such a read until its chunk is in, not a load of
# the program's own (which read an unfilled chunk 2 times in 6).
export CHECKSUM_READ_BY_COPY=1
source "$(dirname "$0")/../e2e/lib.sh"

# breakdown FIELD: a number of the plugin's restore breakdown line.
breakdown() {
  grep -o "restore breakdown .*" "$WORK/restore.log" | head -n1 | grep -oE "$1 [0-9.]+" | grep -oE "[0-9.]+$" | head -n1
}
# lt A B: A < B (decimals)
lt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 < b + 0) }'; }

# restored_with_breakdown WHAT: lib.sh's restored_ok (with the caller's
# environment, e.g. PHOS_FAULT=...), and criu's log has the plugin's
# restore breakdown.
restored_with_breakdown() {
  restored_ok "$1"
  grep -q "restore breakdown" "$WORK/restore.log" || fail "$1: no restore breakdown in criu's log"
}

start_workload --preload
wait_counter_above 5
criu_dump || fail "criu dump failed: $(criu_errors "$WORK/dump.log")"
wait_pid_free

# 1. Overlap on: criu's CPU restore does not wait for the memory.
PHOS_FAULT=slow-memory-create restored_with_breakdown "overlap on"
grep -q "restore_overlap=on" "$WORK/restore.log" || fail "overlap on: the settings line does not show restore_overlap=on"
created=$(breakdown "GPU memory created") hook=$(breakdown "resume hook") init=$(breakdown "init returned")
[ -n "$created" ] && [ -n "$hook" ] && [ -n "$init" ] || fail "overlap on: breakdown unreadable: $(grep -o 'restore breakdown.*' "$WORK/restore.log")"
lt "$created" 1400 && fail "overlap on: memory created at $created ms: the injected 1.5 s hold did not happen"
lt "$init" 500 || fail "overlap on: the init returned at $init ms: it waited for the memory"
lt "$hook" "$created" || fail "overlap on: criu's RESUME_DEVICES_LATE at $hook ms, after the memory ($created ms): criu waited for it"
grep -q "the gate waited last for the GPU data fill" "$WORK/restore.log" ||
  fail "overlap on: the breakdown does not say that the gate waited for the fill: $(grep -o 'the gate waited last for .*' "$WORK/restore.log")"
say "1. overlap on: init returned at $init ms, criu's hook at $hook ms, memory created at $created ms; checks pass"

# 2. Overlap off: the order before, criu waits in the init.
PHOS_FAULT=slow-memory-create PHOS_RESTORE_OVERLAP=off restored_with_breakdown "overlap off"
created=$(breakdown "GPU memory created") hook=$(breakdown "resume hook") init=$(breakdown "init returned")
lt "$init" "$created" && fail "overlap off: the init returned at $init ms, before the memory ($created ms)"
lt "$created" "$hook" || fail "overlap off: criu's hook at $hook ms, before the memory was created ($created ms)"
grep -q "overlap=off" "$WORK/restore.log" || fail "overlap off: the breakdown does not say overlap=off"
say "2. overlap off: memory created at $created ms, init returned at $init ms, criu's hook at $hook ms; checks pass"

# 3. On demand, overlap on.
PHOS_FAULT=slow-memory-create PHOS_LAZY_RESTORE=on restored_with_breakdown "on-demand"
created=$(breakdown "GPU memory created") hook=$(breakdown "resume hook")
lt "$hook" "$created" || fail "on-demand: criu's hook at $hook ms, after the memory ($created ms)"
grep -q "filled behind the running process" "$WORK/restore.log" || fail "on-demand: the breakdown does not say the fill ran behind"
say "3. on-demand: criu's hook at $hook ms, memory created at $created ms, filled behind the process; checks pass"

# 4. The memory cannot be created, found while criu restores.
kill -9 "$WORKLOAD_PID" 2>/dev/null || true
wait_pid_free
# criu must end by itself: its cleanup waits for the killed process (the
# pid namespace's init), which the plugin's kill must not hold up.
rc=0
PHOS_FAULT=fail-memory-create CRIU_TIMEOUT=20 criu_restore || rc=$?
[ "$rc" -ne 0 ] || fail "memory not created: criu restore succeeded"
[ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "memory not created: criu restore hung after the plugin killed the process (ended by its 20 s limit)"
grep -qE "cannot restore: phos-1-manifest.img: device 0: allocate [0-9]+ bytes for allocation [0-9]+: CUDA_ERROR_[A-Z_]+" \
  "$WORK/restore.log" || fail "memory not created: the log does not name the allocation and the driver's error: $(criu_errors "$WORK/restore.log")"
grep -q "restore of GPU state failed: .*; killing it" "$WORK/restore.log" ||
  fail "memory not created: the log does not say the process was killed"
sleep 0.3
[ -z "$(workload_pids)" ] || fail "memory not created: a process runs after the failed restore"
named=$(grep -oE "allocate [0-9]+ bytes for allocation [0-9]+: [A-Z_]+" "$WORK/restore.log" | head -n1)
WORKLOAD_PID=
restored_with_breakdown "after the failure"
say "4. memory not created while criu restored: criu failed, '$named' named, no process left; the image restores afterwards"

# 5. The same with overlap off: refused before a process exists.
kill -9 "$WORKLOAD_PID" 2>/dev/null || true
wait_pid_free
if PHOS_FAULT=fail-memory-create PHOS_RESTORE_OVERLAP=off criu_restore; then fail "overlap off, memory not created: criu restore succeeded"; fi
grep -qE "cannot restore: phos-1-manifest.img: device 0: allocate [0-9]+ bytes" "$WORK/restore.log" ||
  fail "overlap off, memory not created: no message: $(criu_errors "$WORK/restore.log")"
grep -q "restore of GPU state failed" "$WORK/restore.log" && fail "overlap off, memory not created: a process was forked (and killed)"
[ -z "$(workload_pids)" ] || fail "overlap off, memory not created: a process runs"
say "5. overlap off, memory not created: refused at init"
say "PASS"
