#!/usr/bin/env bash
# Migration of a process on two GPUs (phosctl migrate --gpu-map, migrate_to
# SRC:DST,...) through real criu and the real plugin, on the fake libcuda
# with real memory and two devices (FAKE_CUDA_MEMORY=1 FAKE_CUDA_DEVICES=2):
# the workload (multi_gpu_client.c, with peer access both ways) keeps 4 MiB
# A on GPU 0 and 4 MiB B on GPU 1, checks after every step that both hold
# what it last wrote, and reports which fake GPU each lives on (the memfd
# mapped there is named after its GPU).
#   1. refusals, each at the dump's start with the process running on: a map
#      that leaves GPU 1 unmapped, one that is not one-to-one, one naming a
#      GPU the host lacks, a single target for two GPUs; a malformed map is
#      refused by phosctl before criu runs
#   2. the swap 0:1,1:0: each GPU's memory copied to the other GPU (peer to
#      peer: a copy leaving its context's GPU without access fails in the
#      fake), kept by phos-keeper on both, the manifest (format 8) naming a
#      target per device; after the restore A is on GPU 1 and B on GPU 0,
#      their data intact (the program's checks pass on), and phos's
#      mappings of both carry access for both GPUs again (peer access)
#   2b. in place (0=0,1=1, the '=' form): each GPU's memory stays where it is,
#      nothing copied, the program's checks pass on
#   3. no restore comes: the keeper writes each GPU's kept memory into the
#      image directory, which then restores as an ordinary image
export PHOS_WORKLOAD=${PHOS_BUILD:?}/test/hooks/multi_gpu_client
export FAKE_CUDA_MEMORY=1 FAKE_CUDA_DEVICES=2 LD_LIBRARY_PATH=$PHOS_BUILD/test/hooks${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PHOS_CHUNK_MIB=1 CRIU_TIMEOUT=60
source "$(dirname "$0")/../e2e/lib.sh"
export FAKE_CUDA_LOG=$WORK/fake-cuda.log

migrate() { "$PHOSCTL" migrate "$WORKLOAD_PID" "$@" --dir "$IMG" --lib "$PLUGIN_DIR" --criu "$CRIU" 2>&1; }
# The fake GPUs of A and B ("gpus=GA,GB", the state's fourth field).
gpus() { state_field 4; }
# phos's mappings of a 4 MiB allocation with access for both GPUs at once
# (only the program's hooks set two at a time: criu's engine sets one).
both_access() { grep -c "^access 0x[0-9a-f]* 4194304 [01]:3 [01]:3$" "$FAKE_CUDA_LOG" || true; }

start_workload --preload peer
wait_counter_above 5
[ "$(gpus)" = "gpus=0,1" ] || fail "the workload's memory is not on GPUs 0 and 1: $(cat "$WORK/state")"
[ "$(both_access)" -ge 2 ] || fail "A and B were not mapped with access for both GPUs (peer access)"
token=$(state_token)

# 1. Refusals: the dump refuses at its start, the process runs on.
refused() {  # refused WHAT PATTERN PHOSCTL_ARGS...
  local what=$1 pattern=$2 out at
  shift 2
  rm -rf "${IMG:?}"/*
  if out=$(migrate "$@"); then fail "$what: the migration succeeded"; fi
  grep -q -- "$pattern" "$IMG/migrate-dump.log" ||
    fail "$what: the dump log does not say '$pattern': $(criu_errors "$IMG/migrate-dump.log") $out"
  at=$(state_counter)
  wait_counter_above $((at + 5))
  [ "$(state_field 3)" = ok ] || fail "$what: the process found its memory wrong after the refusal: $(state_field 3)"
  say "1. refused ($what): $(grep -o "migrate_to=[^:]*:.*$pattern.*" "$IMG/migrate-dump.log" | head -n1)"
}
refused "GPU 1 unmapped" "the process uses GPU 1, which the GPU map 0:1 leaves unmapped" --gpu-map 0:1
refused "not one-to-one" "GPU 1 is already the target of 0:1; the map must be one-to-one" --gpu-map 0:1,1:1
refused "no GPU 2" "GPU map entry 1:2: this host has no GPU 2 (it has 2)" --gpu-map 0:1,1:2
refused "one target for two GPUs" "the process uses 2 GPUs: name a target for each" --to 1
out=$(migrate --gpu-map 0:1,1) && fail "phosctl took a malformed map"
grep -q "phosctl migrate: --gpu-map 0:1,1: GPU map entry '1': expected SRC:DST" <<<"$out" ||
  fail "phosctl did not say why the map is malformed: $out"
say "1. phosctl refuses a malformed map: $out"

# 2. The swap.
rm -rf "${IMG:?}"/*
before=$(both_access)
out=$(migrate --gpu-map 0:1,1:0) || { cp_img_logs; fail "phosctl migrate --gpu-map 0:1,1:0 failed: $out"; }
cp_img_logs
say "2. $out"
grep -q "^migrated process $WORKLOAD_PID to GPUs 0:1,1:0: now process [0-9]*; .* moved GPU to GPU; downtime" <<<"$out" ||
  fail "phosctl migrate printed no summary of a move GPU to GPU"
for pair in "0 to GPU 1" "1 to GPU 0"; do
  grep -q "phos: process $WORKLOAD_PID: migration [0-9a-f]\{16\} from GPU $pair " "$WORK/migrate-dump.log" ||
    fail "the dump did not plan GPU $pair"
done
grep -q "MiB moved to GPUs 0->1, 1->0" "$WORK/migrate-dump.log" ||
  fail "the dump did not move both GPUs' memory: $(grep -o 'phos: process [0-9]*: .*moved.*' "$WORK/migrate-dump.log")"
! grep -q "cross-gpu copy" "$FAKE_CUDA_LOG" || fail "$(grep -m1 'cross-gpu copy' "$FAKE_CUDA_LOG")"
"$PHOSCTL" show --json "$IMG" | python3 -c '
import json, sys
m = json.load(sys.stdin)["images"][0]
k = m["kept"]
one = "GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadae01"
zero = "GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadae00"
assert m["format_version"] == 8, m["format_version"]
assert k["targets"] == {"0": one, "1": zero}, k
assert not k["in_place"], k' || fail "the manifest does not keep device 0 on GPU 1 and device 1 on GPU 0 (format 8)"
grep -q "taken from phos-keeper, on GPUs device 0's on GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadae01, device 1's on GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadae00" \
  "$WORK/migrate-restore.log" || fail "the restore did not take both GPUs' kept memory"
wait_no_keeper
pid=$(restored_pid) || fail "no restored process"
gate_opens "$pid" || fail "the restored process's gate is not open"
at=$(state_counter)
wait_counter_above $((at + 20))
[ "$(state_token)" = "$token" ] || fail "token changed across the migration"
[ "$(state_field 3)" = ok ] || fail "the migrated program found its memory wrong: $(state_field 3)"
[ "$(gpus)" = "gpus=1,0" ] || fail "after the swap A and B are not on GPUs 1 and 0: $(cat "$WORK/state")"
after=$(both_access)
[ "$after" -ge $((before + 2)) ] || fail "A and B were not mapped again with access for both GPUs ($before, then $after)"
say "2. swapped: A on GPU 1, B on GPU 0, the program's checks pass for 20 steps, peer access set again on both"
WORKLOAD_PID=$pid

# 2b. In place: the fake has no driver restore to carry the swap into the
# process's numbering, so its devices are still GPUs 0 and 1 to phos and
# their memory stays on fake GPUs 1 and 0.
rm -rf "${IMG:?}"/*
out=$(migrate --gpu-map 0=0,1=1) || { cp_img_logs; fail "phosctl migrate --gpu-map 0=0,1=1 failed: $out"; }
cp_img_logs
grep -q "^migrated process $WORKLOAD_PID to GPUs 0:0,1:1: .* kept in place;" <<<"$out" || fail "not kept in place: $out"
grep -q "MiB kept in place on GPUs 0->0, 1->1 for the restore" "$WORK/migrate-dump.log" ||
  fail "the dump did not keep both GPUs' memory in place"
wait_no_keeper
pid=$(restored_pid) || fail "no process restored in place"
at=$(state_counter)
wait_counter_above $((at + 20))
[ "$(state_field 3)" = ok ] || fail "in place: the program found its memory wrong: $(state_field 3)"
[ "$(gpus)" = "gpus=1,0" ] || fail "in place: the memory moved: $(cat "$WORK/state")"
say "2b. in place (0=0,1=1): $(grep -o '[0-9]* allocations, [0-9.]* MiB kept in place on GPUs [^ ]* [^ ]*' "$WORK/migrate-dump.log")"
WORKLOAD_PID=$pid

# 3. No restore comes: each GPU's kept memory written into the image.
rm -rf "${IMG:?}"/*
PHOS_MIGRATE_TO=0:1,1:0 PHOS_MIGRATE_KEEP_S=1 criu_dump || fail "migration dump failed: $(criu_errors "$WORK/dump.log")"
for _ in $(seq 200); do grep -q "written into the image directory" "$IMG/phos-keeper.log" 2>/dev/null && break; sleep 0.05; done
grep -q "kept GPU memory written into the image directory" "$IMG/phos-keeper.log" ||
  fail "the keeper did not write the kept memory: $(tail -n 5 "$IMG/phos-keeper.log")"
wait_no_keeper
"$PHOSCTL" show --json "$IMG" | python3 -c '
import json, sys
m = json.load(sys.stdin)["images"][0]
assert m["complete"] and "kept" not in m, m
assert sorted({a["device"] for a in m["allocations"]}) == [0, 1], m["allocations"]' ||
  fail "the spilled image is not an ordinary one on devices 0 and 1"
restored_ok "spilled"
say "3. kept memory of both GPUs spilled after migrate_keep_s; restored, its checks pass ($(gpus))"
say "PASS"
