#!/usr/bin/env bash
# criu pre-dump of a process under phos is refused by the plugin, before
# criu stops it, saying why (its GPU memory is mapped from the driver, which
# pre-dump cannot handle); the process runs on with its gate open. A process
# without libphos.so is left to criu (the plugin answers -ENOTSUP).
source "$(dirname "$0")/lib.sh"

start_workload --preload
wait_counter_above 5
if criu_limit "$CRIU" pre-dump -t "$WORKLOAD_PID" -D "$IMG" --lib "$PLUGIN_DIR" -v4 -o "$WORK/pre-dump.log" 2>"$WORK/pre-dump.err"; then
  fail "criu pre-dump of a process under phos succeeded"
fi
grep -q "phos: Error: process $WORKLOAD_PID runs under phos: criu pre-dump of its GPU state is not supported" "$WORK/pre-dump.log" ||
  fail "the pre-dump log does not say why: $(grep -m1 -o 'Error.*' "$WORK/pre-dump.log")"
at=$(state_counter)
wait_counter_above $((at + 5))
"$PHOSCTL" status "$WORKLOAD_PID" | grep -q "gate: open" || fail "gate not open after the refused pre-dump"
say "pre-dump refused: $(grep -m1 -o 'phos: Error: .*' "$WORK/pre-dump.log" | cut -c1-90)...; the process counts on ($at -> $(state_counter))"
kill -9 "$WORKLOAD_PID"; wait_pid_free

# Not ours: the plugin stays out of it (criu decides alone; on a kernel
# without soft-dirty tracking criu's own pre-dump then fails, a BUG_ON in
# its memory tracking: the exit status is criu's).
start_workload
wait_counter_above 5
rm -rf "$IMG"/*
rc=0
criu_limit "$CRIU" pre-dump -t "$WORKLOAD_PID" -D "$IMG" --lib "$PLUGIN_DIR" -v4 -o "$WORK/pre-dump-plain.log" 2>"$WORK/pre-dump-plain.err" || rc=$?
grep -q "plugin: .phos' hook" "$WORK/pre-dump-plain.log" || fail "the plugin was not asked about the plain process"
! grep -q "phos: Error" "$WORK/pre-dump-plain.log" || fail "phos refused a process that is not its own: $(grep -m1 'phos: Error' "$WORK/pre-dump-plain.log")"
say "a process without libphos.so: no phos error (criu's pre-dump exit status $rc)"
say "PASS"
