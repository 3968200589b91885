# Sourced by driver_limits.sh and slow_calls.sh: one checkpoint round trip
# (gate closed, memory released with its handles, mapped back, gate open)
# of gate_open_client under libphos.so. Needs BUILD and fail(); makes
# $work, a directory removed at exit; sets and clears $pid.
dir=$BUILD/test/hooks
libphos=$BUILD/cuda_hooks/libphos.so
pid=
work=$(mktemp -d)
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; rm -rf "$work"' EXIT
# round ENV...: the client with ENV; the fake's log in $work/log, the
# client's output in $work/out and stderr in $work/err, the tool's output
# in $work/tool.
round() {
  : > "$work/log"
  rm -f "$work/in"; mkfifo "$work/in"
  env "$@" FAKE_CUDA_LOG="$work/log" LD_PRELOAD="$libphos" "$dir/gate_open_client" < "$work/in" > "$work/out" 2> "$work/err" &
  pid=$!
  exec 4> "$work/in"
  local i
  for i in $(seq 100); do grep -q '^ready' "$work/out" && break; sleep 0.1; done
  grep -q '^ready' "$work/out" || fail "the client did not get ready: $(cat "$work/err")"
  "$dir/phos-agent-tool" roundtrip "$pid" --release-handles > "$work/tool" 2>&1 || fail "round trip failed: $(cat "$work/tool")"
  echo go >&4
  exec 4>&-
  wait "$pid" || fail "the client failed: $(cat "$work/err")"
  pid=
}
