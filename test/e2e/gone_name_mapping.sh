#!/usr/bin/env bash
# A shared mapping of a file whose name is gone but which is still linked
# under another name (glibc's sem_open() leaves a POSIX semaphore so, and
# torch.multiprocessing maps such semaphores: issue 31), with criu patched by
# contrib/criu/0004-*:
#   1. criu dump --leave-running --link-remap: the file is dumped as a ghost
#      (a link remap would be deleted as the dump ends, and the image refer to
#      a file that is gone); the child's mapping and fd of the same inode by
#      its other name are restored from the ghost too. With the original killed,
#      the image restores; the restored pair carries on from the dumped
#      counter, shares one copy, and that copy is not the inode still linked
#      under the final name, which stays as the original left it.
#   2. The same without --link-remap.
#   3. Above --ghost-limit, the leave-running dump fails, naming the file and
#      the limit, and the process runs on.
#   4. A stopped dump with --link-remap still uses a link remap: the restored
#      process maps the inode under the final name again (unchanged).
export PHOS_WORKLOAD=${PHOS_BUILD:?}/test/e2e/phos-test-gone-name
source "$(dirname "$0")/lib.sh"

FINAL=/dev/shm/phos-e2e-gone-name.${WORK##*.}
BYTES=65536
trap 'rm -f "$FINAL" "$FINAL".*; cleanup' EXIT

peer_counter() { state_field 3; }     # the child's, through its mapping of the final name
peer_fd_counter() { state_field 4; }  # the child's, through its fd of the final name
# The counter in the first word of the file under the final name.
final_counter() { od -An -t u8 -N 8 "$FINAL" | tr -d ' '; }
# mapping_inodes PID: the inodes of PID's mappings in /dev/shm: the file's,
# by whichever name (a ghost's or a link remap's after a restore).
mapping_inodes() { grep -F " /dev/shm/" "/proc/$1/maps" | awk '{print $5}' | sort -u; }
kill_tree() {
  local p
  for p in $(workload_pids); do kill -9 "$p" 2>/dev/null || true; done
  for _ in $(seq 100); do [ -z "$(workload_pids)" ] && break; sleep 0.05; done
  [ -z "$(workload_pids)" ] || fail "the workload survived kill -9"
}
fresh() {  # a new workload (with the child): the file made anew
  rm -rf "${IMG:?}"/* && rm -f "$FINAL" "$FINAL".*
  start_workload "$FINAL" $BYTES --child
  wait_counter_above 5
  wait_field_above "$WORK/state" 3 5 || fail "the child does not count in the shared file"
}

# leave_running_then_restore LABEL [DUMP OPTIONS]
leave_running_then_restore() {
  local label=$1 at kept pid first final_ino
  shift
  fresh
  local token; token=$(state_token)
  criu_dump --leave-running "$@" || fail "$label: criu dump failed: $(criu_errors "$WORK/dump.log")"
  grep -q "Dumping $FINAL\.[^ ]* as a ghost file: its path is gone" "$WORK/dump.log" ||
    fail "$label: the dump log says no ghost for the gone name"
  grep -q "$FINAL is the inode of ghost file 0x[0-9a-f]*: restoring it from the ghost too" "$WORK/dump.log" ||
    fail "$label: the child's fd of the final name is not tied to the ghost"
  grep -q "link_remap" "$WORK/dump.log" && fail "$label: the dump made a link remap"
  at=$(state_counter)
  wait_counter_above $((at + 40))
  kill_tree
  kept=$(final_counter)
  [ "$kept" -gt $((at + 30)) ] || fail "$label: the file under the final name holds $kept, not the original's count past $at"

  criu_restore || fail "$label: criu restore failed: $(criu_errors "$WORK/restore.log")"
  pid=$(restored_pid) || fail "$label: no restored process"
  grep -q "Opening ghost file" "$WORK/restore.log" || fail "$label: the restore log opens no ghost file"
  first=$(state_counter)
  [ "$(state_token)" = "$token" ] || fail "$label: token changed"
  # The mapping holds what was dumped: the count goes on from the dump's, not from the original's last.
  [ "$first" -lt "$kept" ] || fail "$label: the restored count starts at $first, not below the original's last $kept"
  wait_counter_above $((first + 20))
  local peer peer_fd; peer=$(peer_counter) peer_fd=$(peer_fd_counter)
  wait_counter_above $((first + 40))
  [ "$(peer_counter)" -gt "$peer" ] || fail "$label: the restored child's mapping is not the parent's (one copy for both)"
  [ "$(peer_fd_counter)" -gt "$peer_fd" ] || fail "$label: the restored child's fd is not on the parent's copy"
  [ "$(state_field 5)" = ok ] || fail "$label: the restored file's contents changed: $(state_field 5)"
  [ "$(final_counter)" = "$kept" ] || fail "$label: the restored pair writes into the file under the final name ($kept -> $(final_counter))"
  final_ino=$(stat -c %i "$FINAL")
  local inos; inos=$(for p in $(workload_pids); do mapping_inodes "$p"; done | sort -u)
  [ "$(echo "$inos" | wc -l)" = 1 ] || fail "$label: the restored processes map different inodes: $(echo "$inos" | paste -sd" " -)"
  [ "$inos" != "$final_ino" ] || fail "$label: the restored mapping is the inode under the final name ($final_ino)"
  say "$label: dumped as a ghost, restored: count $first (dumped near $at; the original reached $kept), the child's mapping and fd and the parent's mapping on one copy (inode $inos, not the final name's $final_ino)"
  kill_tree
}

leave_running_then_restore "leave-running, --link-remap" --link-remap
leave_running_then_restore "leave-running, no --link-remap"

# 3. Above the ghost limit: refused by name, the process runs on.
fresh
if criu_dump --leave-running --link-remap --ghost-limit 16K; then fail "ghost limit: the dump of a 64 KiB ghost under a 16 KiB limit succeeded"; fi
grep -q "Can't dump $FINAL\.[^ ]*: its path is gone .* exceed the ghost limit of 16384 bytes (--ghost-limit)" "$WORK/dump.log" ||
  fail "ghost limit: the dump log does not name the file and the limit: $(criu_errors "$WORK/dump.log")"
at=$(state_counter)
wait_counter_above $((at + 5))
say "ghost limit: refused ($(grep -o "Can't dump ${FINAL}[^:]*" "$WORK/dump.log")), the process runs on"
kill_tree

# 4. A stopped dump keeps its link remap: the restore maps the final name's inode again.
fresh
criu_dump --link-remap || fail "stopped dump: criu dump failed: $(criu_errors "$WORK/dump.log")"
grep -q "as a ghost file" "$WORK/dump.log" && fail "stopped dump: dumped as a ghost, not with a link remap"
at=$(final_counter)
criu_restore --link-remap || fail "stopped dump: criu restore failed: $(criu_errors "$WORK/restore.log")"
pid=$(restored_pid) || fail "stopped dump: no restored process"
grep -q "Remapped ${FINAL#/}\.[^ ]* -> .*link_remap" "$WORK/restore.log" || fail "stopped dump: the restore used no link remap"
wait_counter_above $((at + 10))
[ "$(final_counter)" -gt "$at" ] || fail "stopped dump: the restored process does not count in the file under the final name"
[ "$(mapping_inodes "$pid")" = "$(stat -c %i "$FINAL")" ] || fail "stopped dump: the restored mapping is not the final name's inode"
say "stopped dump: link remap as before, the restored process maps the final name's inode $(stat -c %i "$FINAL")"
say "PASS"
