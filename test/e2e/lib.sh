# Shared by the end-to-end tests: real criu (4.2 or later), the real plugin, real
# processes. Each workload runs as init of its own pid namespace, so a restore
# never collides with a pid that is still taken ("Can't fork for N: File
# exists"), and the restored pid inside the namespace is the dumped one.
set -euo pipefail

BUILD=${PHOS_BUILD:?PHOS_BUILD must name the meson build directory}
CRIU=${CRIU:-/usr/local/sbin/criu}
# The workload: the CPU counter, or another program with the same contract
# ("WORKLOAD STATE [ARGS...]", writing "TOKEN COUNTER ..." to STATE).
COUNTER=${PHOS_WORKLOAD:-$BUILD/test/e2e/phos-test-counter}
# A script workload runs under its interpreter (e.g. python3, from PATH).
RUNNER=${PHOS_WORKLOAD_RUNNER:-}
# Every criu run ends within CRIU_TIMEOUT (else PHOS_CRIU_TIMEOUT, else 600)
# seconds; rc 124 if not. Read at each run: a script may set it per case.
criu_limit() { timeout --foreground -k 10 "${CRIU_TIMEOUT:-${PHOS_CRIU_TIMEOUT:-600}}" "$@"; }
PHOSCTL=$BUILD/plugin/phosctl
LIBPHOS=$BUILD/cuda_hooks/libphos.so
TEST_NAME=$(basename "$0" .sh)

say() { echo "[$TEST_NAME] $*"; }
fail() {
  local f  # not `log`: criu_suite.sh's global of that name is where it keeps logs
  say "FAIL: $*"
  for f in "$WORK"/*.log; do
    [ -f "$f" ] || continue
    echo "---- $(basename "$f") (last 25 lines)"
    tail -n 25 "$f"
  done
  exit 1
}

if [ "$(id -u)" -ne 0 ] || [ ! -x "$CRIU" ]; then
  if [ -n "${PHOS_REQUIRE_E2E:-}" ]; then
    echo "[$TEST_NAME] FAIL: needs root and $CRIU (PHOS_REQUIRE_E2E is set)"
    exit 1
  fi
  echo "[$TEST_NAME] SKIP: needs root and $CRIU (contrib/scripts/install-criu.sh)"
  exit 77
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/phos-e2e.XXXXXX")
MATCH="^${RUNNER:+$RUNNER }$COUNTER $WORK/state"  # pgrep -f pattern of our workloads
PLUGIN_DIR=$WORK/plugins   # criu --lib loads every .so in a directory
IMG=$WORK/img
mkdir -p "$PLUGIN_DIR" "$IMG"
ln -s "$BUILD/plugin/phos_plugin.so" "$PLUGIN_DIR/phos_plugin.so"

cleanup() {
  local p
  for p in $(workload_pids); do kill -9 "$p" 2>/dev/null || true; done
  [ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"
}
trap cleanup EXIT

# Pids (in our namespace) of this test's workload processes.
workload_pids() { pgrep -f "$MATCH" || true; }

# start_workload [--preload] [WORKLOAD ARGS...]
start_workload() {
  local env_args=() counter_args=()
  # A state file left by an earlier workload would pass for this one's until
  # it writes its first (its token read too early is another process's).
  rm -f "$WORK/state" "$WORK/state.tmp"
  for a in "$@"; do
    case $a in
      --preload) env_args+=("LD_PRELOAD=$LIBPHOS") ;;
      *) counter_args+=("$a") ;;
    esac
  done
  # unshare stays outside (and reports its child's SIGKILL at dump time on
  # its own output); the workload gets /dev/null, which CRIU restores as is.
  # PHOS_NO_PIDNS=1: no pid namespace (the CUDA driver's fd-exportable memory
  # fails in a pid namespace whose /proc is the host's); the workload is
  # detached so init reaps it, and restores wait until its pid is free.
  local ns=(unshare --pid --fork)
  [ -n "${PHOS_NO_PIDNS:-}" ] && ns=()
  ("${ns[@]}" setsid bash -c 'exec env "$@" </dev/null >/dev/null 2>&1' _ \
     "${env_args[@]}" $RUNNER "$COUNTER" "$WORK/state" "${counter_args[@]}" </dev/null >"$WORK/unshare.out" 2>&1 &)
  WORKLOAD_PID=
  local seen=
  for _ in $(seq 600); do
    WORKLOAD_PID=$(pgrep -o -f "$MATCH" || true)
    [ -n "$WORKLOAD_PID" ] && [ -s "$WORK/state" ] && break
    if [ -n "$WORKLOAD_PID" ]; then seen=1; elif [ -n "$seen" ]; then break; fi  # started, then died
    sleep 0.05
  done
  # Its output went to /dev/null: run it once more, briefly, to say why.
  [ -n "$WORKLOAD_PID" ] || fail "workload did not start: $(timeout 10 env "${env_args[@]}" $RUNNER "$COUNTER" \
    "$WORK/probe" "${counter_args[@]}" </dev/null 2>&1 | tail -n 3 | tr '\n' ' ')"
}

state_token() { cut -d' ' -f1 "$WORK/state"; }
state_counter() { cut -d' ' -f2 "$WORK/state"; }
state_child_counter() { cut -d' ' -f3 "$WORK/state"; }
state_field() { cut -d' ' -f"$1" "$WORK/state"; }

# wait_field_above FILE FIELD N [SECONDS]: the counter in FILE's FIELD (a
# state file: the workload's, or another process's of its tree) passes N in
# time (5 s); status 1 where it does not.
wait_field_above() {
  for _ in $(seq $((${4:-5} * 20))); do
    [ "$(cut -d' ' -f"$2" "$1" 2>/dev/null || echo 0)" -gt "$3" ] 2>/dev/null && return 0
    sleep 0.05
  done
  return 1
}
# wait_counter_above N [SECONDS]: the workload counts past N in time (5 s).
wait_counter_above() {
  wait_field_above "$WORK/state" 2 "$1" "${2:-5}" || fail "counter stuck at $(state_counter 2>/dev/null) (wanted > $1)"
}

# CRIU_NET_ARGS: options every dump and restore of this test takes, for
# workloads with TCP connections (e.g. "--tcp-established --network-lock nftables").
# CRIU_VERBOSITY: criu's log level (4 unless set; phos's lines need 3).
criu_dump() {
  local try rc
  for try in 1 2 3 4 5; do
    # shellcheck disable=SC2086 # CRIU_NET_ARGS is a list of words
    criu_limit "$CRIU" dump -t "$WORKLOAD_PID" -D "$IMG" --lib "$PLUGIN_DIR" "-v${CRIU_VERBOSITY:-4}" -o "$WORK/dump.log" ${CRIU_NET_ARGS:-} "$@" \
      2>"$WORK/dump.err"
    rc=$?
    # A leave-running dump whose freeze caught the workload between opening
    # a state file's .tmp and renaming it holds that path open; the
    # original renames it right after, and a later restore of the image
    # cannot open it (the workloads keep no other file open). Dumped again.
    # Every state file: a tree's other processes write their own beside it
    # (state.importer, ipc_cow_criu).
    [ $rc -eq 0 ] && [[ " $* " == *" --leave-running "* ]] &&
      grep -q "Dumping path for [0-9]* fd via self [0-9]* \[$WORK/state[^]/]*\.tmp\]" "$WORK/dump.log" || return $rc
    say "the leave-running dump caught the state file open (try $try): dumped again"
  done
  return $rc
}
# Without a pid namespace the restored pid is the dumped one: wait (5 s at
# most) until the dumped process is reaped. Call it before timing a restore.
# In a pid namespace too: a workload started next must not find the dying
# one (start_workload takes the oldest process that matches).
wait_pid_free() {
  if [ -n "${WORKLOAD_PID:-}" ]; then
    for _ in $(seq 100); do [ -e "/proc/$WORKLOAD_PID" ] || break; sleep 0.05; done
  fi
}
criu_restore() {
  wait_pid_free
  # shellcheck disable=SC2086
  criu_limit "$CRIU" restore -D "$IMG" --lib "$PLUGIN_DIR" -d -v4 -o "$WORK/restore.log" ${CRIU_NET_ARGS:-} "$@" \
    2>"$WORK/restore.err"
}
# restore_refused PATTERN WHAT: criu restore fails (WHAT: the image, for the
# message), its log says PATTERN, and no workload runs after it.
restore_refused() {
  if criu_restore; then fail "restore succeeded from $2"; fi
  grep -q -- "$1" "$WORK/restore.log" || fail "restore log does not say '$1'"
  sleep 0.3
  [ -z "$(workload_pids)" ] || fail "a process runs after the refused restore"
}
# The pid of the restored root process, once it runs.
restored_pid() {
  for _ in $(seq 100); do
    local p
    p=$(pgrep -o -f "$MATCH" || true)
    [ -n "$p" ] && { echo "$p"; return 0; }
    sleep 0.05
  done
  return 1
}
# gate_opens PID: the agent of PID says its gate is open within 10 s.
gate_opens() {
  for _ in $(seq 100); do
    "$PHOSCTL" status "$1" 2>/dev/null | grep -q "gate: open" && return 0
    sleep 0.1
  done
  return 1
}
# criu_errors LOG: criu's errors in LOG, on one line (not the RLIMIT_NOFILE
# one, which criu logs and carries on after where setrlimit is refused).
# restored_ok WHAT: for workloads whose state's third field is their own
# memory check ("ok", or what they found wrong): the image restores and the
# program's checks pass for 20 more steps; WORKLOAD_PID is then the
# restored process.
restored_ok() {
  local at pid
  kill -9 "$WORKLOAD_PID" 2>/dev/null || true
  wait_pid_free
  criu_restore || fail "$1: criu restore failed: $(criu_errors "$WORK/restore.log")"
  pid=$(restored_pid) || fail "$1: no restored process"
  at=$(state_counter)
  wait_counter_above $((at + 20))
  [ "$(state_field 3)" = ok ] || fail "$1: the restored program found its memory wrong: $(state_field 3)"
  WORKLOAD_PID=$pid
}
criu_errors() { grep 'Error' "$1" | grep -v 'RLIMIT_NOFILE' | head -n 3 | tr '\n' ' '; }
# criu_pages LOG: how the patched criu moved the tasks' private pages, on one
# line without commas (empty with another criu): "copied 1.71 GB with 8
# threads in 0.21 s, written after the resume in 0.80 s" where the tasks ran
# on once their pages were copied (contrib/criu/0005-*), else "written 1.71
# GB with 8 threads in 0.75 s" (0002-*, the tasks frozen until then).
criu_pages() {
  local line
  line=$(grep -o "Copied [0-9]* bytes of pages of [0-9]* tasks in [0-9.]* s with [0-9]* threads.*wrote them in [0-9.]* s" "$1" | tail -n1)
  if [ -n "$line" ]; then
    sed -E 's/^Copied ([0-9]+) bytes of pages of ([0-9]+) tasks in ([0-9.]+) s with ([0-9]+) threads.*wrote them in ([0-9.]+) s/\1 \2 \3 \4 \5/' <<<"$line" |
      awk '{printf "copied %.2f GB of %d tasks with %d threads in %s s, written after the resume in %s s\n", $1 / 1e9, $2, $4, $3, $5}'
    return 0
  fi
  line=$(grep -o "Wrote [0-9]* bytes of pages of [0-9]* tasks with [0-9]* threads in [0-9.]* s" "$1" | tail -n1)
  [ -n "$line" ] || return 0
  awk '{printf "written %.2f GB of %d tasks with %d threads in %s s\n", $2 / 1e9, $7, $10, $13}' <<<"$line"
}
# This test's phos-keepers (a migration's, between its dump and restore):
# those holding $IMG as their image directory (fd 4), not another test's;
# and a wait (5 s at most) until none runs.
keepers() {
  local p
  for p in $(pgrep -f "phos-keeper --detach"); do
    case $(readlink "/proc/$p/fd/4" 2>/dev/null) in "$IMG" | "$IMG (deleted)") echo "$p" ;; esac
  done
}
wait_no_keeper() {
  for _ in $(seq 100); do [ -z "$(keepers)" ] && return 0; sleep 0.05; done
  fail "phos-keeper still runs: $(keepers)"
}
# CRIU copies its log into the image directory; the work dir keeps ours.
cp_img_logs() { cp "$IMG"/*.log "$WORK"/ 2>/dev/null || true; }
# wait_line LOG PATTERN [COUNT [SECONDS]]: LOG has COUNT (1) lines matching
# PATTERN (grep) within SECONDS (20), else fail (with LOG's last lines).
wait_line() {
  for _ in $(seq $((${4:-20} * 20))); do
    [ "$(grep -c -- "$2" "$1" 2>/dev/null)" -ge "${3:-1}" ] && return 0
    sleep 0.05
  done
  fail "$(basename "$1") has no '$2' (x${3:-1}): $(tail -n 5 "$1" | tr '\n' '|')"
}
