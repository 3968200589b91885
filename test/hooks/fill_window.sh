#!/usr/bin/env bash
# An on-demand restore's fill window against the fake libcuda, with the
# engine played by phos-agent-tool (fill-window): once the window is open, a
# memset that overwrites a whole chunk goes on at once (the chunk is taken
# as filled), a read of a chunk not yet filled waits until the engine has
# filled it (its first claim: the urgent list), as does a stream waiting for
# a value there (cuStreamWaitValue32), and a call whose set phos
# does not read waits for the whole fill; the account counts the waits. The
# read is a copy to the host, which a dump's window would count as the
# process's transfer (for its engine to give way to); a fill's table is not
# told: the process waits for the fill, its priority already.
set -euo pipefail
BUILD=${PHOS_BUILD:?}
dir=$BUILD/test/hooks
libphos=$BUILD/cuda_hooks/libphos.so
fail() { echo "[fill_window] FAIL: $*"; exit 1; }
work=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; rm -rf "$work"' EXIT

# check MODE [ARG]: one client, one engine; "read" is a copy to the host, or
# a stream waiting for a value there (wait-value).
check() {
  local mode=$1
  shift
  : > "$work/out"
  rm -f "$work/go"
  LD_PRELOAD=$libphos "$dir/fill_window_client" "$work/go" "$@" > "$work/out" 2>&1 &
  pid=$!
  for _ in $(seq 100); do grep -q '^ready' "$work/out" && break; sleep 0.05; done
  read -r _ _ first _ < <(grep '^ready' "$work/out") || fail "the client did not start: $(cat "$work/out")"
  "$dir/phos-agent-tool" fill-window "$pid" "$work/go" "$hold_ms" > "$work/tool" 2>&1 || fail "phos-agent-tool: $(cat "$work/tool")"
  for _ in $(seq 100); do grep -q '^unknown' "$work/out" && break; sleep 0.05; done
  sed "s/^/[fill_window] $mode: /" "$work/out" "$work/tool"
  read -r _ overwrite_ms overwrite_rc < <(grep '^overwrite' "$work/out") || fail "no overwrite line"
  read -r _ read_ms read_rc < <(grep '^read ' "$work/out") || fail "no read line"
  read -r _ unknown_ms < <(grep '^unknown' "$work/out") || fail "no unknown line"
  # The fake driver has no cuStreamWaitValue32: 500, CUDA_ERROR_NOT_FOUND.
  local read_ok=0; [ "$mode" = wait-value ] && read_ok=500
  [ "$overwrite_rc" = 0 ] && [ "$read_rc" = $read_ok ] || fail "$mode: a call failed (CUresult $overwrite_rc, $read_rc)"
  [ "$overwrite_ms" -lt $((hold_ms / 2)) ] || fail "$mode: the whole-chunk memset waited for the fill ($overwrite_ms ms)"
  [ "$read_ms" -ge $((hold_ms * 3 / 4)) ] || fail "$mode: the read did not wait for its chunk ($read_ms ms)"
  [ "$unknown_ms" -ge $((hold_ms * 3 / 4)) ] || fail "$mode: the call with an unknown set did not wait for the fill ($unknown_ms ms)"
  line=$(grep '^fill:' "$work/tool") || fail "$mode: no account"
  overwritten=$(grep -o 'overwritten=[0-9]*' <<< "$line" | cut -d= -f2)
  waited=$(grep -o 'waited=[0-9]*' <<< "$line" | cut -d= -f2)
  [ "$overwritten" -ge 1 ] || fail "$mode: no chunk taken as overwritten: $line"
  [ "$waited" -ge 2 ] || fail "$mode: the account does not count both waits: $line"
  grep -q ' transfers=0$' <<< "$line" || fail "$mode: the fill table was told of the process's transfers: $line"
  filled=$(grep -o 'filled=0x[0-9a-f]*' <<< "$line" | cut -d= -f2)
  # The read was at the first buffer + 8192, in its first 64 KiB chunk.
  [ "$((filled))" = "$((first))" ] || fail "$mode: the engine's first fill was $filled, not the chunk read at $first + 8192"
  kill $pid 2>/dev/null; wait $pid 2>/dev/null || true
  pid=
  echo "[fill_window] $mode: the overwrite went on in $overwrite_ms ms, the read waited $read_ms ms for its chunk (filled first), the unknown set $unknown_ms ms for the whole fill; $line"
}
hold_ms=400
check read
check wait-value wait-value
echo "[fill_window] PASS: copies, stream waits on a value, whole-chunk overwrites and unknown sets each waited as they must"
