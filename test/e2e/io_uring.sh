#!/usr/bin/env bash
# io_uring under libphos.so: criu cannot dump an io_uring (torchrun's launcher
# holds two, made by libuv), so libphos answers io_uring_setup with ENOSYS and
# the program falls back as on a kernel without io_uring.
#   1. without libphos, a program that holds a ring cannot be dumped (why this
#      exists; skipped where the kernel refuses io_uring anyway) and runs on;
#   2. under libphos the same program gets ENOSYS, is dumped and restored;
#   3. PHOS_IO_URING=allow gives it its ring back.
export PHOS_WORKLOAD=${PHOS_BUILD:?}/test/e2e/phos-test-io-uring
source "$(dirname "$0")/lib.sh"

ring() { state_field 3; }

start_workload
wait_counter_above 2
if [ "$(ring)" = ring ]; then
  if criu_dump; then fail "criu dumped a process that holds an io_uring (this test's premise is gone)"; fi
  why=$(grep -m1 "Error.*io_uring" "$WORK/dump.log" | sed 's/^.*): //') || fail "criu's dump failed, but not on the io_uring: $(criu_errors "$WORK/dump.log")"
  at=$(state_counter)
  wait_counter_above $((at + 5))
  say "without libphos: the process holds a ring; criu refuses it ($why) and the process runs on"
else
  say "without libphos: the kernel refuses io_uring here ($(ring)); nothing to show"
fi
kill -9 "$WORKLOAD_PID"; wait_pid_free; rm -rf "$IMG"/*

start_workload --preload
wait_counter_above 2
[ "$(ring)" = none:ENOSYS ] || fail "under libphos io_uring_setup gave $(ring), not ENOSYS"
token=$(state_token)
"$PHOSCTL" status "$WORKLOAD_PID" | grep -q "io_uring_setups_refused: 1$" ||
  fail "the agent's status does not count the refusal: $("$PHOSCTL" status "$WORKLOAD_PID" | grep io_uring)"
criu_dump || fail "criu dump failed: $(criu_errors "$WORK/dump.log")"
dumped=$(state_counter)
criu_restore || fail "criu restore failed: $(criu_errors "$WORK/restore.log")"
restored_pid >/dev/null || fail "no restored process"
wait_counter_above $((dumped + 5))
[ "$(state_token)" = "$token" ] || fail "the restored process is another one"
say "under libphos: io_uring_setup refused (ENOSYS, counted in the status); dumped at $dumped and restored, counting on ($(state_counter))"
kill -9 "$(restored_pid)"; wait_pid_free

PHOS_IO_URING=allow start_workload --preload
wait_counter_above 2
case $(ring) in
  ring | none:EPERM | none:EACCES) say "PHOS_IO_URING=allow: io_uring_setup reaches the kernel ($(ring))" ;;
  *) fail "PHOS_IO_URING=allow: io_uring_setup gave $(ring)" ;;
esac
say "PASS"
