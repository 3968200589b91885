#!/usr/bin/env bash
# PHOS_SHRINK_DRIVER_STATE=1 through real criu and the plugin, on the fake
# libcuda with real memory (it logs every cuCtxSetLimit to FAKE_CUDA_LOG,
# "limit CTX NAME VALUE"): the dump lowers the workload's context limits
# after phos released its memory; the restored process sets them back to
# the driver's defaults before its gate opens and its checks of its device
# memory pass; a leave-running dump lowers and sets back in the one process.
export PHOS_WORKLOAD=${PHOS_BUILD:?}/test/hooks/checksum_client
export FAKE_CUDA_MEMORY=1 LD_LIBRARY_PATH=$PHOS_BUILD/test/hooks${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PHOS_CHUNK_MIB=1 CRIU_TIMEOUT=60
source "$(dirname "$0")/../e2e/lib.sh"
export PHOS_SHRINK_DRIVER_STATE=1 FAKE_CUDA_LOG=$WORK/fake.log
lowered='limit 1 stack 0|limit 1 printf_fifo 0|limit 1 malloc_heap 0'
set_back='limit 1 stack 1024|limit 1 printf_fifo 1048576|limit 1 malloc_heap 8388608'
# limits: the fake log's limit lines, joined with |.
limits() { grep '^limit' "$WORK/fake.log" | paste -sd'|'; }

start_workload --preload
wait_counter_above 5
criu_dump || fail "criu dump failed: $(criu_errors "$WORK/dump.log")"
[ "$(limits)" = "$lowered" ] || fail "the dump did not lower the limits: $(limits)"
: > "$WORK/fake.log"
restored_ok "restore"
[ "$(limits)" = "$set_back" ] || fail "the restored process did not set its limits back: $(limits)"
echo "[driver_limits_criu] lowered at the dump, set back in the restored process; its memory checks pass"

: > "$WORK/fake.log"
rm -rf "$IMG" && mkdir -p "$IMG"  # a fresh image directory for the second dump
criu_dump --leave-running || fail "leave-running dump failed: $(criu_errors "$WORK/dump.log")"
at=$(state_counter)
wait_counter_above $((at + 20))
[ "$(limits)" = "$lowered|$set_back" ] || fail "the leave-running dump did not lower and set back: $(limits)"
echo "[driver_limits_criu] PASS"
