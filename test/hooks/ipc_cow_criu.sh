#!/usr/bin/env bash
# Copy-on-write of two processes that share device memory through phos's
# CUDA IPC, through real criu dumps of their tree, on the fake libcuda with
# real memory (FAKE_CUDA_MEMORY=1). The workload (ipc_cow_client.c): the
# owner shares S (8 MiB) with its child, the importer; each writes its own
# memory (A, B: 2 MiB) and its half of S every step (memsets; the
# importer's kernel's speculated set is its half of S), and checks after every call a
# dump can freeze it at that the memory holds what it held before, so a
# restored image holding a write made after its freeze fails.
#   1. a leave-running dump with copy_on_write=always: both processes get
#      copy-on-write (no 'no copy-on-write'); S is copied while both are
#      stopped, by its owner, checked against the freeze, and left out of
#      the window; both processes write S and their own memory while their
#      windows are open: their own memory is saved into the pools, S never;
#      the image completes, S stored once (in the owner's image, the
#      importer's names its mapping)
#   2. the image restores: S mapped into both, both processes' checks pass
#      (the freeze's content of S and of their own memory) and they run on
#   3. a dump that stops the restored pair: soft recopy for both, each of
#      its own memory; the owner's final pass, by checksum once both are
#      stopped, copies again what the importer wrote in S after its first
#      pass (no hook of the owner marked it); restored, the checks pass
#   4. the same with cow_trust=speculated: the owner's recopy refused by
#      name (its memory copied stopped), the importer's goes on; restored
#   5. a new pair, copy-on-write with cow_start=pause (copies start at the
#      pause, not at the give-back): the importer's copy waits until the owner has
#      copied S stopped (one copy at a time: the other order would hold the
#      owner's plan, and so the whole tree's stall, behind the importer's
#      copy)
#   6. a new pair whose importer has S's handle before the dump but opens it
#      only after the give-back, while the owner's window is still open (one
#      engine worker, slow copies): no hook of the owner sees the
#      importer's writes, so the open itself pushes S through the owner's
#      window (saved into its pool); the image is not refused, and restored,
#      the importer finds its half of S as the freeze left it (unwritten)
export PHOS_WORKLOAD=${PHOS_BUILD:?}/test/hooks/ipc_cow_client
export FAKE_CUDA_MEMORY=1 LD_LIBRARY_PATH=$PHOS_BUILD/test/hooks${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PHOS_RECOPY_MIN_MIB=0 PHOS_CHUNK_MIB=1 PHOS_COW_POOL_MIB=64 PHOS_FAULT=slow-copy CRIU_TIMEOUT=60
source "$(dirname "$0")/../e2e/lib.sh"

importer_field() { cut -d' ' -f"$1" "$WORK/state.importer" 2>/dev/null || echo 0; }
# both_ok WHAT: both processes count on, and their checks pass.
both_ok() {
  local at imp
  at=$(state_counter)
  imp=$(importer_field 1)
  wait_counter_above $((at + 20)) 10
  [ "$(state_field 3)" = ok ] || fail "$1: the owner found its memory wrong: $(state_field 3)"
  wait_field_above "$WORK/state.importer" 1 $((imp + 20)) || fail "$1: the importer does not count on (at $(importer_field 1))"
  [ "$(importer_field 2)" = ok ] || fail "$1: the importer found its memory wrong: $(importer_field 2)"
}

# restore_both WHAT: the pair killed (if still there), the image restored,
# S mapped into the importer again, both count on with their checks passing.
restore_both() {
  for p in $(workload_pids); do kill -9 "$p" 2>/dev/null || true; done
  wait_pid_free
  rm -f "$WORK/state.importer"  # the restored importer's lines only
  criu_restore || fail "$1: criu restore failed: $(criu_errors "$WORK/restore.log")"
  WORKLOAD_PID=$(restored_pid) || fail "$1: no restored process"
  grep -q "mapped again at 0x[0-9a-f]* through CUDA IPC" "$WORK/restore.log" ||
    fail "$1: the restore does not say it mapped S into the importer"
  both_ok "$1"
}

start_workload --preload
wait_counter_above 5 10
for _ in $(seq 100); do [ -s "$WORK/state.importer" ] && break; sleep 0.05; done
both_ok "before the dump"

# 1. Copy-on-write for both.
PHOS_COPY_ON_WRITE=always criu_dump --leave-running ||
  fail "copy-on-write: criu dump failed: $(criu_errors "$WORK/dump.log")"
! grep -q "no copy-on-write" "$WORK/dump.log" ||
  fail "copy-on-write refused: $(grep -o 'no copy-on-write.*' "$WORK/dump.log" | head -n1)"
opened=$(grep -o "process [0-9]*: copy window opened" "$WORK/dump.log" | sort -u | wc -l)
[ "$opened" = 2 ] || fail "copy-on-write: $opened processes opened a copy window (2 expected): $(grep -o 'phos: process [0-9]*: .*\(window\|copy-on-write\).*' "$WORK/dump.log" | head -n4)"
stopped=$(grep -o "8 chunks (8.0 MiB) of 1 allocation(s) other processes map through CUDA IPC copied while they are stopped" "$WORK/dump.log") ||
  fail "the owner did not copy S while the processes were stopped: $(grep -o 'phos: process [0-9]*: .*CUDA IPC.*' "$WORK/dump.log" | head -n3)"
markers=$(find "$IMG" -name 'phos-*-complete.img' | wc -l)
[ "$markers" = 2 ] || fail "copy-on-write: $markers completion markers (2 expected, one per process)"
equal=$(grep -o "checksum: [0-9]* chunks equal to the freeze" "$WORK/dump.log" | paste -sd, -)
# The owner's S (8 chunks, copied while stopped) and A (2); the importer's B (2).
grep -q "checksum: 10 chunks equal to the freeze" "$WORK/dump.log" && grep -q "checksum: 2 chunks equal to the freeze" "$WORK/dump.log" ||
  fail "copy-on-write: the copies were not all checked against the freeze: $equal"
"$PHOSCTL" show --json "$IMG" > "$WORK/show.json" || fail "phosctl show failed"
python3 - "$WORK/show.json" <<'PY' || fail "the image is not what copy-on-write of both should give (phosctl show --json above)"
import json, sys
images = json.load(open(sys.argv[1]))["images"]
mib = 1 << 20
owner = [i for i in images if i["pid"] == 1][0]
importer = [i for i in images if i["pid"] != 1][0]
for who, i in (("owner", owner), ("importer", importer)):
    assert i["protocol"] == "soft-copy-on-write", (who, i["protocol"])
assert sorted(a["size"] for a in owner["allocations"]) == [2 * mib, 8 * mib], owner["allocations"]   # A and S
assert [a["size"] for a in importer["allocations"]] == [2 * mib], importer["allocations"]          # B only
m = importer["ipc_mappings"]
assert len(m) == 1 and m[0]["owner_pid"] == 1 and m[0]["size"] == 8 * mib, m
so, si = owner["statistics"], importer["statistics"]
assert so["ipc_stopped_bytes"] == 8 * mib and si["ipc_stopped_bytes"] == 0, (so["ipc_stopped_bytes"], si["ipc_stopped_bytes"])
# Both wrote their own memory while their windows were open (saved into
# their pools) and S, which nothing saved: at most their own 2 chunks each.
for who, s in (("owner", so), ("importer", si)):
    assert 1 * mib <= s["cow_saved_bytes"] <= 2 * mib, (who, "saved", s["cow_saved_bytes"])
print(f"[ipc_cow_criu] owner: S {so['ipc_stopped_bytes'] // mib} MiB copied stopped, {so['cow_saved_bytes'] // mib} MiB "
      f"of A saved; importer: {si['cow_saved_bytes'] // mib} MiB of B saved, S mapped from #{m[0]['owner_allocation']}")
PY
both_ok "after the leave-running dump"
say "1. copy-on-write of both: $stopped; $equal"

# 2. Restored: S mapped into both, the freeze's content.
restore_both "after the copy-on-write dump's restore"
say "2. restored: S mapped into both, both processes' checks of S and of their own memory pass"

# 3. A dump that stops them: soft recopy for both, the owner's by checksum.
rm -rf "${IMG:?}"/*
criu_dump || fail "recopy: criu dump failed: $(criu_errors "$WORK/dump.log")"
! grep -q "no soft recopy" "$WORK/dump.log" || fail "recopy refused: $(grep -o 'no soft recopy.*' "$WORK/dump.log" | head -n1)"
recopied=$(grep -o "process [0-9]*: soft recopy: gate reopened" "$WORK/dump.log" | sort -u | wc -l)
[ "$recopied" = 2 ] || fail "recopy: $recopied processes had a first pass (2 expected): $(grep -o 'phos: process [0-9]*: .*recopy.*' "$WORK/dump.log" | head -n4)"
final=$(grep -o "process 1: checksum: the final pass copies [0-9]* of [0-9]* chunks: [0-9]* not copied yet, [0-9]* changed since their copy ([0-9]* of them without a dirty mark" "$WORK/dump.log") ||
  fail "recopy: the owner's final pass did not go by checksum: $(grep -o 'phos: process 1: .*final pass.*' "$WORK/dump.log" | head -n2)"
"$PHOSCTL" show --json "$IMG" > "$WORK/show.json" || fail "phosctl show failed"
python3 - "$WORK/show.json" <<'PY' || fail "the image is not what recopy of both should give (phosctl show --json above)"
import json, sys
images = json.load(open(sys.argv[1]))["images"]
owner = [i for i in images if i["pid"] == 1][0]
importer = [i for i in images if i["pid"] != 1][0]
for who, i in (("owner", owner), ("importer", importer)):
    assert i["protocol"] == "soft-recopy", (who, i["protocol"])
assert len(owner["allocations"]) == 2 and len(importer["allocations"]) == 1, "S stored once"
# The importer wrote its half of S after the owner's first pass copied it:
# no hook of the owner marked it, its fingerprint found it.
assert owner["statistics"]["sum_missed_chunks"] >= 1, owner["statistics"]["sum_missed_chunks"]
PY
restore_both "after the recopy dump's restore"
say "3. soft recopy of both (the restored pair), the owner's $final); restored, both processes' checks pass"

# 4. The same with cow_trust=speculated: the owner's memory that the importer
# writes would change behind its marks: the owner is copied stopped, the
# importer (its own memory only) still gets recopy.
rm -rf "${IMG:?}"/*
PHOS_COW_TRUST=speculated criu_dump || fail "speculated: criu dump failed: $(criu_errors "$WORK/dump.log")"
why=$(grep -o "process [0-9]*: no soft recopy (other processes map its device memory through CUDA IPC and their writes mark no chunk dirty: only cow_trust=checksum finds them, by fingerprint)" "$WORK/dump.log") ||
  fail "speculated: the owner's recopy was not refused by name: $(grep -o 'phos: process [0-9]*: .*recopy.*' "$WORK/dump.log" | head -n3)"
recopied=$(grep -o "process [0-9]*: soft recopy: gate reopened" "$WORK/dump.log" | sort -u | wc -l)
[ "$recopied" = 1 ] || fail "speculated: $recopied processes had a first pass (the importer's alone expected)"
restore_both "after the speculated dump's restore"
say "4. cow_trust=speculated: $why; the importer recopied; restored, both processes' checks pass"

# 5. cow_start=pause: the owner's stopped copy before the importer's copy
# (a new pair: criu 4.2.1 fails a leave-running dump of the restored one in
# its time namespace).
for p in $(workload_pids); do kill -9 "$p" 2>/dev/null || true; done
wait_pid_free
rm -rf "${IMG:?}"/* "$WORK/state.importer"
start_workload --preload
wait_counter_above 5 10
for _ in $(seq 100); do [ -s "$WORK/state.importer" ] && break; sleep 0.05; done
PHOS_COPY_ON_WRITE=always PHOS_COW_START=pause criu_dump --leave-running ||
  fail "cow_start=pause: criu dump failed: $(criu_errors "$WORK/dump.log")"
stopped_at=$(grep -n "of 1 allocation(s) other processes map through CUDA IPC copied while they are stopped" "$WORK/dump.log" | cut -d: -f1)
importer_at=$(grep -n "checksum: 2 chunks equal to the freeze" "$WORK/dump.log" | cut -d: -f1)
[ -n "$stopped_at" ] && [ -n "$importer_at" ] ||
  fail "cow_start=pause: no stopped copy of S ($stopped_at) or no checked copy of the importer's B ($importer_at)"
[ "$stopped_at" -lt "$importer_at" ] ||
  fail "cow_start=pause: the importer's copy (log line $importer_at) went before the owner's stopped copy of S (line $stopped_at)"
both_ok "cow_start=pause: after the leave-running dump"
say "5. cow_start=pause: the owner's stopped copy of S (log line $stopped_at) before the importer's copy (line $importer_at)"

# 6. S's handle sent before the dump, opened and written only after its
# give-back, while the owner's window is open.
for p in $(workload_pids); do kill -9 "$p" 2>/dev/null || true; done
wait_pid_free
# The last dump's log would say its windows opened before this one's does.
rm -rf "${IMG:?}"/* "$WORK/state.importer" "$WORK/open" "$WORK/dump.log"
export IPC_COW_OPEN_AFTER=$WORK/open
start_workload --preload
wait_counter_above 5 10
[ ! -s "$WORK/state.importer" ] || fail "late open: the importer opened S before it was told to"
PHOS_COPY_ON_WRITE=always PHOS_ENGINE_WORKERS=1 criu_dump --leave-running &
dump=$!
for _ in $(seq 200); do
  [ "$(grep -o "process [0-9]*: copy window opened" "$WORK/dump.log" 2>/dev/null | sort -u | wc -l)" = 2 ] && break
  sleep 0.05
done
touch "$WORK/open"  # seen by the importer once it runs again
wait "$dump" || fail "late open: criu dump failed: $(criu_errors "$WORK/dump.log")"
! grep -q "no copy-on-write" "$WORK/dump.log" ||
  fail "late open: copy-on-write refused: $(grep -o 'no copy-on-write.*' "$WORK/dump.log" | head -n1)"
pushed=$(grep -o "a CUDA IPC open by another process [^;]*" "$WORK/dump.log" | head -n1 || true)
[ -n "$pushed" ] ||
  fail "late open: the importer's open did not go through the owner's open window: $(grep -o 'phos: process 1: copy-on-write.*' "$WORK/dump.log" | head -n2)"
for _ in $(seq 100); do [ -s "$WORK/state.importer" ] && break; sleep 0.05; done
both_ok "late open: after the leave-running dump"
for p in $(workload_pids); do kill -9 "$p" 2>/dev/null || true; done
wait_pid_free
rm -f "$WORK/state.importer"
criu_restore || fail "late open: criu restore failed: $(criu_errors "$WORK/restore.log")"
WORKLOAD_PID=$(restored_pid) || fail "late open: no restored process"
for _ in $(seq 100); do [ -s "$WORK/state.importer" ] && break; sleep 0.05; done
both_ok "late open: restored (the importer opens S again, its half as the freeze left it)"
unset IPC_COW_OPEN_AFTER
say "6. S opened after the give-back, in the owner's window: $pushed; restored, both processes' checks pass"
say "PASS"
