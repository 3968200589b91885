#!/usr/bin/env bash
# Validation by checksum through real criu dumps: criu's plugin runs its
# engine on the fake libcuda with real memory (FAKE_CUDA_MEMORY=1), its GPU
# kernels on the CPU; the workload (checksum_client.c) checks after every
# call a dump can freeze it at that its memory is what it was before, so a
# restored image holding a write made after its freeze is caught. Its
# "planted" writes are stores of its own into its device memory: writes no
# hook sees, as a kernel's outside its speculated set is.
#   1. copy-on-write (leave-running), nothing planted: the copies equal the
#      freeze's fingerprints; the manifest says validation=checksum; the
#      copy's staging was made before the gate closed; the image restores
#      and the program's checks pass
#   1a. the same, its allocations changed after the listing ahead of the
#      gate (injected): listed and mapped again at the gate; restores
#   1b. copy-on-write, a store no hook sees after the freeze into a chunk
#      all zero at the freeze: settled as zero at the freeze (no copy), the
#      image completes and restores with zero there
#   2. copy-on-write, a store after the freeze into memory copied last: the
#      image is refused (criu fails naming the chunk, its allocation, the
#      kernel trusted on speculation, and saxpy as the likely writer: it
#      read P without P in its write set), no completion marker; the program runs
#      on, its agent remembers it; its next dump copies while it is stopped,
#      completes, and restores
#   3. the same with cow_trust=speculated (the control): the image completes,
#      and restored it holds the store made after the freeze: what checksum
#      trust turns into a refusal. The controls take their CRCs on the CPU
#      (gpu_checksums=off): the GPU's CRC kernel reads the process's memory
#      apart from the DMA, so the store may instead leave a chunk whose CRC
#      does not match, which the restore refuses (and criu then hangs on
#      the restored process it killed in its pid namespace)
#   4. soft recopy (a dump that stops the program), stores into memory its
#      first pass copied first: the final pass copies that chunk again without
#      a dirty mark; the image restores intact; with cow_trust=speculated
#      (the control) it does not
#   5. the same with gpu_checksums=off: the fingerprints taken on the CPU
#   6. a migration copying device to device: the copies fingerprinted on the
#      target, the final pass by checksum; the migrated program intact
export PHOS_WORKLOAD=${PHOS_BUILD:?}/test/hooks/checksum_client
export FAKE_CUDA_MEMORY=1 LD_LIBRARY_PATH=$PHOS_BUILD/test/hooks${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PHOS_RECOPY_MIN_MIB=0 PHOS_CHUNK_MIB=1 PHOS_COW_POOL_MIB=64 PHOS_FAULT=slow-copy CRIU_TIMEOUT=60
source "$(dirname "$0")/../e2e/lib.sh"
verdict() { state_field 3; }


# 1. Nothing planted.
start_workload --preload
wait_counter_above 5
PHOS_COPY_ON_WRITE=always criu_dump --leave-running || fail "clean copy-on-write: criu dump failed: $(criu_errors "$WORK/dump.log")"
grep -q "checksum: the freeze's fingerprints (T0) of 10 chunks" "$WORK/dump.log" ||
  fail "no freeze fingerprints in the log: $(grep -o 'phos: process [0-9]*: .*checksum.*' "$WORK/dump.log" | head -n2)"
equal=$(grep -o "checksum: [0-9]* chunks equal to the freeze" "$WORK/dump.log") || fail "no checked copies in the log"
[ -e "$IMG/phos-1-complete.img" ] || fail "clean copy-on-write: no completion marker"
# Its staging made before the gate closed (after the listing ahead, before
# "closing its gate"), not while criu dumped nor as the copy started.
staged=$(grep -n "the copy's staging made before the gate: [0-9]* rings" "$WORK/dump.log" | cut -d: -f1)
closing=$(grep -n "closing its gate" "$WORK/dump.log" | head -n1 | cut -d: -f1)
[ -n "$staged" ] && [ -n "$closing" ] && [ "$staged" -lt "$closing" ] ||
  fail "clean copy-on-write: the staging was not made before the gate: $(grep -o "phos: .*staging.*" "$WORK/dump.log" | head -n1)"
! grep -q "the copy's staging made ahead, while criu dumps" "$WORK/dump.log" ||
  fail "clean copy-on-write: the staging was made twice"
# criu's descriptor table grown at the plugin's init, not by its page pipes
# once the process is frozen.
grep -q "criu's descriptor table sized for [0-9]* descriptors (its page pipes)" "$WORK/dump.log" ||
  fail "clean copy-on-write: criu's descriptor table was not sized at init: $(grep -o "phos: criu's descriptor table.*" "$WORK/dump.log")"
# Its allocations' fds were exported, and mapped into criu, while it ran,
# not at the closed gate.
grep -q "allocations, release and the driver's lock [0-9.]* ms (listed (their fds exported ahead) [0-9.]*, handed to phos-keeper [0-9.]*, the copy's job (mapped ahead) " "$WORK/dump.log" ||
  fail "clean copy-on-write: the fds were not exported and mapped ahead: $(grep -o "allocations, release and the driver's lock .*criu's freeze" "$WORK/dump.log" | head -n1)"
"$PHOSCTL" show --json "$IMG" | grep -q '"validation": "checksum"' || fail "the manifest does not record validation=checksum"
restored_ok "clean copy-on-write"
say "1. copy-on-write: $equal; validation=checksum in the manifest; restored, its checks pass"

# 1a. The allocations changed between the listing ahead and the gate
# (injected): listed and mapped again at the gate, the image as good.
rm -rf "${IMG:?}"/* "$WORK/dump.log"
PHOS_FAULT=stale-ahead PHOS_COPY_ON_WRITE=always criu_dump --leave-running ||
  fail "changed after the listing ahead: criu dump failed: $(criu_errors "$WORK/dump.log")"
grep -q "its allocations changed after they were listed ahead ([0-9]* then, [0-9]* at the gate): listed again with their fds" "$WORK/dump.log" ||
  fail "changed after the listing ahead: not listed again at the gate: $(grep -o "allocations, release and the driver's lock .*criu's freeze" "$WORK/dump.log" | head -n1)"
grep -q "allocations, release and the driver's lock [0-9.]* ms (listed with their fds [0-9.]*, handed to phos-keeper [0-9.]*, mapped into criu " "$WORK/dump.log" ||
  fail "changed after the listing ahead: the fds or the mapping of before were taken: $(grep -o "allocations, release and the driver's lock .*criu's freeze" "$WORK/dump.log" | head -n1)"
[ -e "$IMG/phos-1-complete.img" ] || fail "changed after the listing ahead: no completion marker"
restored_ok "changed after the listing ahead"
say "1a. allocations changed after the listing ahead: listed and mapped again at the gate; restored, its checks pass"

# 1b. A store no hook sees, after the freeze, into a chunk all zero at the
# freeze: that chunk is in the image as a hole from the start (settled, no
# copy), so the image completes and holds zero there. Copied as any other
# chunk, the store would reach it first and the image would be refused.
rm -rf "${IMG:?}"/* "$WORK/plant" "$WORK/dump.log" && kill -9 "$WORKLOAD_PID" && wait_pid_free
CHECKSUM_ZERO_PLANT_AFTER=$WORK/plant start_workload --preload
wait_counter_above 5
PHOS_COPY_ON_WRITE=always criu_dump --leave-running &
dump=$!
for _ in $(seq 200); do grep -q "copy window opened" "$WORK/dump.log" 2>/dev/null && break; sleep 0.05; done
touch "$WORK/plant"
wait "$dump" || fail "zero at the freeze: criu dump failed: $(criu_errors "$WORK/dump.log")"
settled=$(grep -o "[0-9]* chunks ([0-9.]* MiB) all zero at the freeze" "$WORK/dump.log") ||
  fail "zero at the freeze: no chunks settled as zero: $(grep -o 'phos: process 1: .*' "$WORK/dump.log" | head -n 8)"
[ -e "$IMG/phos-1-complete.img" ] || fail "zero at the freeze: no completion marker"
at=$(state_counter)
wait_counter_above $((at + 5))
[ "$(verdict)" = ok ] || fail "zero at the freeze: the program was harmed: $(cat "$WORK/state")"
restored_ok "zero at the freeze (the store after it not in the image)"
say "1b. a store no hook sees into memory all zero at the freeze: $settled; the image complete, restored, its checks pass"
# The control: with cow_zero=copy nothing is settled, and the same store is
# refused (the case above went through the window, not around it).
rm -rf "${IMG:?}"/* "$WORK/plant" "$WORK/dump.log" && kill -9 "$WORKLOAD_PID" && wait_pid_free
CHECKSUM_ZERO_PLANT_AFTER=$WORK/plant start_workload --preload
wait_counter_above 5
PHOS_COW_ZERO=copy PHOS_COPY_ON_WRITE=always criu_dump --leave-running &
dump=$!
for _ in $(seq 200); do grep -q "copy window opened" "$WORK/dump.log" 2>/dev/null && break; sleep 0.05; done
touch "$WORK/plant"
rc=0
wait "$dump" || rc=$?
[ "$rc" -ne 0 ] && grep -q "differs from its content at the freeze" "$WORK/dump.log" ||
  fail "zero at the freeze, control (cow_zero=copy): the store after the freeze was not refused (criu exit $rc)"
! grep -q "all zero at the freeze" "$WORK/dump.log" || fail "zero at the freeze, control: chunks settled with cow_zero=copy"
say "1b. control, cow_zero=copy: nothing settled, the same store refused"

# 2. A store after the freeze into P, copied last.
rm -rf "${IMG:?}"/* && kill -9 "$WORKLOAD_PID" && wait_pid_free
start_workload --preload --plant last
wait_counter_above 5
token=$(state_token)
rc=0
PHOS_COPY_ON_WRITE=always criu_dump --leave-running || rc=$?
[ "$rc" -ne 0 ] || fail "planted copy-on-write: criu exited 0 with a store after the freeze in memory not yet copied"
refusal=$(grep -o "phos: Error: process [0-9]*: .*" "$WORK/dump.log" | head -n1)
for want in "differs from its content at the freeze: a write that speculation missed reached it before its copy" \
            "(allocation #" "from the process's memory" \
            "kernels trusted on speculation in the window: saxpy(float const*, float*, float, int)" \
            "launches that pointed into the changed chunk's buffer without it in their speculated write set (the likely writers): saxpy(float const*, float*, float, int)" \
            "the image is refused (no completion marker); the process runs on; its next dumps copy while it is stopped"; do
  grep -qF -- "$want" <<< "$refusal" || fail "the refusal does not say '$want': $refusal"
done
[ ! -e "$IMG/phos-1-complete.img" ] || fail "a refused image has a completion marker"
at=$(state_counter)
wait_counter_above $((at + 20))
[ "$(state_token)" = "$token" ] && [ "$(verdict)" = ok ] || fail "the program was harmed by the refused dump: $(cat "$WORK/state")"
"$PHOSCTL" status "$WORKLOAD_PID" | grep -q "copy-on-write: off for this process" ||
  fail "the agent does not remember the miss: $("$PHOSCTL" status "$WORKLOAD_PID" | head -n 12)"
say "2. planted: refused ($refusal); the program ran on intact"
# Its next dump copies while it is stopped, and restores.
rm -rf "${IMG:?}"/*
PHOS_COPY_ON_WRITE=always criu_dump --leave-running || fail "the dump after a refusal failed: $(criu_errors "$WORK/dump.log")"
grep -q "no copy-on-write: an earlier dump of it found a write that speculation missed" "$WORK/dump.log" ||
  fail "the dump after a refusal did not say why it copies while the program is stopped"
! grep -q "copy window opened" "$WORK/dump.log" || fail "the dump after a refusal opened a copy window"
[ -e "$IMG/phos-1-complete.img" ] || fail "the stopped dump after a refusal has no completion marker"
restored_ok "the stopped dump after a refusal"
say "2. its next dump copied while it was stopped; restored, its checks pass"

# 3. The control: the same with speculated trust gives a wrong image.
rm -rf "${IMG:?}"/* && kill -9 "$WORKLOAD_PID" && wait_pid_free
start_workload --preload --plant last
wait_counter_above 5
PHOS_GPU_CHECKSUMS=off PHOS_COPY_ON_WRITE=always PHOS_COW_TRUST=speculated criu_dump --leave-running ||
  fail "control: criu dump with speculated trust failed: $(criu_errors "$WORK/dump.log")"
kill -9 "$WORKLOAD_PID"
wait_pid_free
criu_restore || fail "control: criu restore failed: $(criu_errors "$WORK/restore.log")"
WORKLOAD_PID=$(restored_pid) || fail "control: no restored process"
for _ in $(seq 100); do [[ "$(verdict)" == bad:* ]] && break; sleep 0.05; done
[[ "$(verdict)" == bad:P=* ]] || fail "control: with speculated trust the image was not wrong ($(verdict)): the test plants nothing"
say "3. control, cow_trust=speculated: the image completed and restored wrong ($(verdict))"

# 4. Soft recopy: P copied first by the first pass, stored into after.
recopy_case() {  # recopy_case WHAT [ENV=VALUE...]
  local what=$1; shift
  rm -rf "${IMG:?}"/*
  kill -9 "$WORKLOAD_PID" 2>/dev/null || true
  wait_pid_free
  start_workload --preload --plant first
  wait_counter_above 5
  (if [ $# -gt 0 ]; then export "$@"; fi; criu_dump) || fail "$what: criu dump failed: $(criu_errors "$WORK/dump.log")"
  grep -q "first pass copied" "$WORK/dump.log" || fail "$what: no soft recopy: $(grep -o 'no soft recopy.*' "$WORK/dump.log" | head -n1)"
}
recopy_case "recopy"
line=$(grep -o "checksum: the final pass copies [0-9]* of [0-9]* chunks.*" "$WORK/dump.log") || fail "recopy: no final pass by checksum"
missed=$(grep -o "([0-9]* of them without a dirty mark" <<< "$line" | grep -o '[0-9]*' | head -n1)
[ "${missed:-0}" -ge 1 ] || fail "recopy: the store after P's first copy was not found: $line"
grep -q "calls with a set not trusted left unmarked" "$WORK/dump.log" || fail "recopy: the window's unmarked calls are not counted"
"$PHOSCTL" show --json "$IMG" | grep -q '"validation": "checksum"' || fail "recopy: the manifest does not record validation=checksum"
restored_ok "recopy"
say "4. soft recopy: $line; restored, its checks pass"

recopy_case "recopy, control" PHOS_COW_TRUST=speculated PHOS_GPU_CHECKSUMS=off
! grep -q "checksum: the final pass" "$WORK/dump.log" || fail "recopy, control: a final pass by checksum with speculated trust"
wait_pid_free
criu_restore || fail "recopy, control: criu restore failed: $(criu_errors "$WORK/restore.log")"
WORKLOAD_PID=$(restored_pid) || fail "recopy, control: no restored process"
for _ in $(seq 100); do [[ "$(verdict)" == bad:* ]] && break; sleep 0.05; done
[[ "$(verdict)" == bad:P=* ]] || fail "recopy, control: with speculated trust the image was not wrong ($(verdict)): the test plants nothing"
say "4. control, cow_trust=speculated: the recopied image restored wrong ($(verdict))"

# 5. The fingerprints on the CPU.
recopy_case "recopy on the CPU" PHOS_GPU_CHECKSUMS=off
grep -q "checksum: the final pass copies" "$WORK/dump.log" || fail "recopy on the CPU: no final pass by checksum"
restored_ok "recopy on the CPU"
rm -rf "${IMG:?}"/*
kill -9 "$WORKLOAD_PID" 2>/dev/null || true
wait_pid_free
start_workload --preload --plant last
wait_counter_above 5
rc=0
PHOS_GPU_CHECKSUMS=off PHOS_COPY_ON_WRITE=always criu_dump --leave-running || rc=$?
[ "$rc" -ne 0 ] && grep -q "(CPU, gpu_checksums=off)" "$WORK/dump.log" && grep -q "differs from its content at the freeze" "$WORK/dump.log" ||
  fail "copy-on-write on the CPU: the store after the freeze was not refused (criu exit $rc)"
say "5. gpu_checksums=off: recopy's final pass and copy-on-write's refusal the same, fingerprints on the CPU"

# 6. A migration copying device to device (migrate_copy=always, to the same
# fake GPU): its copies fingerprinted on the target, its final pass by
# checksum; phos-keeper holds the memory until the restore maps it.
rm -rf "${IMG:?}"/*
kill -9 "$WORKLOAD_PID" 2>/dev/null || true
wait_pid_free
start_workload --preload --plant first
wait_counter_above 5
out=$(PHOS_MIGRATE_COPY=always "$PHOSCTL" migrate "$WORKLOAD_PID" --to 0 --dir "$IMG" --lib "$PLUGIN_DIR" --criu "$CRIU" 2>&1) ||
  { cp "$IMG"/*.log "$WORK"/ 2>/dev/null; fail "migration: phosctl migrate failed: $out"; }
cp "$IMG"/*.log "$WORK"/ 2>/dev/null || true
line=$(grep -o "checksum: the final pass copies [0-9]* of [0-9]* chunks.*" "$IMG/migrate-dump.log") ||
  fail "migration: no final pass by checksum: $(grep -o 'phos: .*' "$IMG/migrate-dump.log" | tail -n 5)"
missed=$(grep -o "([0-9]* of them without a dirty mark" <<< "$line" | grep -o '[0-9]*' | head -n1)
[ "${missed:-0}" -ge 1 ] || fail "migration: the store after P's first copy was not found: $line"
WORKLOAD_PID=$(restored_pid) || fail "migration: no restored process"
at=$(state_counter)
wait_counter_above $((at + 20))
[ "$(verdict)" = ok ] || fail "migration: the migrated program found its memory wrong: $(verdict)"
say "6. migration, copied device to device: $line; the program runs on with its checks passing"
say "PASS"
