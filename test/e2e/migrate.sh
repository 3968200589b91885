#!/usr/bin/env bash
# Migration (migrate_to, `phosctl migrate`) through real criu, of processes
# with libphos.so and no device memory (CI has no GPU; the GPU suite's
# migrate cases move memory): the image keeps no GPU data file, phos-keeper
# keeps the process's (here: empty) memory past the dump and serves it to
# the restore, then exits; a keeper that no restore comes to writes what it
# keeps into the image directory (migrate_keep_s, SIGTERM); a restore whose
# keeper is gone is refused before a process exists; a dump that would leave
# the source running is refused and the source runs on; a restore killed
# after it took the memory leaves it kept for the next.
source "$(dirname "$0")/lib.sh"

migration_of() { "$PHOSCTL" show --json "$IMG" | python3 -c 'import json,sys; print(json.load(sys.stdin)["images"][0]["kept"]["migration"])'; }
fresh_img() { rm -rf "$IMG"; mkdir -p "$IMG"; }
# A fresh image directory and a fresh counting workload with libphos (ARGS:
# the workload's).
fresh_workload() { fresh_img; wait_pid_free; start_workload --preload "$@"; wait_counter_above 5; token=$(state_token); }

# 1. phosctl migrate: dump and restore, the keeper in between.
wait_no_keeper
start_workload --preload
wait_counter_above 5
token=$(state_token)
out=$("$PHOSCTL" migrate "$WORKLOAD_PID" --to 0 --dir "$IMG" --lib "$PLUGIN_DIR" --criu "$CRIU" 2>&1) ||
  { cp "$IMG"/*.log "$WORK"/ 2>/dev/null; fail "phosctl migrate failed: $out"; }
cp "$IMG"/*.log "$WORK"/ 2>/dev/null || true
say "$out"
grep -q "^migrated process $WORKLOAD_PID to GPU 0: now process [0-9]*; dump .* downtime .* ms$" <<<"$out" ||
  fail "phosctl migrate printed no summary"
grep -q "migrate_to=0 " "$IMG/migrate-dump.log" || fail "the dump did not run with migrate_to=0"
grep -q "phos: process $WORKLOAD_PID: migration [0-9a-f]\{16\}: no device memory to move" "$IMG/migrate-dump.log" ||
  fail "the dump log does not name the migration"
grep -q "its GPU memory stays with phos-keeper (migration" "$IMG/migrate-dump.log" ||
  fail "the dump did not commit the kept memory"
grep -q "migration [0-9a-f]\{16\}: 0 allocations (0.0 MiB) taken from phos-keeper" "$IMG/migrate-restore.log" ||
  fail "the restore did not take the kept memory"
"$PHOSCTL" show "$IMG" | tee "$WORK/show.txt"
grep -q "format v3" "$WORK/show.txt" || fail "a migration's manifest is not format version 3"
grep -q "migration [0-9a-f]\{16\}: the GPU data is in no file; phos-keeper keeps it" "$WORK/show.txt" ||
  fail "phosctl show does not say where the data went"
"$PHOSCTL" verify "$IMG" | grep -q "with phos-keeper (migration" || fail "phosctl verify does not say where the data is"
ls "$IMG"/phos-*-data-*.img 2>/dev/null && fail "a migration wrote GPU data files"
grep -q "process 1 restored with its kept memory; let go" "$IMG/phos-keeper.log" || fail "the keeper did not hear Taken"
wait_no_keeper
pid=$(restored_pid) || fail "no restored process"
gate_opens "$pid" || fail "the restored process's gate is not open"
at=$(state_counter)
wait_counter_above $((at + 10))
[ "$(state_token)" = "$token" ] || fail "token changed across the migration"
say "migrated: pid $WORKLOAD_PID -> $pid, token kept, keeper gone"
kill -9 "$pid"
for _ in $(seq 100); do [ -z "$(workload_pids)" ] && break; sleep 0.05; done

# 2. A tree of two processes (parent and child, both with libphos): one
# keeper keeps both, one restore takes both.
fresh_workload --fork
child_at=$(state_child_counter)
out=$("$PHOSCTL" migrate "$WORKLOAD_PID" --to 0 --dir "$IMG" --lib "$PLUGIN_DIR" --criu "$CRIU" 2>&1) ||
  { cp "$IMG"/*.log "$WORK"/ 2>/dev/null; fail "phosctl migrate of a tree failed: $out"; }
[ "$(ls "$IMG"/phos-*-manifest.img | wc -l)" = 2 ] || fail "not two GPU manifests for the tree"
[ "$(grep -c 'restored with its kept memory; let go' "$IMG/phos-keeper.log")" = 2 ] ||
  fail "the keeper did not hand both processes' memory over: $(tail -n 5 "$IMG/phos-keeper.log")"
wait_no_keeper
pid=$(restored_pid) || fail "no restored tree"
at=$(state_counter)
wait_counter_above $((at + 10))
[ "$(state_child_counter)" -gt "$child_at" ] || fail "the child does not count after the migration"
[ "$(state_token)" = "$token" ] || fail "token changed"
say "a tree of two migrated: both counting, one keeper, both taken"
kill -9 "$pid"
for _ in $(seq 100); do [ -z "$(workload_pids)" ] && break; sleep 0.05; done

# 3. No restore comes: after migrate_keep_s the keeper writes what it keeps
# into the image directory, which then restores without it.
fresh_workload
PHOS_MIGRATE_TO=0 PHOS_MIGRATE_KEEP_S=1 criu_dump || fail "migration dump failed"
for _ in $(seq 100); do grep -q "written into the image directory" "$IMG/phos-keeper.log" 2>/dev/null && break; sleep 0.05; done
grep -q "no restore took it in migrate_keep_s" "$IMG/phos-keeper.log" || fail "the keeper did not time out"
wait_no_keeper
"$PHOSCTL" show --json "$IMG" | python3 -c '
import json, sys
m = json.load(sys.stdin)["images"][0]
assert m["complete"] and "kept" not in m and m["format_version"] == 1, m' || fail "the spilled image is not an ordinary one"
criu_restore || fail "restore of the spilled image failed"
pid=$(restored_pid) || fail "no process restored from the spilled image"
gate_opens "$pid" || fail "gate not open after restoring the spilled image"
[ "$(state_token)" = "$token" ] || fail "token changed"
say "kept memory spilled after migrate_keep_s; the image restored without a keeper"
kill -9 "$pid"
for _ in $(seq 100); do [ -z "$(workload_pids)" ] && break; sleep 0.05; done

# 4. SIGTERM to the keeper: the same.
fresh_workload
PHOS_MIGRATE_TO=0 criu_dump || fail "migration dump failed"
keeper=$(keepers)
[ -n "$keeper" ] || fail "no keeper keeps the migration"
kill -TERM $keeper
wait_no_keeper
grep -q "SIGTERM: writing the kept memory" "$IMG/phos-keeper.log" || fail "the keeper did not spill on SIGTERM"
"$PHOSCTL" show "$IMG" | grep -q "format v1" || fail "the image was not rewritten on SIGTERM"
say "SIGTERM: kept memory written into the image directory"

# 5. The keeper gone (killed): the restore is refused before a process exists.
fresh_workload
PHOS_MIGRATE_TO=0 criu_dump || fail "migration dump failed"
keeper=$(keepers)
kill -KILL $keeper
wait_no_keeper
restore_refused "no phos-keeper serves migration $(migration_of)" "an image whose keeper is gone"
say "keeper gone: restore refused"

# 6. criu killed during the restore, after it took the kept memory (held at
# RESUME_DEVICES_LATE): the keeper that watched the restore ends the
# half-restored process, the migration's keeper keeps the memory, and the
# next restore takes it.
fresh_workload
PHOS_MIGRATE_TO=0 criu_dump || fail "migration dump failed"
mkdir -p "$WORK/as_dumped" && cp -p "$WORK"/state* "$WORK/as_dumped/" 2>/dev/null || true
wait_pid_free
PHOS_FAULT=stall-before-resume criu_restore &
criu_job=$!
for _ in $(seq 300); do grep -q "fault injection (PHOS_FAULT)" "$WORK/restore.log" 2>/dev/null && break; sleep 0.05; done
grep -q "taken from phos-keeper" "$WORK/restore.log" || fail "the restore did not take the kept memory"
criu_pid=$(pgrep -f "^$CRIU restore -D $IMG" | head -n1)
[ -n "$criu_pid" ] || fail "criu not found"
kill -9 "$criu_pid"
wait "$criu_job" 2>/dev/null || true
for _ in $(seq 200); do [ -z "$(workload_pids)" ] && break; sleep 0.05; done
[ -z "$(workload_pids)" ] || fail "the half-restored process runs on"
[ -n "$(keepers)" ] || fail "the migration's keeper is gone with the killed restore"
grep -q "restored with its kept memory" "$IMG/phos-keeper.log" && fail "the keeper let go of memory no process has"
cp -p "$WORK"/as_dumped/* "$WORK/" 2>/dev/null || true
criu_restore || fail "the next restore failed: $(grep -v rlimit "$WORK/restore.log" | grep -m1 Error)"
pid=$(restored_pid) || fail "no process after the next restore"
gate_opens "$pid" || fail "gate not open after the next restore"
[ "$(state_token)" = "$token" ] || fail "the restored process is another one"
grep -q "process 1 restored with its kept memory; let go" "$IMG/phos-keeper.log" || fail "the keeper did not hear Taken"
wait_no_keeper
say "restore killed mid-way: the memory stayed kept; the next restore took it"
kill -9 "$pid"
for _ in $(seq 100); do [ -z "$(workload_pids)" ] && break; sleep 0.05; done

# 7. The image lists memory the keeper does not hold (edited after the
# dump): the restore refused before a process exists; the keeper keeps what
# it has.
fresh_workload
PHOS_MIGRATE_TO=0 criu_dump || fail "migration dump failed"
"$BUILD/test/tools/phos-image-edit" "$IMG" 1 kept-allocation 0x7f0000000000 2097152 >/dev/null || fail "phos-image-edit failed"
wait_pid_free
restore_refused "phos-keeper's kept memory (0 allocations) is not what the image lists (1)" "an image unlike its kept memory"
[ -n "$(keepers)" ] || fail "the keeper let go after a refused restore"
kill -TERM $(keepers)
wait_no_keeper
say "kept memory unlike the image: restore refused, kept"

# 8. A migration that would leave the source running is refused; it runs on.
fresh_workload
if PHOS_MIGRATE_TO=0 criu_dump --leave-running; then fail "a leave-running migration dump succeeded"; fi
grep -q "migrate_to=0: criu leaves the process running (--leave-running), but a migration ends it" "$WORK/dump.log" ||
  fail "the dump log does not say why"
at=$(state_counter)
wait_counter_above $((at + 10))
[ "$(state_token)" = "$token" ] || fail "the source changed"
"$PHOSCTL" status "$WORKLOAD_PID" | grep -q "gate: open" || fail "the source's gate is not open"
wait_no_keeper
say "leave-running migration refused; the source runs on"
say "PASS"
