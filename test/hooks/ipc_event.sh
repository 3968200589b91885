#!/usr/bin/env bash
# An interprocess event recorded again and again for another process to
# wait on each time (ipc_event_client.c), against the fake libcuda with real
# memory, whose host functions stay pending until they return: phos serves
# the event's IPC by completing each record of an interprocess event before
# the record returns.
#   1. the exporter's records (cuEventRecord) return only once the work
#      before them is done; the opener, told after each record, waits on its
#      event and reads what that work wrote
#   2. the other way: the opener's records of its event (cuEventRecordWithFlags)
#      wait the same, and the exporter reads what the opener's work wrote
#   3. records a graph would make when it runs (into a stream capture, an
#      event record node) are refused at the call
#   4. a record beside another thread's capture in global mode (its stream
#      not capturing) waits in relaxed mode: it succeeds and the capture
#      stays valid
#   5. destroyed, the event is forgotten: a plain event that gets its
#      handle again is recorded without a wait; so too after the
#      unversioned cuEventDestroy (cuGetProcAddress below 4000) and after
#      its context's destroy
#   6. the driver saw no interprocess event nor IPC call
set -euo pipefail
BUILD=${PHOS_BUILD:?}
dir=$BUILD/test/hooks
libphos=$BUILD/cuda_hooks/libphos.so
fail() { echo "[ipc_event] FAIL: $*"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

export LD_LIBRARY_PATH=$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
status=0
FAKE_CUDA_MEMORY=1 FAKE_CUDA_LOG=$work/fake.log LD_PRELOAD=$libphos timeout 60 "$dir/ipc_event_client" \
  > "$work/out" 2> "$work/err" || status=$?
sed 's/^/[ipc_event] /' "$work/out"
[ "$status" = 0 ] || fail "the client failed ($status): $(cat "$work/err")"

expected=$(cat <<'LINES'
exporter round 1 record-waited yes read 1 ok
opener round 1 record-waited yes read 101 ok
exporter round 2 record-waited yes read 2 ok
opener round 2 record-waited yes read 102 ok
graph records refused capture 900 node 801 ok
record beside a global capture 0 end 0 ok
plain record-waited no ok
plain after an unversioned destroy record-waited no ok
plain after its context's destroy record-waited no ok
LINES
)
diff <(echo "$expected") "$work/out" || fail "the client's lines differ from the expected ones (above)"
! grep -q "^driver ipc" "$work/fake.log" 2>/dev/null ||
  fail "the driver saw IPC: $(grep '^driver ipc' "$work/fake.log" | sort -u | tr '\n' ' ')"
echo "[ipc_event] PASS"
