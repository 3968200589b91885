#!/usr/bin/env bash
# CUDA IPC between two processes under libphos, through real criu dumps of
# their tree, on the fake libcuda with real memory (FAKE_CUDA_MEMORY=1),
# whose own IPC calls log "driver ipc" and fail (ipc_client.c is the
# workload: the owner counts in shared memory S, its child echoes through
# its mapping of S, opened from the owner's IPC handle).
#   1. served by phos: the two processes share S, the importer waited on the
#      owner's interprocess event (as torch.multiprocessing sends one), the
#      driver saw no IPC call, memory or event
#   2. a leave-running dump: the job goes on
#   3. a process outside the tree that has S open: the dump refuses, naming
#      the allocation; closed there (cuIpcCloseMemHandle), the dump goes through
#   4. a dump: S is stored once (in the owner's image; the importer's image
#      names its mapping, phosctl show prints it); the fake driver still saw
#      no IPC call
#   5. the restore maps the owner's restored S into both at their addresses:
#      the owner's writes reach the importer and back (the echo goes on),
#      the pattern written before the dump is intact in both
#   6. an importer whose only device memory is S: dumped and restored, the
#      echo goes on
export PHOS_WORKLOAD=${PHOS_BUILD:?}/test/hooks/ipc_client
export FAKE_CUDA_MEMORY=1 LD_LIBRARY_PATH=$PHOS_BUILD/test/hooks${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PHOS_CHUNK_MIB=1 CRIU_TIMEOUT=60
source "$(dirname "$0")/../e2e/lib.sh"
export FAKE_CUDA_LOG=$WORK/fake.log
OUTSIDER=  # case 5's process outside the tree, ended with the test
trap '[ -z "$OUTSIDER" ] || kill -9 "$OUTSIDER" 2>/dev/null || true; cleanup' EXIT

verdict() { state_field 3; }
importer_state() { cat "$WORK/state.importer" 2>/dev/null || echo "none"; }
# both_ok WHAT: the owner's echo and the importer's checks pass, and both count on.
both_ok() {
  local at imp
  at=$(state_counter)
  imp=$(cut -d' ' -f1 < "$WORK/state.importer")
  wait_counter_above $((at + 20)) 10
  [ "$(verdict)" = ok ] || fail "$1: the owner: $(verdict)"
  for _ in $(seq 100); do [ "$(cut -d' ' -f1 < "$WORK/state.importer")" -gt "$imp" ] && break; sleep 0.05; done
  [ "$(cut -d' ' -f1 < "$WORK/state.importer")" -gt "$imp" ] || fail "$1: the importer does not count on"
  [ "$(cut -d' ' -f2 < "$WORK/state.importer")" = ok ] || fail "$1: the importer: $(importer_state)"
}
no_driver_ipc() {
  ! grep -q "^driver ipc" "$FAKE_CUDA_LOG" 2>/dev/null || fail "$1: the driver saw IPC calls: $(grep '^driver ipc' "$FAKE_CUDA_LOG" | sort -u | tr '\n' ' ')"
}

# 1. Served by phos.
start_workload --preload
wait_counter_above 20 10
for _ in $(seq 100); do [ -s "$WORK/state.importer" ] && break; sleep 0.05; done
both_ok "before any dump"
no_driver_ipc "before any dump"
"$PHOSCTL" status "$WORKLOAD_PID" | grep -q "CUDA IPC: allocation [0-9]* open in process $(state_field 4)$" ||
  fail "the owner's status does not name its importer: $("$PHOSCTL" status "$WORKLOAD_PID" | grep -i ipc)"
say "1. shared through phos's IPC handle, the echo runs, the driver saw no IPC call"

# 2. A leave-running dump.
rm -rf "${IMG:?}"/*
criu_dump --leave-running || fail "leave-running dump failed: $(criu_errors "$WORK/dump.log")"
both_ok "after a leave-running dump"
say "2. leave-running dump: the job goes on"

# 3. A process outside the tree holds S.
hex=$(cat "$WORK/state.handle")
(unshare --pid --fork env LD_PRELOAD="$LIBPHOS" "$PHOS_WORKLOAD" "$WORK/outsider" --outsider "$hex" > "$WORK/outsider.out" 2>&1 &)
for _ in $(seq 100); do grep -q opened "$WORK/outsider.out" && break; sleep 0.05; done
OUTSIDER=$(pgrep -f "^$PHOS_WORKLOAD $WORK/outsider" || true)
grep -q opened "$WORK/outsider.out" || fail "the outsider did not open S: $(cat "$WORK/outsider.out")"
rm -rf "${IMG:?}"/*
if criu_dump --leave-running; then fail "dumped while a process outside the tree holds S"; fi
refusal=$(grep -o "phos: Error: .*CUDA IPC.*" "$WORK/dump.log" | head -n1)
grep -q "its allocation #[0-9]* is open through CUDA IPC in a process outside its pid namespace, which is not in the dumped tree" <<< "$refusal" ||
  fail "the refusal does not name the allocation and the outsider: $(criu_errors "$WORK/dump.log")"
both_ok "after the refused dump"
say "3. refused: $refusal"
kill -TERM "$OUTSIDER"
for _ in $(seq 100); do grep -q closed "$WORK/outsider.out" && break; sleep 0.05; done
grep -q "closed 0" "$WORK/outsider.out" || fail "the outsider did not close S: $(cat "$WORK/outsider.out")"
rm -rf "${IMG:?}"/*
criu_dump --leave-running || fail "the dump after the outsider closed S failed: $(criu_errors "$WORK/dump.log")"
both_ok "after the last dump"
no_driver_ipc "the whole test"
say "3. closed there: the dump goes through, the job goes on"

# 4. A dump: S stored once.
rm -rf "${IMG:?}"/*
criu_dump || fail "criu dump failed: $(criu_errors "$WORK/dump.log")"
grep -q "through CUDA IPC: stored once, in its owner's image" "$WORK/dump.log" || fail "the dump does not say S is stored once"
"$PHOSCTL" show "$IMG" > "$WORK/show.txt" || fail "phosctl show failed"
grep -q "CUDA IPC: allocation [0-9]* of process 1 mapped here" "$WORK/show.txt" ||
  fail "phosctl show does not print the mapping: $(cat "$WORK/show.txt")"
"$PHOSCTL" show --json "$IMG" > "$WORK/show.json"
python3 - "$WORK/show.json" <<'PY' || fail "the image does not store S once (phosctl show --json above)"
import json, sys
images = json.load(open(sys.argv[1]))["images"]
owner = [i for i in images if i["pid"] == 1][0]
importer = [i for i in images if i["pid"] != 1][0]
mib = 1 << 20
own = sorted(a["size"] for a in owner["allocations"])
assert own == [4 * mib, 4 * mib], own                      # S and A
assert [a["size"] for a in importer["allocations"]] == [4 * mib], importer["allocations"]  # B only
m = importer["ipc_mappings"]
assert len(m) == 1 and m[0]["owner_pid"] == 1 and m[0]["size"] == 4 * mib, m
assert m[0]["owner_allocation"] in [a["id"] for a in owner["allocations"]], m
stored = sum(a["size"] for i in images for a in i["allocations"])
assert stored == 12 * mib, stored                             # not 16: S once
print(f"[ipc_criu] images: owner {len(own)} allocations, importer 1 + IPC mapping of #{m[0]['owner_allocation']}; {stored // mib} MiB in all")
PY
no_driver_ipc "the dump"
say "4. dumped: S stored once, in the owner's image; the importer's names its mapping"

# 5. Restored: one memory, mapped into both.
wait_pid_free
criu_restore || fail "criu restore failed: $(criu_errors "$WORK/restore.log")"
WORKLOAD_PID=$(restored_pid) || fail "no restored process"
grep -q "mapped again at 0x[0-9a-f]* through CUDA IPC" "$WORK/restore.log" || fail "the restore does not say it mapped S into the importer"
both_ok "after the restore"
no_driver_ipc "the restore"
say "5. restored: the owner's writes reach the importer and back through S, the pattern intact in both"

# 6. An importer with no memory of its own.
for p in $(workload_pids); do kill -9 "$p" 2>/dev/null || true; done
wait_pid_free
rm -rf "${IMG:?}"/* "$WORK"/state*
IPC_IMPORTER_OWN=0 start_workload --preload
wait_counter_above 20 10
for _ in $(seq 100); do [ -s "$WORK/state.importer" ] && break; sleep 0.05; done
both_ok "an importer without memory of its own"
criu_dump || fail "criu dump of an importer without memory of its own failed: $(criu_errors "$WORK/dump.log")"
"$PHOSCTL" show --json "$IMG" | python3 -c '
import json, sys
images = json.load(sys.stdin)["images"]
importer = [i for i in images if i["pid"] != 1][0]
assert not importer["allocations"] and len(importer["ipc_mappings"]) == 1, importer' ||
  fail "the importer's image is not its IPC mapping alone"
wait_pid_free
criu_restore || fail "criu restore of an importer without memory of its own failed: $(criu_errors "$WORK/restore.log")"
WORKLOAD_PID=$(restored_pid) || fail "no restored process"
both_ok "an importer without memory of its own, restored"
no_driver_ipc "the whole test"
say "6. an importer whose only device memory is S: dumped (its image names the mapping only) and restored, the echo goes on"
say "PASS"
