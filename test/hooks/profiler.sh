#!/usr/bin/env bash
# CUPTI or a profiler in the process makes the driver's checkpoint refuse
# it: the agent reports it among the unsupported calls (so a dump is refused
# up front, with that name) when CUDA_INJECTION64_PATH is set, and not
# otherwise; libcupti merely loaded is not reported (the driver checkpoints
# such a process until CUPTI is subscribed).
set -euo pipefail
BUILD=${PHOS_BUILD:?}
dir=$BUILD/test/hooks
libphos=$BUILD/cuda_hooks/libphos.so
fail() { echo "[profiler] FAIL: $*"; exit 1; }
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; true' EXIT

# The unsupported calls the agent of a waiting peer_client reports, one per line.
unsupported() {
  exec 3< <(env "$@" FAKE_CUDA_LOG=/dev/null "$dir/peer_client" wait)
  local line=
  until [ "${line%% *}" = ready ]; do read -r -t 10 line <&3 || fail "the client did not get ready"; done
  pid=${line#ready }
  "$BUILD/plugin/phosctl" status "$pid" --json | python3 -c 'import json, sys; print("\n".join(json.load(sys.stdin)["unsupported_calls"]))'
  kill "$pid"
  pid=
}

none=$(unsupported LD_PRELOAD="$libphos")
[ -z "$none" ] || fail "reported without a profiler: $none"
cupti=$(unsupported LD_PRELOAD="$libphos $dir/libcupti.so.13")
[ -z "$cupti" ] || fail "libcupti loaded (not subscribed) reported: $cupti"
injected=$(unsupported LD_PRELOAD="$libphos" CUDA_INJECTION64_PATH=/opt/nsight/libToolsInjection64.so)
echo "[profiler] $injected"
[ "$injected" = "CUPTI/profiler attached (CUDA_INJECTION64_PATH=/opt/nsight/libToolsInjection64.so)" ] ||
  fail "the injection library not reported: $injected"
echo "[profiler] PASS"
