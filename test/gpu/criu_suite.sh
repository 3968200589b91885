#!/usr/bin/env bash
# GPU processes through the real criu and the phos plugin, on a GPU host,
# from bundle/ (test/gpu/make-bundle.sh). One line per case:
#   gpu-criu: CASE: PASS|FAIL|SKIP  details
#
#   pattern_{1,8,32}GiB  checkpoint.sh MIB: leave-running dump, dump + restore
#                        with every byte of device memory re-verified, a
#                        corrupted chunk refused; with the dump/restore times
#   sparse_8GiB          8 GiB of which 256 MiB hold data, the rest zero (a
#                        preallocated, unwritten KV cache): the image stores
#                        the live data only, the zero chunks told apart by
#                        the GPU checksum kernel; restored with every byte
#                        re-verified; sparse=off beside it for the figures
#   incremental_8GiB     gpu_counter with 8 GiB of a constant pattern and a
#                        counter: a full leave-running dump into img1, then
#                        one against it (PHOS_PARENT_IMAGE=../img1) into
#                        img2, which stores only the changed chunks; killed,
#                        restored from img2 with every byte re-verified
#   cublas, cuda_graph   gpu_steps: a cuBLAS GEMM chain / a CUDA graph
#                        instantiated once and replayed every step; dumped,
#                        restored, the per-step checksums of the whole run equal
#                        those of an uninterrupted run, bit for bit
#   torch_mlp, torch_mlp_expandable  torch_train.py (expandable segments for
#                        the second): the loss curve across a dump and restore
#                        equals the uninterrupted one, bit for bit
#   two_processes        a CUDA parent and its CUDA child, dumped as one tree
#                        and restored, both carry on intact
#   torch_ipc            torch_ipc.py: a parent and its child sharing GPU
#                        tensors through torch.multiprocessing (CUDA IPC
#                        served by phos): a leave-running dump, then a dump
#                        and restore; the shared memory stored once, the
#                        curve bitwise equal to an uninterrupted run's
#   gpu_ipc              the same with the runtime's cudaIpc* (gpu_ipc.cu):
#                        outputs bitwise equal to an uninterrupted run's
#   gpu_ipc_event        gpu_ipc_event.cu: an interprocess event recorded
#                        again and again, each way, after a kernel that
#                        spins 200 ms, the other process told by a pipe
#                        after the record returned and reading what the
#                        kernel wrote once it waited on its opened event:
#                        every read right natively and under libphos, whose
#                        records of it return only once the kernel is done
#   dump_disk_full       images on a 256 MiB tmpfs: the dump fails saying so,
#                        the process carries on intact
#   dump_disk_full_leave_running  the same with --leave-running: the image
#                        is written behind the running process; criu still
#                        fails, no completion marker
#   dump_fails_after_snapshot  a leave-running dump that fails after the
#                        snapshot: the process carries on, the snapshot is
#                        not written
#   dump_driver_refuses  CUPTI attached, so the driver refuses its checkpoint:
#                        the dump fails, the process carries on intact
#   dump_criu_killed     criu killed with SIGKILL while it copies 8 GiB: does
#                        the process carry on intact within 30 s?
#   restore_corrupt_chunk, restore_missing_data_file, restore_incomplete_image,
#   restore_other_gpu_model, restore_too_little_memory: the restore is
#                        refused, naming the problem, and no process runs
#   not_preloaded        a CUDA process without libphos.so: phos leaves it to
#                        CRIU's cuda plugin, which dumps and restores it
#   restore_next_to_gpu_process  another GPU process runs throughout: the
#                        restore works and the other process is unharmed
#   multi_gpu_process    (2 GPUs) one process with memory on two GPUs: a
#                        leave-running dump (snapshots on both GPUs), its
#                        image restored, then a dump and restore of the
#                        restored process, each intact
#   multi_gpu_process_cow (2 GPUs) the same process dumped with
#                        --leave-running under copy-on-write: a pool per
#                        GPU, no stopped copy; its image restored intact
#   restore_other_gpu    (2 GPUs) dumped on GPU 0, restored onto GPU 1 with
#                        PHOS_GPU_MAP=0=1; nvidia-smi shows it there
#   cow_pattern_8GiB     pattern_8GiB with copy_on_write=always: the image is
#                        copied while the process runs; restored, every byte
#                        re-verified
#   cow_random           the randomized differential test (cow_random.cu):
#                        PHOS_COW_CYCLES (20) leave-running dumps at random
#                        moments, default settings (cow_trust=checksum); each
#                        image restored equals the uninterrupted run at its
#                        freeze, byte for byte; no dump refused
#   cow_planted          writes outside the speculated set in every window,
#                        validation on: every dump refused, none silently wrong
#   cow_planted_sass     issue 29's evidence: cow_random built for sm_90
#                        only (no PTX: no validator sees its kernels), writing
#                        outside its speculated sets into the buffer copied
#                        last, PHOS_COW_PLANTED_SASS_CYCLES (100) leave-running
#                        dumps with default settings: every image refused by
#                        checksum ("differs from its content at the freeze"),
#                        0 wrong images, the process unharmed; every 10th, its
#                        next dump copies while it is stopped and restores
#                        equal
#   cow_cublas_workspace gpu_steps splitk: a cuBLAS BF16 GEMM loop (m 64,
#                        n 16, k 2^20: split-K) with a workspace set through
#                        cublasSetWorkspace, allocated last, behind 2 GiB
#                        (PHOS_COW_CUBLAS_MIB) copied first; dumped with
#                        --leave-running and copy-on-write, default trust
#                        (checksum): the image completes (the workspace is
#                        in each GEMM's exact set, saved before the first
#                        GEMM in the window), the program's checksums and its
#                        image's, restored, equal an uninterrupted run's.
#                        Fails if cuBLAS did not use the workspace
#   torch_cow, torch_cow_async  torch_train.py (default caching allocator;
#                        backend:cudaMallocAsync) dumped with --leave-running
#                        and copy-on-write (default trust: checksum) while it
#                        trains: its own loss curve and its image's,
#                        restored, equal the uninterrupted run's; bytes saved
#                        copy-on-write, every copy equal to the freeze
#   recopy_random        cow_random dumped without --leave-running with soft
#                        recopy (default trust: checksum), PHOS_RECOPY_CYCLES
#                        (20) times at random moments; each image restored
#                        equals the uninterrupted run at the final gate
#                        closing
#   recopy_random_unspeculated  the same with speculation off for good
#                        (PHOS_SPECULATE=never: no kernel has a set, none
#                        marks a chunk dirty): recopy's final pass by
#                        checksum alone, 0 mismatches
#   recopy_planted       writes outside the speculated set in every first
#                        pass, validation on: every one seen (all copied
#                        again), every image still equal
#   lazy_pattern_8GiB, lazy_torch_mlp  pattern_8GiB and torch_mlp restored
#                        on demand (lazy_restore=on): the process runs before
#                        its memory is in; every byte re-verified / the loss
#                        curve bitwise equal
#   lazy_read_honest, lazy_read_planted  lazy_read.cu under PHOS_VALIDATE=ptx
#                        (honest: launches recorded, the image keeps the order
#                        they touched memory in, filled first)
#                        restored on demand with a slowed fill: kernels wait
#                        only for their sets (fill twins check every access);
#                        a read through a pointer in device memory into memory
#                        not yet in ends the process, naming the kernel, and
#                        the image then restores with lazy_restore=off
#   recopy_pattern_8GiB  checkpoint.sh 8192 with default settings: its
#                        dump-and-restore step through soft recopy (its final
#                        pass by checksum), every byte re-verified
#   soak_torch           torch_train.py checkpointed with --leave-running
#                        PHOS_SOAK_CHECKPOINTS (100) times, then dumped and
#                        restored PHOS_SOAK_CHAIN (20) times in a chain: fds,
#                        threads, RSS, GPU memory back to their baseline (after
#                        the first checkpoint) after each;
#                        the loss curve bitwise equal to an uninterrupted run's
#   soak_pattern_32GiB   gpu_counter of 32 GiB checkpointed with
#                        --leave-running 20 times, then dumped and restored 5
#                        times in a chain, all memory re-verified after each
#                        restore; the same leak criterion
#   torch_many_allocations  a PyTorch job of hundreds of allocations (more fds
#                        than one message carries): given back after a
#                        leave-running dump, restored from its image
#   two_dumps_at_once    two criu dumps of two 2 GiB processes at once on one
#                        GPU: both succeed, both images restore intact
#   dump_next_to_restore a restore and another process's dump at once on one
#                        GPU: both succeed, both images intact
#   restore_criu_killed  criu killed while a restore fills 4 GiB: phos-keeper
#                        ends the half-restored process, the GPU's memory
#                        comes back, the next restore works
#   restore_criu_killed_early  the same before RESUME_DEVICES_LATE, while
#                        criu restores the CPU side: phos-keeper, watching
#                        criu's tree, ends what criu forked
#   lazy_two_processes   two_processes restored on demand, the fill slowed
#   rpc_gpu              criu through its RPC (swrk, as runc drives it) on a
#                        GPU process: leave_running dump, dump, restore
#   pre_dump_refused     criu pre-dump of a GPU process: refused by phos,
#                        saying why; the process counts on intact
#   sdk_torch_step       torch_mlp with phos.step() (sdk/python) at each
#                        iteration: the dump lands on a boundary
#   torch_dead_memory, torch_cow_dead_memory  the same with 256 MiB of
#                        scratch let go in each iteration: free at
#                        phos.step(), not stored (dead), left unfilled by
#                        the restore; loss curves bitwise equal (stopped;
#                        left running with copy-on-write)
#   lazy_restore_criu_killed  the same during an on-demand fill, the process
#                        already running: phos-keeper ends it
#   migrate_torch, migrate_torch_copy  torch_train.py moved by `phosctl
#                        migrate --to 0` while it trains (its memory kept in
#                        place; copied device to device with
#                        migrate_copy=always): loss curve bitwise equal, no
#                        GPU data file in the image
#   migrate_torch_ddp_one_rank  the same for a DDP job of one rank (NCCL)
#   migrate_llama, migrate_llama_copy  a Llama-shaped server (1b) migrated
#                        between two requests: the same tokens after as before
#   migrate_fails_mid_copy  the copy to the target fails: the source runs on
#   migrate_spilled, migrate_spilled_copy  no restore comes: phos-keeper
#                        writes the kept memory into the image directory
#                        after migrate_keep_s; it restores from the files
#   migrate_restore_killed  criu killed mid-restore after it took the kept
#                        memory: kept on, the next restore maps it, intact
#   migrate_torch_2gpu, migrate_llama_2gpu  (2 GPUs) the same to GPU 1, peer
#                        to peer
#   migrate_multi_gpu    (2 GPUs) gpu_counter with 1 GiB on each GPU and peer
#                        access both ways (each step reads the other GPU's
#                        memory) moved by `phosctl migrate --gpu-map 0:1,1:0`:
#                        a map leaving GPU 1 unmapped refused first (the
#                        process runs on); then each GPU's memory copied peer
#                        to peer to the other, kept by phos-keeper on both,
#                        the restored process's devices swapped, every slice
#                        re-verified on both, its peer reads intact
#   torchrun_ddp_2gpu_cow  (2 GPUs) torchrun's DDP job dumped with
#                        --leave-running and copy-on-write, default trust
#                        (checksum): NCCL's kernels reach their buffers
#                        through a work struct in device memory, which
#                        speculation does not see; a rank's image is either
#                        whole (both loss curves bitwise equal) or refused
#                        (criu fails naming the chunk), never wrong; after a
#                        refusal the job trains on intact and its next dump
#                        copies while it is stopped and restores equal
#   supervise_torch, supervise_torch_2gpu  torch_train.py under phosctl
#                        supervise, killed three times (SIGKILL, an injected
#                        GPU error, SIGKILL during a dump) and restored from
#                        its last complete image each time (onto GPU 1 in
#                        the second); the loss of every step bitwise equal
#                        to an uninterrupted run's
#   torch_import_dump    leave-running dumps of torch_train.py while Python
#                        imports torch (0.3 to 2 s after its start, its main
#                        thread in the dlopen of CUDA's and torch's
#                        libraries, as a supervisor's first checkpoint
#                        lands): each done within 5 s with the process given
#                        back; the last image restores within 5 s and the
#                        restored program trains to its last step
#   tcpstore_interop     phos's TCPStore client against torch's server (libuv
#                        and legacy), torch's client against phos's server
#   torchrun_2host, torchrun_2host_leave_running, torchrun_2host_host_fails,
#   torchrun_2host_c10d  (2 GPUs) a torchrun DDP job across two "hosts"
#                        (network namespaces, one GPU each, NCCL over
#                        sockets), each host's tree dumped by its own criu
#                        through phosctl job: stopped and restored, left
#                        running, host 1's dump failing (every rank goes
#                        on); both ranks' loss curves bitwise equal to an
#                        uninterrupted run's; the c10d rendezvous backend too
#   torchrun_4rank_2host, torchrun_4rank_2host_leave_running  (4 GPUs) the
#                        same with 2 ranks (and GPUs) per "host"
#   cuda_visible_devices (2 GPUs) a program run with CUDA_VISIBLE_DEVICES=1:
#                        its device 0 is found as GPU 1, dumped with
#                        --leave-running, restored onto GPU 1, intact
#   tp_mlp_2proc         (2 GPUs) tp_mlp.py: a tensor-parallel MLP of 2
#                        processes (torch.multiprocessing spawn), one GPU
#                        each, half of every block each; partial sums meet
#                        through NCCL all-reduce and through slots shared as
#                        CUDA IPC handles: a leave-running dump, then a dump
#                        and restore; each rank's image, the IPC slots
#                        stored once, NCCL released; both ranks' curves
#                        bitwise equal to an uninterrupted run's
#   tp_mlp_2proc_cow     the same left running with copy_on_write=always:
#                        copy-on-write for both ranks, the slots they share
#                        copied while both are stopped (each rank's protocol,
#                        shared bytes, saves and the stall on its line),
#                        curves equal; the image restored carries on equal
#   device_map_auto_2gpu (2 GPUs) llama_split.py: a Llama-shaped model (8
#                        layers, random weights) over both GPUs of one
#                        process with device_map="auto" (max_memory per GPU),
#                        greedy generate every step: a leave-running dump
#                        (its stall), then a dump and restore; the restored
#                        process on both GPUs, tokens bitwise equal
#   device_map_auto_migrate, device_map_auto_migrate_swap  the same process
#                        moved by `phosctl migrate` with a target per GPU
#                        (0=0,1=1; 0=1,1=0); skipped while phosctl has no
#                        such option
#   peer_access_2gpu     (2 GPUs) peer_access.cu: a kernel on GPU 1 reading
#                        and writing GPU 0's memory (phos's, through
#                        cuCtxEnablePeerAccess; the program's VMM memory,
#                        through cuMemSetAccess): left running, dumped and
#                        restored; outputs bitwise equal, and cuCtxGetFlags,
#                        cuDeviceCanAccessPeer, peer access enabled and
#                        cuMemGetAccess of each buffer the same after as
#                        before
#   anchor_tp_mlp_2proc, anchor_device_map_auto_2gpu, anchor_peer_access_2gpu
#                        each of the three without libphos through CRIU's
#                        cuda plugin: its line says what the plugin did
#                        (PASS, or FAIL and why); a refusal fails no case
#
# Workloads run without a pid namespace (PHOS_NO_PIDNS=1: the driver's
# exportable memory fails in one that sees the host's /proc); work dirs and
# images live on /dev/shm. Each case runs in a bash of its own under a time
# limit (lib.sh sets traps and exits on failure); its output and criu's logs
# are kept in $OUT/gpu-criu (default /tmp/gpu-criu).
# usage: criu_suite.sh [CASE...]   (default: all, in the order above)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
log=${OUT:-/tmp}/gpu-criu
bin=${PHOS_BUNDLE:-}/gpu
now() { date +%s.%N; }
dt() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", b - a}'; }

# ---- helpers of the cases (each case runs alone in its own bash) ----------

# setup WORKLOAD [RUNNER]: lib.sh for this case, its logs kept on exit, and
# its processes gone (their GPU memory free) before the next case starts.
setup() {
  export PHOS_WORKLOAD=$1 PHOS_WORKLOAD_RUNNER=${2:-} PHOS_NO_PIDNS=1
  source "$here/../e2e/lib.sh"
  TEST_NAME=$CASE
  mkdir -p "$log/$CASE"
  trap 'eval "$AT_EXIT" || true; cp "$WORK"/*.log "$WORK"/*.err "$log/$CASE/" 2>/dev/null || true
        left=$(workload_pids); cleanup; gone $left' EXIT
}
AT_EXIT=:
gone() {  # gone PID...: wait (10 s at most) until they have exited
  for p in "$@"; do
    for _ in $(seq 200); do [ -e "/proc/$p" ] || break; sleep 0.05; done
  done
}
pass() { echo "RESULT PASS $*"; exit 0; }
skip() { echo "RESULT SKIP $*"; exit 77; }

alive() { [ -e "/proc/$1" ] && [ "$(awk '/^State:/ {print $2}' "/proc/$1/status" 2>/dev/null)" != Z ]; }
field_of() { cut -d' ' -f"$2" "$1" 2>/dev/null || echo 0; }
# gpu_counter's state FILE: device counter in step with the host's, no errors
# (one read: the workload rewrites the file every step).
intact() {
  local token host device errors
  read -r token host device errors _ < "$1" || return 1
  [ "$host" = "$device" ] && [ "$errors" = 0 ]
}
# wait_above FILE N SECONDS: the counter in FILE passes N in time.
wait_above() {
  for _ in $(seq "$(awk -v s="$3" 'BEGIN {print int(s * 20 + 0.5)}')"); do
    [ "$(field_of "$1" 2)" -gt "$2" ] 2>/dev/null && return 0
    sleep 0.05
  done
  return 1
}
# carried_on FILE TOKEN MIB: counts on past a re-verification of all its
# device memory, same token, intact (else fail); says so in CARRIED.
carried_on() {
  local at slices=$((($3 + 63) / 64))
  at=$(field_of "$1" 2)
  wait_above "$1" $((at + slices + 5)) $((slices / 20 + 20)) || fail "$(basename "$1"): counter stuck at $(field_of "$1" 2)"
  [ "$(field_of "$1" 1)" = "$2" ] || fail "$(basename "$1"): token changed"
  intact "$1" || fail "$(basename "$1"): device memory not intact: $(cat "$1")"
  CARRIED="counter $at -> $(field_of "$1" 2), all $slices slices re-verified, 0 errors"
}
phos_error() { grep -o "phos: Error: .*" "$1" | head -n1 || true; }
# What the plugin wrote: "N allocations, M MiB".
phos_wrote() { grep -o "wrote phos-[0-9]*-manifest.img ([^)]*)" "$WORK/dump.log" | sed 's/.*(//; s/)//' | paste -sd'|' | sed 's/|/ + /g' || true; }

# reach STEP SECONDS WHEN: the workload's counter passes STEP in time, else
# fail (at once if it died) with what it left in STATE.error (gpu_steps,
# torch_train.py).
reach() {
  local i
  for i in $(seq $(($2 * 10))); do
    wait_above "$WORK/state" "$1" 0.1 && return 0
    [ -n "$(workload_pids)" ] || { wait_above "$WORK/state" "$1" 0.2 && return 0; break; }
  done
  fail "$3: stuck at step $(state_counter 2>/dev/null), process $([ -n "$(workload_pids)" ] && echo running || echo gone); $(tail -n 3 "$WORK/state.error" 2>/dev/null | tr '\n' ' ')"
}

# The size of criu's own images (the process's memory and state).
criu_mib() { find "$IMG" -maxdepth 1 -type f ! -name 'phos-*' -printf '%s\n' | awk '{s += $1} END {printf "%.1f", s / 1048576}'; }

# dump_restore: criu dump, then restore into a new process; sets DUMPED,
# TOKEN, DUMP_S, RESTORE_S.
dump_restore() {
  local t0 t1 t2 t3
  TOKEN=$(state_token)
  t0=$(now); criu_dump || fail "criu dump failed (rc $?)"; t1=$(now)
  DUMPED=$(state_counter)
  sleep 0.2
  [ -z "$(workload_pids)" ] || fail "process still running after the dump"
  wait_pid_free
  t2=$(now); criu_restore || fail "criu restore failed (rc $?)"; t3=$(now)
  restored_pid >/dev/null || fail "no restored process"
  DUMP_S=$(dt "$t0" "$t1") RESTORE_S=$(dt "$t2" "$t3")
}

# ---- cases -----------------------------------------------------------------

pattern() {  # pattern MIB
  local out rc
  out=$(bash "$here/checkpoint.sh" "$1" 2>&1); rc=$?
  echo "$out"
  [ $rc -eq 0 ] || exit $rc
  pass "$(grep -o 'leave-running dump in [0-9.]* s' <<<"$out"); $(grep -o '\] dump in [0-9.]* s, restore in [0-9.]* s' <<<"$out" | cut -c3-); all $((($1 + 63) / 64)) slices re-verified; corrupted chunk refused"
}
case_pattern_1GiB() { pattern 1024; }
case_pattern_8GiB() { pattern 8192; }
case_pattern_32GiB() { pattern 32768; }

# sparse_dump_restore MIB LIVE: dump_restore of the running gpu_counter, its
# image's figures in SPARSE (phosctl show --json: stored and zero bytes), the
# process carried on intact.
sparse_dump_restore() {
  dump_restore
  SPARSE=$("$PHOSCTL" show --json "$IMG" | python3 -c '
import json, sys
m = json.load(sys.stdin)["images"][0]
s = m["size"]
print(m["format_version"], s["stored_bytes"] >> 20, s["zero_chunks"], s["zero_bytes"] >> 20)') ||
    fail "phosctl show --json failed"
  carried_on "$WORK/state" "$TOKEN" "$1"
}
case_sparse_8GiB() {
  local mib=8192 live=256 version stored zero zero_mib
  setup "$bin/gpu_counter"
  start_workload --preload $mib --live $live
  wait_counter_above 5 60
  sparse_dump_restore $mib
  read -r version stored zero zero_mib <<<"$SPARSE"
  local chunks=$(((mib - live) / 4))  # 4 MiB chunks of zeros
  # 7: the chunks' fingerprints (2 would hold its zero chunks).
  [ "$version" = 7 ] || fail "the sparse image has format version $version, expected 7"
  [ "$zero" -ge "$chunks" ] || fail "$zero zero chunks, expected at least $chunks"
  [ "$stored" -lt $((live + 64)) ] || fail "$stored MiB stored for $live MiB of data"
  grep -q "every chunk's CRC-32C computed on the GPU" "$WORK/dump.log" ||
    fail "the GPU checksum kernel did not take every chunk: $(grep -o 'phos: process [0-9]*: [0-9]* of [0-9]* chunk copies.*' "$WORK/dump.log")"
  grep -q "every chunk's fingerprint taken on the GPU" "$WORK/dump.log" ||
    fail "the GPU fingerprint kernel did not take every chunk: $(grep -o 'phos: process [0-9]*: [0-9]* of [0-9]* chunk copies. fingerprints.*' "$WORK/dump.log")"
  grep -q "[0-9]* of [0-9]* chunks zero, set with a memset" "$WORK/restore.log" || fail "the restore log counts no zero chunks"
  local sparse="sparse: $stored MiB stored, $zero zero chunks ($zero_mib MiB), dump $DUMP_S s, restore $RESTORE_S s; $CARRIED"
  # The restored process again, its zeros written out this time.
  rm -rf "$IMG" && mkdir "$IMG"
  PHOS_SPARSE=off sparse_dump_restore $mib
  read -r version stored zero zero_mib <<<"$SPARSE"
  [ "$version" = 7 ] && [ "$zero" = 0 ] && [ "$stored" -ge $mib ] ||
    fail "sparse=off: format version $version, $zero zero chunks, $stored MiB stored"
  pass "$mib MiB, $live MiB of data; $sparse; sparse=off: $stored MiB stored, dump $DUMP_S s, restore $RESTORE_S s"
}

case_incremental_8GiB() {
  local mib=8192 stored1 stored2 refs t0 t1
  setup "$bin/gpu_counter"
  start_workload --preload $mib
  wait_counter_above 5 60
  TOKEN=$(state_token)
  local img1=$WORK/img1 img2=$WORK/img2
  mkdir -p "$img1" "$img2"
  IMG=$img1 criu_dump --leave-running || fail "img1: criu dump failed: $(phos_error "$WORK/dump.log")"
  wait_above "$WORK/state" $(($(state_counter) + 5)) 30 || fail "stuck after img1"
  t0=$(now)
  IMG=$img2 PHOS_PARENT_IMAGE=../img1 criu_dump --leave-running || fail "img2: criu dump failed: $(phos_error "$WORK/dump.log")"
  t1=$(now)
  # Unchanged: size, CRC-32C and the fingerprint the GPU took, all equal.
  grep -q "every chunk's fingerprint taken on the GPU" "$WORK/dump.log" ||
    fail "img2: not every chunk fingerprinted on the GPU: $(grep -o 'phos: process [0-9]*: [0-9]* of [0-9]* chunk copies. fingerprints.*' "$WORK/dump.log")"
  local of='import json,sys; m=json.load(sys.stdin)["images"][0]; print(m["size"]["stored_bytes"] >> 20, m["chain"][0]["referenced_chunks"])'
  read -r stored1 _ <<<"$("$PHOSCTL" show --json "$img1" | python3 -c "$of")"
  read -r stored2 refs <<<"$("$PHOSCTL" show --json "$img2" | python3 -c "$of")"
  [ "$stored2" -lt 64 ] || fail "img2 stores $stored2 MiB against img1's $stored1 MiB ($refs chunks referenced)"
  kill -9 "$WORKLOAD_PID"; wait_pid_free
  IMG=$img2 criu_restore || fail "restore from img2 failed: $(phos_error "$WORK/restore.log")"
  restored_pid >/dev/null || fail "no restored process"
  carried_on "$WORK/state" "$TOKEN" $mib
  pass "img1 $stored1 MiB, img2 (incremental) $stored2 MiB, $refs chunks referenced, dumped in $(dt "$t0" "$t1") s; restored from img2: $CARRIED"
}

steps_case() {  # steps_case MODE: gpu_steps, dumped at step ~100 of 300
  local mode=$1 n=300
  setup "$bin/gpu_steps"
  export CUBLAS_WORKSPACE_CONFIG=:4096:8
  timeout 120 env LD_PRELOAD="$LIBPHOS" "$COUNTER" "$WORK/ref.state" "$mode" --steps $n --pace-ms 0 \
    --log "$WORK/ref.steps" > "$WORK/reference.log" 2>&1 || fail "the reference run failed (rc $?)"
  start_workload --preload "$mode" --steps $n --log "$WORK/run.steps"
  reach 100 60 "before the dump"
  dump_restore
  reach $((n - 1)) 60 "after the restore"
  [ "$(state_token)" = "$TOKEN" ] || fail "token changed"
  cmp -s "$WORK/ref.steps" "$WORK/run.steps" ||
    fail "checksums differ from the uninterrupted run's from step $(diff "$WORK/ref.steps" "$WORK/run.steps" | grep -m1 -o '^[<>] [0-9]*' | cut -c3-) on (dumped at step $DUMPED)"
  pass "checksums of all $n steps equal an uninterrupted run's (dumped at step $DUMPED, final $(state_field 3)); dump $DUMP_S s, restore $RESTORE_S s; image $(phos_wrote)"
}
case_cublas() { steps_case cublas; }
case_cuda_graph() { steps_case graph; }

# TORCH_SCRIPT: the workload (torch_train.py; torch_ddp_job.py for a job of
# several processes, whose ranks past 0 write LOSSES.rR, compared too).
# The per-process table of a job's stall and restore (job_breakdown.py),
# into $log/CASE.breakdown.md, for a dump of several processes of a job.
job_breakdown() {
  grep -q "ranks (pids [0-9 ]*) held before call" "$WORK/dump.log" 2>/dev/null || return 0
  # shellcheck disable=SC2086  # REBUILT_ARGS: separate words
  python3 "$here/job_breakdown.py" "$WORK/dump.log" "$WORK/restore.log" ${REBUILT_ARGS:-} > "$log/$CASE.breakdown.md" 2>&1 || true
}
# The driver checkpoints and restores made for several processes at once
# (driver_parallel), from criu's logs, comma-separated.
driver_batches() {
  { grep -aho 'driver \(checkpoint\|restore\) of [0-9]* processes [a-z ]*: [0-9.]* ms' "$WORK/dump.log" "$WORK/restore.log" 2>/dev/null || true; } | paste -sd, -
}
torch_case() {  # torch_case [ENV=VALUE...]: 150 steps, dumped after step 40
  local n=150 script=${TORCH_SCRIPT:-$here/torch_train.py}
  # The interpreter's own path: what the process's command line shows (a
  # launcher such as pyenv's would exec it under another name).
  setup "$script" "$(python3 -c 'import sys; print(sys.executable)')"
  export CUBLAS_WORKSPACE_CONFIG=:4096:8 "$@"
  timeout 180 env LD_PRELOAD="$LIBPHOS" python3 "$script" "$WORK/ref.state" "$WORK/ref.losses" $n 0 \
    > "$WORK/reference.log" 2>&1 || fail "the reference run failed (rc $?)"
  start_workload --preload "$WORK/run.losses" $n
  reach 40 120 "before the dump"
  dump_restore
  if [ "${PHOS_TEST_DDP:-}" = 1 ]; then
    # Each rank's rebuild, from its agent (the launcher has none), once
    # the restored job trains.
    reach $((DUMPED + 5)) 120 "after the restore"
    local p us
    REBUILT= REBUILT_ARGS=
    # Every process of the job names its state file (torchrun's ranks run
    # as "python -u SCRIPT ...", which workload_pids does not match).
    for p in $(pgrep -f -- "$WORK/state" || true); do
      us=$("$PHOSCTL" status "$p" 2>/dev/null | grep -o 'nccl_last_rebuild_us: [0-9]*' | grep -o '[0-9]*$' || true)
      [ -n "$us" ] && REBUILT="${REBUILT:+$REBUILT, }$us us" && REBUILT_ARGS="$REBUILT_ARGS --rebuilt $p=$us"
    done
  fi
  reach $((n - 1)) 120 "after the restore"
  [ "$(state_token)" = "$TOKEN" ] || fail "token changed"
  cmp -s "$WORK/ref.losses" "$WORK/run.losses" ||
    fail "loss curve differs from the uninterrupted run's from step $(diff "$WORK/ref.losses" "$WORK/run.losses" | grep -m1 -o '^[<>] [0-9]*' | cut -c3-) on (dumped at step $DUMPED)"
  local lazy= r
  for r in "$WORK"/ref.losses.r*; do
    [ -e "$r" ] || continue
    cmp -s "$r" "$WORK/run.losses.${r##*.}" || fail "rank ${r##*.r}'s loss curve differs from the uninterrupted run's"
    lazy="$lazy; rank ${r##*.r}'s loss curve equal too"
  done
  if grep -q "ranks (pids [0-9 ]*) held before call" "$WORK/dump.log"; then
    lazy="$lazy; $(grep -o 'its [0-9]* ranks (pids [0-9 ]*) held before call [0-9]* in [0-9.]* ms' "$WORK/dump.log" | head -n1)"
  fi
  # Several processes with CUDA state: their driver checkpoints and restores
  # at once (driver_parallel), and the stall's breakdown of each rank.
  local at_once
  at_once=$(driver_batches)
  [ -n "$at_once" ] && lazy="$lazy; $at_once"
  job_breakdown
  if [ "${PHOS_SDK_STEP:-}" = 1 ]; then
    grep -q "gate closed at the program's iteration boundary (phos_step)" "$WORK/dump.log" ||
      fail "the dump did not land on the program's iteration boundary (phos.step())"
    lazy="; the dump landed on the program's iteration boundary (phos.step())"
  fi
  [ -n "${PHOS_TEST_SCRATCH_MIB:-}" ] && lazy="$lazy; $(dead_memory_seen)"
  if [ "${PHOS_TEST_DDP:-}" = 1 ]; then
    grep -q "NCCL communicator(s) released in" "$WORK/dump.log" || fail "the dump log says no NCCL communicator was released"
    lazy="$lazy; $(grep -o '[0-9]* NCCL communicator(s) released in [0-9.]* ms' "$WORK/dump.log" | paste -sd, -), made again after the restore in ${REBUILT:-?}"
  fi
  if [ "${PHOS_LAZY_RESTORE:-}" = on ]; then
    grep -q "on-demand restore: [0-9]* allocations in the recorded order first" "$WORK/restore.log" || fail "no on-demand restore in the log"
    # (set -e and pipefail: a line that is not there must not end the case)
    lazy="$lazy; on demand: $(grep -o 'gate open [0-9.]*' "$WORK/restore.log" | tail -n1 || true) ms, $(grep -o 'all GPU data in at [0-9.]* ms' "$WORK/restore.log" | tail -n1 || true), $(grep -o '[0-9]* calls checked, [0-9]* waited ([0-9]* for the whole fill)' "$WORK/restore.log" | tail -n1 || echo 'no fill window: the fill ended first')"
  fi
  pass "loss curve of $n steps bitwise equal to an uninterrupted run's (dumped at step $DUMPED, final loss $(tail -n1 "$WORK/run.losses" | cut -d' ' -f2)); dump $DUMP_S s, restore $RESTORE_S s; criu's images $(criu_mib) MiB, GPU image $(phos_wrote)$lazy"
}
# dead_memory_seen: the dump stored none of the scratch phos.step() handed
# as free (PHOS_TEST_SCRATCH_MIB, at least its size less two chunks), the
# image says so, and the restore left it unfilled; what it saw, on one line.
dead_memory_seen() {
  local line mib shown
  line=$(grep -o "[0-9]* free ranges of its allocator at its iteration boundary ([0-9.]* MiB): [0-9]* whole chunks ([0-9.]* MiB) dead" "$WORK/dump.log" | tail -n1) ||
    fail "no dead memory in the dump: $(grep -o "its allocator's free blocks not used.*" "$WORK/dump.log" | head -n1)"
  mib=$(grep -o '([0-9.]* MiB) dead' <<< "$line" | grep -o '[0-9]*' | head -n1)
  [ "${mib:-0}" -ge $((PHOS_TEST_SCRATCH_MIB - 8)) ] || fail "only $mib MiB dead, the scratch is $PHOS_TEST_SCRATCH_MIB MiB: $line"
  shown=$("$PHOSCTL" show "$IMG" | grep -o '[0-9]* dead chunks ([0-9.]* [KMG]iB)') || fail "phosctl show does not say what was dead"
  grep -q "dead chunks ([0-9.]* MiB), free in its allocator at the checkpoint, left unfilled" "$WORK/restore.log" ||
    fail "the restore does not say it left the dead chunks unfilled"
  echo "dead memory: $line; the image: $shown; the restore left them unfilled"
}

# torch_cow_case [ENV=VALUE...]: a leave-running dump with copy-on-write
# (its whole copy while the program trains on, 5 ms between steps; default
# trust: checksum); the program's own loss curve and the curve of its image,
# restored, both equal the uninterrupted run's; the bytes saved
# copy-on-write go in the result. COW_REFUSAL_OK=1: a refused image (a copy
# that differs from the freeze) is allowed, never a wrong one: the program
# must then train on intact, and its next dump, which copies while it is
# stopped, is the one restored.
torch_cow_case() {
  local n=150 script=${TORCH_SCRIPT:-$here/torch_train.py}
  setup "$script" "$(python3 -c 'import sys; print(sys.executable)')"
  export CUBLAS_WORKSPACE_CONFIG=:4096:8 "$@"
  timeout 180 env LD_PRELOAD="$LIBPHOS" python3 "$script" "$WORK/ref.state" "$WORK/ref.losses" $n 0 \
    > "$WORK/reference.log" 2>&1 || fail "the reference run failed (rc $?)"
  start_workload --preload "$WORK/run.losses" $n 5
  reach 40 120 "before the dump"
  TOKEN=$(state_token)
  local saved waited refused='' checked
  if ! PHOS_COPY_ON_WRITE=always criu_dump --leave-running; then
    grep -qE "(differs from its|differ from their) content at the freeze" "$WORK/dump.log" ||
      fail "criu dump --leave-running failed: $(phos_error "$WORK/dump.log")"
    [ -n "${COW_REFUSAL_OK:-}" ] || fail "copy-on-write refused the image: $(phos_error "$WORK/dump.log")"
    refused=$(phos_error "$WORK/dump.log" | cut -c1-600)
    cp "$WORK/dump.log" "$log/$CASE/dump.refused.log" 2>/dev/null || true
    say "refused: $refused"
    ls "$IMG"/phos-*-complete.img >/dev/null 2>&1 && fail "a refused dump left a completion marker"
    # The job trains on; its next dump copies while the refused process is stopped.
    reach $(($(state_counter) + 3)) 120 "after the refused dump"
    rm -rf "${IMG:?}"/*
    PHOS_COPY_ON_WRITE=always criu_dump --leave-running ||
      fail "the dump after a refusal failed: $(phos_error "$WORK/dump.log")"
    grep -q "an earlier dump of it found a write that speculation missed" "$WORK/dump.log" ||
      fail "the dump after a refusal did not copy the refused process while it was stopped"
  fi
  saved=$(grep -o '[0-9]* chunks ([0-9.]* MiB) saved' "$WORK/dump.log" | head -n1)
  waited=$(grep -o '[0-9]* calls waited ([0-9]* with an unknown write set) [0-9.]* ms' "$WORK/dump.log" | head -n1)
  checked=$(grep -o 'checksum: [0-9]* chunks equal to the freeze' "$WORK/dump.log" | paste -sd, - || true)
  [ -n "$saved" ] || fail "no copy-on-write window in the dump"
  reach $((n - 1)) 120 "after the leave-running dump"
  gone "$(workload_pids)"
  cmp -s "$WORK/ref.losses" "$WORK/run.losses" || fail "the checkpointed program's loss curve differs from the uninterrupted run's"
  criu_restore || fail "criu restore failed: $(phos_error "$WORK/restore.log")"
  restored_pid >/dev/null || fail "no restored process"
  # The restored program appends from the step after its freeze on.
  for _ in $(seq 2400); do [ "$(tail -n1 "$WORK/run.losses" | cut -d' ' -f1)" = $n ] && [ "$(wc -l < "$WORK/run.losses")" -gt $n ] && break; sleep 0.05; done
  local first; first=$(sed -n "$((n + 1))p" "$WORK/run.losses" | cut -d' ' -f1)
  [ -n "$first" ] || fail "the restored program wrote no loss"
  tail -n +$((n + 1)) "$WORK/run.losses" > "$WORK/restored.losses"
  tail -n +"$first" "$WORK/ref.losses" | cmp -s - "$WORK/restored.losses" ||
    fail "the restored image's loss curve differs from the uninterrupted run's (frozen at step $((first - 1)))"
  local stalls at_once dead= pages
  stalls=$(grep -o 'gate reopened after [0-9.]* ms' "$WORK/dump.log" | grep -o '[0-9.]* ms' | paste -sd/ - || true)
  at_once=$(driver_batches)
  # criu's CPU pages: copied before the resume (contrib/criu/0005) or written.
  pages=$(criu_pages "$WORK/dump.log")
  job_breakdown
  [ -n "${PHOS_TEST_SCRATCH_MIB:-}" ] && dead=$(dead_memory_seen)
  pass "loss curves of the checkpointed program and of its image restored (frozen at step $((first - 1))) bitwise equal to an uninterrupted run's; $saved into the pool, $waited; ${checked:-no copy checked by checksum}${refused:+; the first dump refused ($refused), the next copied while stopped}; stall ${stalls:-?}$(grep -o ", criu's CPU dump [0-9.]* ms" "$WORK/dump.log" | head -n1)${pages:+; criu pages: $pages}${at_once:+; $at_once}${dead:+; $dead}"
}
case_torch_cow() { torch_cow_case; }

# cow_cublas_workspace: issue 29's inference servers in small. cuBLAS's
# split-K GEMMs write the workspace the program set (PyTorch sets one on
# every handle): with it out of the GEMM's exact set, its chunk differed
# from the freeze and checksum trust refused every image.
case_cow_cublas_workspace() {
  local n=${PHOS_COW_CUBLAS_STEPS:-8000} mib=${PHOS_COW_CUBLAS_MIB:-2048} written
  setup "$bin/gpu_steps"
  unset CUBLAS_WORKSPACE_CONFIG PHOS_COW_TRUST
  local args=(splitk --steps "$n" --ballast-mib "$mib")
  timeout 300 env LD_PRELOAD="$LIBPHOS" "$COUNTER" "$WORK/ref.state" "${args[@]}" --pace-ms 0 --log "$WORK/ref.steps" \
    > "$WORK/reference.log" 2>&1 || fail "the reference run failed (rc $?): $(cat "$WORK/ref.state.error" 2>/dev/null)"
  written=$(cat "$WORK/ref.state.workspace" 2>/dev/null)
  [ "$(cut -d' ' -f2 <<< "$written")" -gt 0 ] 2>/dev/null ||
    fail "cuBLAS did not write the workspace for these shapes (${written:-no probe}): the case would test nothing"
  start_workload --preload "${args[@]}" --pace-ms 1 --log "$WORK/run.steps"
  reach 200 120 "before the dump"
  TOKEN=$(state_token)
  PHOS_COPY_ON_WRITE=always criu_dump --leave-running ||
    fail "criu dump --leave-running failed: $(phos_error "$WORK/dump.log" | cut -c1-800)"
  ls "$IMG"/phos-*-complete.img >/dev/null 2>&1 || fail "no completion marker"
  local saved checked stalls
  saved=$(grep -o '[0-9]* chunks ([0-9.]* MiB) saved' "$WORK/dump.log" | head -n1)
  checked=$(grep -o 'checksum: [0-9]* chunks equal to the freeze' "$WORK/dump.log" | paste -sd, - || true)
  stalls=$(grep -o 'gate reopened after [0-9.]* ms' "$WORK/dump.log" | grep -o '[0-9.]* ms' | paste -sd/ - || true)
  [ -n "$saved" ] || fail "no copy-on-write window in the dump"
  [ -n "$checked" ] || fail "the copy was not checked by checksum (the default)"
  reach $((n - 1)) 300 "after the leave-running dump"
  gone "$(workload_pids)"
  [ "$(state_token)" = "$TOKEN" ] || fail "token changed"
  cmp -s "$WORK/ref.steps" "$WORK/run.steps" || fail "the checkpointed program's checksums differ from the uninterrupted run's"
  criu_restore || fail "criu restore failed: $(phos_error "$WORK/restore.log")"
  restored_pid >/dev/null || fail "no restored process"
  # The restored program appends from the step after its freeze on.
  for _ in $(seq 2400); do [ "$(tail -n1 "$WORK/run.steps" | cut -d' ' -f1)" = "$n" ] && [ "$(wc -l < "$WORK/run.steps")" -gt "$n" ] && break; sleep 0.05; done
  local first; first=$(sed -n "$((n + 1))p" "$WORK/run.steps" | cut -d' ' -f1)
  [ -n "$first" ] || fail "the restored program logged no step"
  [ "$(tail -n1 "$WORK/run.steps" | cut -d' ' -f1)" = "$n" ] || fail "the restored program stopped at step $(tail -n1 "$WORK/run.steps" | cut -d' ' -f1): $(cat "$WORK/state.error" 2>/dev/null)"
  tail -n +$((n + 1)) "$WORK/run.steps" | cmp -s - <(tail -n +"$first" "$WORK/ref.steps") ||
    fail "the restored image's checksums differ from the uninterrupted run's (frozen at step $((first - 1)))"
  pass "$written bytes of the workspace written by a GEMM; image complete: $saved into the pool, $checked; stall ${stalls:-?}; the checkpointed program's $n checksums and its image's restored (frozen at step $((first - 1))) bitwise equal to an uninterrupted run's"
}
case_torch_cow_async() { torch_cow_case PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync; }

# supervise_torch: torch_train.py under `phosctl supervise` (a leave-running
# checkpoint every 3 s, --keep 2), killed three times: SIGKILL; a GPU error
# injected (PHOS_FAULT=gpu-error: once its trigger file appears, libphos.so
# fails every launch and copy with CUDA_ERROR_ILLEGAL_ADDRESS and PyTorch's
# error ends the program with status 1); SIGKILL during a dump (held in
# CHECKPOINT_DEVICES by PHOS_FAULT=stall-after-checkpoint, for that dump
# only). Brought back each time from its last complete image (GPU_MAP, e.g.
# 0=1, puts it on another GPU); the loss of every step, those re-run after a
# restore included, bitwise equal to an uninterrupted run's.
supervised_torch() {  # supervised_torch [--gpu-map MAP]
  local n=3000 script=$here/torch_train.py sup ckpt n_dumps stalled prev same
  setup "$script" "$(python3 -c 'import sys; print(sys.executable)')"
  sup=$WORK/supervise.log  # WORK comes with setup
  export CUBLAS_WORKSPACE_CONFIG=:4096:8
  timeout 300 env LD_PRELOAD="$LIBPHOS" python3 "$script" "$WORK/ref.state" "$WORK/ref.losses" $n 0 \
    > "$WORK/reference.log" 2>&1 || fail "the reference run failed (rc $?)"
  # The supervisor reaps its job and what criu restores at once (a child
  # subreaper): no pid namespace, the restored job keeps its pid.
  "$PHOSCTL" supervise --dir "$WORK/ckpt" --lib "$PLUGIN_DIR" --criu "$CRIU" --interval 3s --first 8s --keep 2 \
    --max-restarts 3 --dump-env PHOS_FAULT=stall-after-checkpoint --dump-env PHOS_FAULT_FILE="$WORK/stall" "$@" \
    -- env LD_PRELOAD="$LIBPHOS" PHOS_FAULT=gpu-error PHOS_FAULT_FILE="$WORK/gpu-fault" \
    "$PHOS_WORKLOAD_RUNNER" "$script" "$WORK/state" "$WORK/run.losses" $n 20 > "$sup" 2>&1 &
  local sup_pid=$!
  # The series' logs (each image's dump.log and restore.log, the last
  # failed dump's) kept beside the case's.
  AT_EXIT="kill -9 $sup_pid 2>/dev/null; cp \"\$WORK/ckpt/last-failed-dump.log\" \"\$log/\$CASE/\" 2>/dev/null;
    for d in \"\$WORK\"/ckpt/0*/; do for f in \"\$d\"*.log; do cp \"\$f\" \"\$log/\$CASE/\$(basename \"\$d\")-\$(basename \"\$f\")\"; done; done 2>/dev/null; true"
  wait_line "$sup" "checkpoint 1 complete" 1 120
  kill -9 "$(workload_pids | head -n1)"
  wait_line "$sup" "restart 1 of 3: restored from" 1 120
  wait_line "$sup" "complete in" $(($(grep -c "complete in" "$sup") + 1)) 120  # an image of the restored job
  touch "$WORK/gpu-fault"
  wait_line "$sup" "exited with status 1" 1 60
  grep -q "illegal memory access" "$WORK/state.error" || fail "the job did not end on the injected error: $(tail -n 2 "$WORK/state.error")"
  wait_line "$sup" "restart 2 of 3: restored from" 1 120
  wait_line "$sup" "complete in" $(($(grep -c "complete in" "$sup") + 1)) 120
  n_dumps=$(grep -c "dumping" "$sup")
  touch "$WORK/stall"
  wait_line "$sup" "dumping" $((n_dumps + 1)) 60
  stalled=$(grep "dumping" "$sup" | tail -n1 | grep -o "$WORK/ckpt/[0-9]*")
  prev=$(grep -o "complete in $WORK/ckpt/[0-9]*" "$sup" | tail -n1 | grep -o "$WORK/ckpt/[0-9]*$")
  wait_line "$stalled/dump.log" "stalling CHECKPOINT_DEVICES" 1 60
  kill -9 "$(workload_pids | head -n1)"
  rm -f "$WORK/stall"
  wait_line "$sup" "(the job died during it); the last complete image stays" 1 60
  wait_line "$sup" "restart 3 of 3: restored from $prev " 1 120
  [ ! -e "$stalled" ] || fail "the failed dump's directory is still there"
  wait_line "$sup" "finished (status 0) after 3 restarts" 1 300
  wait "$sup_pid" || fail "the supervisor exited with status $?"
  same=$(python3 "$here/../e2e/same_steps.py" "$WORK/ref.losses" "$WORK/run.losses" 2>&1) ||
    fail "the loss curve differs from the uninterrupted run's: $same"
  pass "killed 3 times (SIGKILL; injected GPU error, exit 1; SIGKILL during the dump into $(basename "$stalled")), restored 3 times (the last from $(basename "$prev")) in $(grep -o 'restored from [^ ]* in [0-9.]* s' "$sup" | awk '{print $(NF-1)}' | paste -sd/) s${1:+ with $*}; loss curve of $n steps bitwise equal to an uninterrupted run's ($same); checkpoints: $(grep -c 'complete in' "$sup"), stall $(grep -o 'the job stopped [0-9.]*' "$sup" | head -n1 | awk '{print $4}') s"
}
case_supervise_torch() { supervised_torch; }

# torch_import_dump: see the list of cases. A dump whose give-back cannot
# happen (the agent waiting for a lock a stopped thread holds) fails within
# a second saying where each thread was (addr2line the LIBRARY+0xOFFSET
# places in dump.log).
case_torch_import_dump() {
  local n=60 script=$here/torch_train.py at t0 took early=0 pid
  setup "$script" "$(python3 -c 'import sys; print(sys.executable)')"
  export CUBLAS_WORKSPACE_CONFIG=:4096:8 CRIU_TIMEOUT=60
  timeout 180 env LD_PRELOAD="$LIBPHOS" python3 "$script" "$WORK/ref.state" "$WORK/ref.losses" $n 0 \
    > "$WORK/reference.log" 2>&1 || fail "the reference run failed (rc $?)"
  for at in 0.3 0.6 1.0 2.0; do
    [ -z "$(workload_pids)" ] || { kill -9 $(workload_pids); gone $(workload_pids); }
    rm -f "$WORK/state" "$WORK/run.losses" && rm -rf "${IMG:?}"/*
    (setsid env LD_PRELOAD="$LIBPHOS" "$PHOS_WORKLOAD_RUNNER" "$script" "$WORK/state" "$WORK/run.losses" $n 20 \
       </dev/null >"$WORK/run.log" 2>&1 &)
    sleep "$at"
    WORKLOAD_PID=$(pgrep -o -f "$MATCH") || fail "at $at s: the program is not running: $(tail -n 3 "$WORK/run.log")"
    [ -s "$WORK/state" ] || early=$((early + 1))  # no step yet: importing, or making its model
    t0=$(date +%s%N)
    criu_dump --leave-running || fail "at $at s: criu dump --leave-running failed: $(criu_errors "$WORK/dump.log")"
    took=$((($(date +%s%N) - t0) / 1000000))
    cp "$WORK/dump.log" "$log/$CASE/dump-at-$at.log"
    ! grep -q "could not give back" "$WORK/dump.log" ||
      fail "at $at s: the process was not given back: $(grep -o 'could not give back.*' "$WORK/dump.log" | head -n1)"
    [ "$took" -lt 5000 ] || fail "at $at s: the leave-running dump took $took ms"
    reach 3 120 "at $at s, after the dump"
    echo "dump at $at s after the start: $took ms, given back"
  done
  [ "$early" -ge 1 ] || fail "no dump landed before the program's first step (its import was faster than 0.3 s)"
  # The last image (taken before or at the first steps): restored, the
  # program trains to the end; its losses from the restored run only.
  kill -9 "$WORKLOAD_PID" && gone "$WORKLOAD_PID"
  rm -f "$WORK/run.losses" "$WORK/state"
  t0=$(date +%s%N)
  criu_restore || fail "restore of the image taken at $at s failed: $(criu_errors "$WORK/restore.log")"
  took=$((($(date +%s%N) - t0) / 1000000))
  [ "$took" -lt 5000 ] || fail "the restore took $took ms"
  reach $((n - 1)) 180 "after the restore"
  pass "4 leave-running dumps 0.3-2 s after the start ($early before the first step), each given back within 5 s; the last restored in $took ms and trained to step $n"
}
case_supervise_torch_2gpu() {  # (2 GPUs) each restore onto GPU 1
  [ "$(nvidia-smi -L | wc -l)" -ge 2 ] || skip "needs 2 GPUs"
  supervised_torch --gpu-map 0=1
}
case_torch_mlp() { torch_case; }
case_torch_mlp_expandable() { torch_case PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; }
# The same restored on demand: its memory filled in address order, not the
# order its kernels read it; the loss curve must still be bitwise equal.
case_lazy_torch_mlp() { torch_case PHOS_LAZY_RESTORE=on; }
# The SDK's phos.step() at each iteration: the dump lands on a boundary.
case_sdk_torch_step() { torch_case PHOS_SDK_STEP=1; }
# The same with 256 MiB of scratch taken and let go in each iteration: at
# phos.step() it is a free block of the caching allocator, which the image
# does not store and the restore leaves unfilled; the loss curve is still
# bitwise equal (no live byte was lost). Stopped, and left running with
# copy-on-write.
case_torch_dead_memory() { torch_case PHOS_SDK_STEP=1 PHOS_TEST_SCRATCH_MIB=256; }
case_torch_cow_dead_memory() { torch_cow_case PHOS_SDK_STEP=1 PHOS_TEST_SCRATCH_MIB=256; }
# DistributedDataParallel in a job of one rank: an NCCL communicator of one
# rank, its all-reduce in every step (issue 17's first real NCCL case).
case_torch_ddp_one_rank() { torch_case PHOS_TEST_DDP=1; }
# The same, left running with copy-on-write: the communicator is made again
# at once, the job trains on through it.
case_torch_ddp_one_rank_cow() { torch_cow_case PHOS_TEST_DDP=1; }
# The anchor beside it: the same training without phos, dumped and restored
# through CRIU's cuda plugin (cuda-checkpoint on PATH). NCCL's communicator
# stays in the process, its TCP sockets too (connected to the process
# itself; hence --tcp-established). The line says what it did.
anchor_torch_case() {  # anchor_torch_case [ENV=VALUE...]
  local n=150 script=${TORCH_SCRIPT:-$here/torch_train.py}
  [ -f "$PHOS_BUNDLE/criu/cuda_plugin.so" ] || skip "no cuda_plugin.so in the bundle"
  setup "$script" "$(python3 -c 'import sys; print(sys.executable)')"
  # CRIU with cuda-checkpoint is known to hang on NCCL: two minutes a run.
  export CUBLAS_WORKSPACE_CONFIG=:4096:8 PATH=$PHOS_BUILD/test/bench:$PATH CRIU_TIMEOUT=${CRIU_TIMEOUT:-120} "$@"
  timeout 180 python3 "$script" "$WORK/ref.state" "$WORK/ref.losses" $n 0 > "$WORK/reference.log" 2>&1 ||
    fail "the reference run failed (rc $?)"
  rm -f "$PLUGIN_DIR"/*.so && ln -s "$PHOS_BUNDLE/criu/cuda_plugin.so" "$PLUGIN_DIR/"
  start_workload "$WORK/run.losses" $n
  reach 40 120 "before the dump"
  TOKEN=$(state_token)
  local t0 t1 t2 t3
  t0=$(now)
  criu_dump --tcp-established || fail "CRIU's cuda plugin: the dump failed: $(grep -E 'Error' "$WORK/dump.log" | grep -v rlimit | head -n3 | cut -c1-200 | tr '\n' ' ')"
  t1=$(now)
  DUMPED=$(state_counter)
  wait_pid_free
  t2=$(now)
  criu_restore --tcp-established || fail "CRIU's cuda plugin: the restore failed: $(grep -E 'Error' "$WORK/restore.log" | grep -v rlimit | head -n3 | cut -c1-200 | tr '\n' ' ')"
  t3=$(now)
  reach $((n - 1)) 120 "after the restore (CRIU's cuda plugin)"
  cmp -s "$WORK/ref.losses" "$WORK/run.losses" || fail "CRIU's cuda plugin: the loss curve differs from the uninterrupted run's"
  pass "CRIU's cuda plugin: loss curve of $n steps bitwise equal (dumped at step $DUMPED); dump $(dt "$t0" "$t1") s, restore $(dt "$t2" "$t3") s, with --tcp-established (NCCL's sockets kept)"
}
case_anchor_torch_ddp_one_rank() { anchor_torch_case PHOS_TEST_DDP=1; }
# With NCCL's RAS off, as libphos runs it: NCCL's bootstrap sockets alone.
case_anchor_torch_ddp_one_rank_ras_off() { anchor_torch_case PHOS_TEST_DDP=1 NCCL_RAS_ENABLE=0; }

# A job of 2 processes on 2 GPUs (torch_ddp_job.py, a file store): one criu
# of the launcher's tree holds both ranks at one collective boundary,
# releases each rank's communicator, and the restored ranks make it again
# from one new unique id; both ranks' loss curves bitwise equal.
case_torch_ddp_2gpu() {
  [ "$(gpu_count)" -ge 2 ] || skip "needs 2 GPUs (nvidia-smi sees $(gpu_count))"
  TORCH_SCRIPT=$here/torch_ddp_job.py torch_case PHOS_TEST_DDP=1
}
case_torch_ddp_2gpu_cow() {
  [ "$(gpu_count)" -ge 2 ] || skip "needs 2 GPUs (nvidia-smi sees $(gpu_count))"
  TORCH_SCRIPT=$here/torch_ddp_job.py torch_cow_case PHOS_TEST_DDP=1
}
# The same job started as users do, through torchrun (--standalone: its
# agent holds the c10d TCPStore and the ranks' TCP connections to it, and
# libuv's io_uring, which libphos refuses so the store runs on epoll). criu
# dumps and restores the tree launcher -> torchrun -> ranks with
# --tcp-established; after the restore the store's connections carry on and
# both ranks' loss curves are bitwise equal to an uninterrupted run's.
torchrun_case() {  # torchrun_case torch_case|torch_cow_case
  [ "$(gpu_count)" -ge 2 ] || skip "needs 2 GPUs (nvidia-smi sees $(gpu_count))"
  python3 -c 'import torch.distributed.run' 2>/dev/null || skip "no torch.distributed.run"
  export CRIU_NET_ARGS="--tcp-established --network-lock nftables"
  # torchrun and its ranks are not workload_pids: end every process of the job.
  AT_EXIT='pkill -9 -f -- "$WORK/state" || true'
  TORCH_SCRIPT=$here/torch_ddp_job.py "$1" PHOS_TEST_DDP=1 PHOS_TEST_TORCHRUN=1
}
case_torchrun_ddp_2gpu() { torchrun_case torch_case; }
# Default trust (checksum): NCCL's kernels reach their buffers through a work
# struct in device memory, which speculation does not see (with
# cow_trust=speculated a rank once gave a wrong image); a refusal is allowed,
# a wrong image never.
case_torchrun_ddp_2gpu_cow() { COW_REFUSAL_OK=1 torchrun_case torch_cow_case; }
# A job across two "hosts" (issue 28, part 2; two_hosts.sh): each GPU in a
# network namespace of its own, NCCL over sockets between them, torchrun on
# each with --nnodes=2; each host's tree dumped (and restored) by its own
# criu through `phosctl job`. Both ranks' loss curves must equal an
# uninterrupted run's of the same two-host job, bit for bit.
two_hosts_case() {  # two_hosts_case stopped|leave_running|host_fails [TORCHRUN RENDEZVOUS ARGS...]
  local kind=$1 n=150 t0 t1 t2 t3
  shift
  local need=$((2 * ${RANKS_PER_HOST:-1}))
  [ "$(gpu_count)" -ge $need ] || skip "needs $need GPUs (nvidia-smi sees $(gpu_count))"
  python3 -c 'import torch.distributed.run' 2>/dev/null || skip "no torch.distributed.run"
  setup "$here/torch_ddp_job.py" "$(python3 -c 'import sys; print(sys.executable)')"
  source "$here/two_hosts.sh"
  hosts_up
  local rdzv=("$@")
  [ ${#rdzv[@]} -gt 0 ] || rdzv=(--master-addr=10.77.0.1 --master-port=29500)
  start_job ref $n "${rdzv[@]}"
  job_reach ref $n 240
  sleep 2  # the reference job's processes end
  start_job run $n "${rdzv[@]}"
  job_reach run 40 240
  case $kind in
    stopped)
      t0=$(now); job_dump run || fail "phosctl job dump failed: $(tail -n 4 "$WORK/driver.log" | tr '\n' ' ')"; t1=$(now)
      local dumped; dumped=$(lines "$WORK/run.losses")
      sleep 1
      [ -z "$(host_pids 0)$(host_pids 1)" ] || fail "a process of the job runs after the stopped dump"
      t2=$(now); job_restore || fail "phosctl job restore failed: $(tail -n 4 "$WORK/restore-driver.log" | tr '\n' ' ')"; t3=$(now)
      job_reach run $n 240
      same_curves run
      pass "all $RANKS ranks' loss curves of $n steps bitwise equal to an uninterrupted two-host run's; $(held_line); job dump $(dt "$t0" "$t1") s (dumped at step $dumped), job restore $(dt "$t2" "$t3") s; $(grep -o '[0-9]* NCCL communicator(s) released in [0-9.]* ms' "$WORK"/img*/dump.log | sed 's/.*img\([01]\)\/dump.log:/host \1: /' | paste -sd, -)" ;;
    leave_running)
      t0=$(now); job_dump run --leave-running || fail "phosctl job dump --leave-running failed: $(tail -n 4 "$WORK/driver.log" | tr '\n' ' ')"; t1=$(now)
      job_reach run $n 240
      same_curves run
      pass "all $RANKS ranks' loss curves of $n steps bitwise equal to an uninterrupted two-host run's across a leave-running job dump; $(held_line); job dump $(dt "$t0" "$t1") s" ;;
    host_fails)
      if FAULT_HOST=1 FAULT=fail-checkpoint-devices job_dump run; then fail "the job's dump went through with host 1's failing"; fi
      grep -q "the job's dump is aborted on every host" "$WORK/driver.log" || fail "the driver does not say the dump was aborted: $(tail -n 3 "$WORK/driver.log" | tr '\n' ' ')"
      for i in 0 1; do [ ! -e "$WORK/img$i/phos-job" ] || fail "host $i's image is marked whole after the abort"; done
      job_reach run $n 240
      same_curves run
      pass "host 1's CHECKPOINT_DEVICES failing: both hosts' dumps failed, all $RANKS ranks carried on, their loss curves bitwise equal to an uninterrupted run's; $(grep -o "aborted on every host: .*" "$WORK/driver.log" | head -n1)" ;;
  esac
}
case_torchrun_2host() { two_hosts_case stopped; }
# The same with 4 ranks, 2 per "host" (a 4-GPU machine): NCCL over sockets
# between the hosts and within each (no P2P, no SHM).
case_torchrun_4rank_2host() { RANKS_PER_HOST=2 two_hosts_case stopped; }
case_torchrun_4rank_2host_leave_running() { RANKS_PER_HOST=2 two_hosts_case leave_running; }
case_torchrun_2host_leave_running() { two_hosts_case leave_running; }
case_torchrun_2host_host_fails() { two_hosts_case host_fails; }
# The c10d rendezvous backend: a shared TCPStore in rendezvous rank 0's agent.
case_torchrun_2host_c10d() {
  two_hosts_case stopped --rdzv-backend=c10d --rdzv-endpoint=10.77.0.1:29400 --rdzv-id=phos-2host
}
# phos's TCPStore client against torch's own server (libuv and legacy), and
# torch's client against phos's server (tcpstore_interop.py): the framing
# phos speaks is torch's.
case_tcpstore_interop() {
  python3 -c 'import torch.distributed' 2>/dev/null || skip "no torch.distributed"
  local out
  out=$(timeout 120 python3 "$here/tcpstore_interop.py" "$PHOS_BUILD/test/tools/phos-tcpstore" 2>&1) ||
    { echo "$out"; echo "[tcpstore_interop] FAIL: $(grep -m1 FAIL <<<"$out" || tail -n1 <<<"$out")"; exit 1; }
  echo "$out"
  pass "$(grep -c ': PASS$' <<<"$out") of 3 directions: $(grep ': PASS$' <<<"$out" | sed 's/^tcpstore-interop: //; s/: PASS$//' | paste -sd';' -)"
}

case_anchor_torch_ddp_2gpu() {
  [ "$(gpu_count)" -ge 2 ] || skip "needs 2 GPUs (nvidia-smi sees $(gpu_count))"
  TORCH_SCRIPT=$here/torch_ddp_job.py anchor_torch_case PHOS_TEST_DDP=1
}

# ---- copy-on-write (copy_on_write=always: the snapshot is not taken) ------

# verified PID N: asks the cow_random process PID to verify itself against
# an uninterrupted run and waits for the Nth line of its log; prints the
# mismatches it found.
verified() {
  kill -USR1 "$1" 2>/dev/null || { echo "gone"; return; }
  for _ in $(seq 1200); do
    [ "$(wc -l 2>/dev/null < "$WORK/verify.log" || echo 0)" -ge "$2" ] && break
    alive "$1" || break
    sleep 0.05
  done
  sed -n "${2}p" "$WORK/verify.log" | grep -o 'mismatches=[0-9]*' | cut -d= -f2 | grep . || echo "no answer"
}

# cow_random_setup MODE: the case's setup for cow_random; sets plant (its
# arguments) and PHOS_COW_TRUST: random, the default settings (checksum);
# planted, writes outside the speculated sets, validated by PTX twins only
# (the SASS-level validator attaches the sanitizer, and the driver then
# refuses to checkpoint the process); planted_sass, the same writes into the
# buffer copied last, by cow_random built without PTX, default settings
# (validation by checksum).
cow_random_setup() {
  local program=cow_random
  [ "$1" = planted_sass ] && program=cow_random_sass
  setup "$bin/$program"
  export CUBLAS_WORKSPACE_CONFIG=:4096:8
  plant=()
  unset PHOS_COW_TRUST PHOS_VALIDATE
  case $1 in
    planted) plant=(--plant); export PHOS_COW_TRUST=validated PHOS_VALIDATE=ptx ;;
    planted_sass) plant=(--plant --plant-last) ;;
  esac
}

# start_cow_random K MIB [ARGS...]: cow_random with seed K, then a random
# moment (0.1-0.9 s) of its run.
start_cow_random() {
  local k=$1 mib=$2; shift 2
  rm -f "$WORK/verify.log" "$WORK/state"
  start_workload --preload "$WORK/verify.log" --mib "$mib" --seed "$k" "$@"
  wait_above "$WORK/state" 512 60 || fail "cycle $k: the workload does not run"
  sleep "0.$((RANDOM % 9 + 1))"
}

# cow_cycles MODE CYCLES: cow_random checkpointed with --leave-running at a
# random moment, CYCLES times, each with a new process and seed, and a pool
# of 0, 64 MiB or 2 GiB in turn. random: every image, restored, equals the
# uninterrupted run at its freeze, and the checkpointed process is unharmed.
# planted: writes outside the speculated set during every window; with
# validation on, each dump must be refused, never give a wrong image.
cow_cycles() {
  local mode=$1 cycles=$2 mib=${PHOS_COW_RANDOM_MIB:-2048} k pools=(0 64 2048)
  local dumps=0 refused=0 mismatches=0 harmed=0 silent=0 saved=0 waited=0 stalls=()
  cow_random_setup "$mode"
  for k in $(seq "$cycles"); do
    start_cow_random "$k" "$mib" "${plant[@]}"
    local pool=${pools[$((k % 3))]} ok=1
    # The copy starts once the process runs again (cow_start=resume): all
    # of it in the window.
    PHOS_COPY_ON_WRITE=always PHOS_COW_POOL_MIB=$pool criu_dump --leave-running || ok=0
    dumps=$((dumps + 1))
    cp "$WORK/dump.log" "$log/$CASE/dump.$k.log" 2>/dev/null || true
    local s; s=$(grep -o 'gate reopened after [0-9.]* ms' "$WORK/dump.log" | grep -o '[0-9.]* ms' | cut -d' ' -f1 | head -n1)
    [ -n "$s" ] && stalls+=("$s")
    saved=$((saved + $(grep -o '[0-9]* chunks ([0-9.]* MiB) saved' "$WORK/dump.log" | cut -d' ' -f1 | head -n1 || echo 0)))
    waited=$((waited + $(grep -o '[0-9]* calls waited' "$WORK/dump.log" | cut -d' ' -f1 | head -n1 || echo 0)))
    if [ "$mode" = planted ] && [ $ok = 0 ]; then
      grep -q "outside" "$WORK/dump.log" || fail "cycle $k: the dump failed for another reason: $(phos_error "$WORK/dump.log")"
      refused=$((refused + 1))
    elif [ $ok = 0 ]; then
      fail "cycle $k: criu dump failed: $(phos_error "$WORK/dump.log")"
    fi
    local m; m=$(verified "$WORKLOAD_PID" 1)
    [ "$m" = 0 ] || { harmed=$((harmed + 1)); say "cycle $k: the checkpointed process: $m mismatches"; }
    kill -9 "$WORKLOAD_PID"; gone "$WORKLOAD_PID"
    if [ $ok = 1 ]; then
      criu_restore || fail "cycle $k: restore failed: $(phos_error "$WORK/restore.log")"
      local pid; pid=$(restored_pid) || fail "cycle $k: no restored process"
      m=$(verified "$pid" 2)
      if [ "$m" != 0 ]; then
        mismatches=$((mismatches + 1))
        [ "$mode" = planted ] && silent=$((silent + 1))
        say "cycle $k (pool $pool MiB): the restored image differs from the uninterrupted run: $m mismatches"
      fi
      kill -9 "$pid"; gone "$pid"
    fi
    # What the GPU holds between cycles, and who: a 45-cycle run once failed
    # a restore with CUDA_ERROR_OUT_OF_MEMORY at cycle 39.
    say "cycle $k: after it, GPU memory used $(nvidia-smi --query-gpu=memory.used --format=csv,noheader -i 0 2>/dev/null), workloads alive: $(workload_pids | wc -l), GPU processes: $(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader 2>/dev/null | paste -sd' ')"
  done
  local stall; stall=$(printf '%s\n' "${stalls[@]}" | sort -n | awk '{a[NR]=$1} END {if (NR) printf "stall median %.0f ms, max %.0f ms", a[int((NR+1)/2)], a[NR]}')
  if [ "$mode" = planted ]; then
    [ "$refused" = "$dumps" ] && [ "$silent" = 0 ] && [ "$harmed" = 0 ] ||
      fail "caught $refused/$dumps planted; $silent silently wrong images; $harmed processes harmed"
    pass "caught $refused/$dumps planted mis-speculations (every dump refused, 0 silently wrong images); the process carried on intact after each; $stall"
  fi
  [ "$mismatches" = 0 ] && [ "$harmed" = 0 ] || fail "$mismatches of $dumps images differ from the uninterrupted run; $harmed processes harmed"
  pass "$dumps checkpoints at random moments ($mib MiB, pools 0/64/2048 MiB): 0 mismatches with the uninterrupted run, restored and checkpointed process alike; $saved chunks saved copy-on-write, $waited calls waited; $stall"
}
case_cow_random() { cow_cycles random "${PHOS_COW_CYCLES:-20}"; }
case_cow_planted() { cow_cycles planted "${PHOS_COW_PLANTED_CYCLES:-6}"; }

# Issue 29's evidence: a kernel without PTX (no validator can see it) that
# writes outside its speculated set while the window is open, into the
# buffer copy-on-write copies last, right after the process runs again.
# Every dump must be refused by checksum, no image may be wrong, and the
# process runs on; every 10th cycle its next dump copies while it is
# stopped and that image restores equal. A dump that completes (every plant
# after its chunk's copy) is restored and verified, and reported. 4 GiB:
# its copy (~0.2 s) outlasts the first plant, which comes within 4 ops.
case_cow_planted_sass() {
  local cycles=${PHOS_COW_PLANTED_SASS_CYCLES:-100} mib=${PHOS_COW_RANDOM_MIB:-4096} k
  local dumps=0 refused=0 completed=0 wrong=0 harmed=0 stopped=0 stalls=()
  cow_random_setup planted_sass
  for k in $(seq "$cycles"); do
    start_cow_random "$k" "$mib" "${plant[@]}"
    local ok=1 m
    PHOS_COPY_ON_WRITE=always criu_dump --leave-running || ok=0
    dumps=$((dumps + 1))
    local s; s=$(grep -o 'gate reopened after [0-9.]* ms' "$WORK/dump.log" | grep -o '[0-9.]*' | head -n1)
    [ -n "$s" ] && stalls+=("$s")
    if [ $ok = 0 ]; then
      grep -qE "(differs from its|differ from their) content at the freeze" "$WORK/dump.log" ||
        fail "cycle $k: the dump failed for another reason: $(phos_error "$WORK/dump.log")"
      [ ! -e "$IMG/phos-1-complete.img" ] || fail "cycle $k: a refused image has a completion marker"
      refused=$((refused + 1))
      [ "$refused" = 1 ] && say "cycle $k: $(phos_error "$WORK/dump.log" | cut -c1-400)"
    else
      cp "$WORK/dump.log" "$log/$CASE/dump.$k.completed.log" 2>/dev/null || true
    fi
    m=$(verified "$WORKLOAD_PID" 1)
    [ "$m" = 0 ] || { harmed=$((harmed + 1)); say "cycle $k: the checkpointed process: $m mismatches"; }
    # Every 10th refusal: the next dump of the same process copies while it
    # is stopped, and restores equal.
    if [ $ok = 0 ] && [ $((refused % 10)) = 1 ]; then
      rm -rf "${IMG:?}"/*
      PHOS_COPY_ON_WRITE=always criu_dump --leave-running ||
        fail "cycle $k: the dump after a refusal failed: $(phos_error "$WORK/dump.log")"
      grep -q "an earlier dump of it found a write that speculation missed" "$WORK/dump.log" ||
        fail "cycle $k: the dump after a refusal did not copy while the process was stopped"
      ok=1 stopped=$((stopped + 1))
      m=$(verified "$WORKLOAD_PID" 2)
      [ "$m" = 0 ] || { harmed=$((harmed + 1)); say "cycle $k: the process after its stopped dump: $m mismatches"; }
    fi
    local seen; seen=$(wc -l < "$WORK/verify.log" 2>/dev/null || echo 0)
    kill -9 "$WORKLOAD_PID"; gone "$WORKLOAD_PID"
    if [ $ok = 1 ]; then
      criu_restore || fail "cycle $k: restore failed: $(phos_error "$WORK/restore.log")"
      local pid; pid=$(restored_pid) || fail "cycle $k: no restored process"
      m=$(verified "$pid" $((seen + 1)))
      if [ "$m" != 0 ]; then
        wrong=$((wrong + 1))
        say "cycle $k: the restored image differs from the uninterrupted run: $m mismatches"
      elif ! grep -q "an earlier dump of it found" "$WORK/dump.log"; then
        completed=$((completed + 1))
      fi
      kill -9 "$pid"; gone "$pid"
    fi
    rm -rf "${IMG:?}"/*
  done
  local stall; stall=$(printf '%s\n' "${stalls[@]}" | sort -n | awk '{a[NR]=$1} END {if (NR) printf "stall median %.0f ms, max %.0f ms", a[int((NR+1)/2)], a[NR]}')
  [ "$wrong" = 0 ] && [ "$harmed" = 0 ] ||
    fail "$wrong wrong images, $harmed processes harmed, in $dumps dumps ($refused refused, $completed completed)"
  # A dump whose plant landed after its chunk's copy holds the freeze's
  # content: complete and restored equal is right for it (counted, said).
  [ "$refused" -gt 0 ] && [ $((refused + completed)) = "$dumps" ] ||
    fail "$refused of $dumps dumps refused, $completed completed and restored equal, 0 wrong: the rest?"
  pass "refused $refused/$dumps dumps of a kernel without PTX writing outside its speculated set (validation by checksum, default settings); $completed completed with the plant after its chunk's copy, restored equal; 0 wrong images, the process intact after each; $stopped next dumps copied while stopped and restored equal; $stall"
}
# The pattern program with copy-on-write instead of the snapshot: every byte
# of the restored image re-verified.
cow_pattern() {
  local out rc
  out=$(PHOS_COPY_ON_WRITE=always bash "$here/checkpoint.sh" "$1" 2>&1); rc=$?
  echo "$out"
  [ $rc -eq 0 ] || exit $rc
  grep -q "copy-on-write window closed" <<<"$out" || fail "no copy-on-write window in the leave-running dump"
  local checked; checked=$(grep -o "checksum: [0-9]* chunks equal to the freeze (T0: [0-9.]* GiB in [0-9.]* ms)" <<<"$out" | head -n1)
  [ -n "$checked" ] || fail "the copy was not checked by checksum (the default)"
  pass "$(grep -o 'leave-running dump in [0-9.]* s' <<<"$out"); $(grep -o 'gate reopened after [0-9.]* ms' <<<"$out" | head -n1); $(grep -o '[0-9]* chunks ([0-9.]* MiB) saved into the pool' <<<"$out" | head -n1); $checked; all $((($1 + 63) / 64)) slices of the restored image re-verified"
}
case_cow_pattern_8GiB() { cow_pattern 8192; }

# ---- soft recopy (dumps without --leave-running) ---------------------------

source "$here/bench_lib.sh"  # downtime_ms

# recopy_cycles MODE CYCLES: cow_random dumped without --leave-running at a
# random moment, CYCLES times, each with a new process and seed: soft
# recopy copies its memory while it runs, closes its gate, copies again what
# it wrote. random: every image, restored, equals the uninterrupted run at
# that last gate closing, byte for byte. planted: writes outside the
# speculated set during every first pass; with validation on, each must be
# seen (every chunk copied again), and the image still equal.
recopy_cycles() {
  local mode=$1 cycles=$2 mib=${PHOS_COW_RANDOM_MIB:-2048} k
  local dumps=0 mismatches=0 caught=0 first_mib=0 dirty=0 chunks=0 downs=() unmarked=0 by_sum=0
  cow_random_setup "$mode"
  for k in $(seq "$cycles"); do
    start_cow_random "$k" "$mib" "${plant[@]}"
    PHOS_RECOPY=auto PHOS_RECOPY_MIN_MIB=0 criu_dump || fail "cycle $k: criu dump failed: $(phos_error "$WORK/dump.log")"
    dumps=$((dumps + 1))
    cp "$WORK/dump.log" "$log/$CASE/dump.$k.log" 2>/dev/null || true
    grep -q "first pass copied" "$WORK/dump.log" ||
      fail "cycle $k: no soft recopy: $(grep -o 'no soft recopy.*' "$WORK/dump.log" | head -n1)"
    grep -q "wrote outside its set while soft recopy" "$WORK/dump.log" && caught=$((caught + 1))
    first_mib=$(awk -v a="$first_mib" -v b="$(grep -o 'first pass copied [0-9]* chunks ([0-9.]* MiB)' "$WORK/dump.log" | grep -o '[0-9.]* MiB' | cut -d' ' -f1)" 'BEGIN {print a + b}')
    # The final pass by checksum: chunks changed without a dirty mark.
    local sums; sums=$(grep -o "([0-9]* of them without a dirty mark" "$WORK/dump.log" | grep -o '[0-9]*' | head -n1)
    [ -n "$sums" ] && by_sum=$((by_sum + 1)) unmarked=$((unmarked + sums))
    local line; line=$(grep -o '[0-9]* of [0-9]* chunks dirty' "$WORK/dump.log" | head -n1)
    dirty=$((dirty + $(cut -d' ' -f1 <<<"$line"))); chunks=$((chunks + $(cut -d' ' -f3 <<<"$line")))
    local d; d=$(downtime_ms "$WORK/dump.log"); [ -n "$d" ] && downs+=("$d")
    gone "$WORKLOAD_PID"
    criu_restore || fail "cycle $k: restore failed: $(phos_error "$WORK/restore.log")"
    local pid; pid=$(restored_pid) || fail "cycle $k: no restored process"
    local m; m=$(verified "$pid" 1)
    if [ "$m" != 0 ]; then
      mismatches=$((mismatches + 1))
      say "cycle $k: the restored image differs from the uninterrupted run: $m mismatches"
    fi
    kill -9 "$pid"; gone "$pid"
  done
  local down; down=$(printf '%s\n' "${downs[@]}" | sort -n | awk '{a[NR]=$1} END {if (NR) printf "downtime median %.0f ms, max %.0f ms", a[int((NR+1)/2)], a[NR]}')
  [ "$mismatches" = 0 ] || fail "$mismatches of $dumps recopied images differ from the uninterrupted run"
  local what="$dumps dumps at random moments ($mib MiB), soft recopy: 0 mismatches with the uninterrupted run; first passes copied $first_mib MiB while it ran, $dirty of $chunks chunks written meanwhile; $by_sum final passes by checksum found $unmarked chunks changed without a dirty mark; $down"
  if [ "$mode" = planted ]; then
    [ "$caught" = "$dumps" ] || fail "planted writes seen in $caught of $dumps first passes"
    pass "caught $caught/$dumps planted mis-speculations (every chunk copied again); $what"
  fi
  pass "$what"
}
case_recopy_random() { recopy_cycles random "${PHOS_RECOPY_CYCLES:-20}"; }
# Speculation off for good: no kernel has a set, none marks a chunk dirty;
# the final pass by checksum alone makes the image exact.
case_recopy_random_unspeculated() {
  export PHOS_SPECULATE=never
  recopy_cycles random "${PHOS_RECOPY_CYCLES:-20}"
}
case_recopy_planted() { recopy_cycles planted "${PHOS_RECOPY_PLANTED_CYCLES:-6}"; }
# The pattern program's dump-and-restore step with soft recopy: every byte of
# the restored image re-verified.
recopy_pattern() {
  local out rc
  out=$(bash "$here/checkpoint.sh" "$1" 2>&1); rc=$?
  echo "$out"
  [ $rc -eq 0 ] || exit $rc
  grep -q "first pass copied" <<<"$out" || fail "no soft recopy in the dump: $(grep -o 'no soft recopy.*' <<<"$out" | head -n1)"
  local plan; plan=$(grep -o "checksum: the final pass copies [0-9]* of [0-9]* chunks[^;]*" <<<"$out" | head -n1)
  [ -n "$plan" ] || fail "the final pass did not go by checksum (the default)"
  pass "$(grep -o '\] dump in [0-9.]* s' <<<"$out" | cut -c3-); $(grep -o "first pass copied [0-9]* chunks ([0-9.]* MiB) in [0-9.]* ms" <<<"$out" | head -n1); $(grep -o '[0-9]* of [0-9]* chunks dirty' <<<"$out" | head -n1); $plan; all $((($1 + 63) / 64)) slices of the restored image re-verified"
}
case_recopy_pattern_8GiB() { recopy_pattern 8192; }

# lazy_pattern MIB: checkpoint.sh with lazy_restore=on: each restore lets the
# process run before its memory is in; its kernels (speculated sets, no read
# validation) wait for the whole fill; every byte re-verified; the corrupted
# chunk, met after the process runs, ends it and fails criu.
lazy_pattern() {
  local out rc
  out=$(PHOS_LAZY_RESTORE=on bash "$here/checkpoint.sh" "$1" 2>&1); rc=$?
  echo "$out"
  [ $rc -eq 0 ] || exit $rc
  grep -q "on-demand restore: [0-9]* allocations in the recorded order first" <<<"$out" || fail "no on-demand restore in the log"
  pass "$(grep -o '\] dump in [0-9.]* s, restore in [0-9.]* s' <<<"$out" | cut -c3-); all $((($1 + 63) / 64)) slices re-verified; $(grep -o 'gate open [0-9.]*' <<<"$out" | tail -n1) ms, $(grep -o 'all GPU data in at [0-9.]* ms' <<<"$out" | tail -n1); $(grep -o 'on-demand restore: [0-9]* calls checked.*' <<<"$out" | tail -n1 | grep . || echo 'no fill window: the fill ended first'); corrupted chunk: process ended, criu failed"
}
case_lazy_pattern_8GiB() { lazy_pattern 8192; }

# lazy_read_case honest|planted: lazy_read (8 GiB of filler first, then a
# 64 MiB victim: the address-order fill reaches it last) under
# PHOS_VALIDATE=ptx, dumped at step ~30 of 300, restored on demand with the
# fill slowed (PHOS_FAULT=slow-fill: 20 ms per chunk and worker, but not for
# chunks a call waits for). honest: the victim is a kernel argument, so the
# kernel waits for it; the run's sums equal the uninterrupted run's. planted:
# the kernel reads the victim only through a pointer kept in device memory;
# its fill twin sees the read into memory not yet in and ends the process
# (its message names the kernel), criu fails; the same image restored with
# lazy_restore=off then runs on, its sums equal the uninterrupted run's.
lazy_read_case() {
  local n=300 plant=() lazy
  [ "$1" = planted ] && plant=(--plant)
  setup "$bin/lazy_read"
  export PHOS_VALIDATE=ptx
  # honest: launches recorded, so the dump keeps the order they touched
  # memory in and the restore fills that first (planted: not recorded, the
  # victim must come last)
  [ "$1" = honest ] && export PHOS_RECORD_LAUNCHES=1
  timeout 120 env LD_PRELOAD="$LIBPHOS" "$bin/lazy_read" "$WORK/ref.state" "$WORK/ref.out" 8192 $n "${plant[@]}" \
    > "$WORK/reference.log" 2>&1 || fail "the reference run failed (rc $?): $(tail -n 2 "$WORK/ref.state.err" 2>/dev/null)"
  start_workload --preload "$WORK/run.out" 8192 $n "${plant[@]}"
  reach 30 60 "before the dump"
  criu_dump || fail "criu dump failed (rc $?)"
  DUMPED=$(state_counter)
  sleep 0.2
  [ -z "$(workload_pids)" ] || fail "process still running after the dump"
  if [ "$1" = planted ]; then
    PHOS_LAZY_RESTORE=on PHOS_FAULT=slow-fill criu_restore &&
      fail "criu restore succeeded though the program read memory not yet restored"
    mv "$WORK/restore.log" "$WORK/restore-lazy.log"
    gone $(workload_pids)
    [ -z "$(workload_pids)" ] || fail "the process runs on after reading memory not yet restored"
    local said
    said=$(grep -o "kernel [^ ]* touched device memory not yet restored[^;]*" "$WORK/state.err" | head -n1)
    [ -n "$said" ] || fail "no message from phos in the program's stderr: $(tail -n 2 "$WORK/state.err" 2>/dev/null)"
    grep -q "read_through" <<<"$said" || fail "the message does not name the planted kernel: $said"
    criu_restore || fail "criu restore with lazy_restore=off failed (rc $?)"
    lazy="caught: $said; criu failed; restored again with lazy_restore=off"
  else
    PHOS_LAZY_RESTORE=on PHOS_FAULT=slow-fill criu_restore || fail "criu restore failed (rc $?)"
    grep -q "the process runs while its memory is filled" "$WORK/restore.log" || fail "no on-demand restore"
    local first
    first=$(grep -o 'on-demand restore: [0-9]* allocations in the recorded order first' "$WORK/restore.log" | grep -o '[0-9]*' | head -n1)
    [ "${first:-0}" -ge 1 ] || fail "no recorded fill order in the image"
    lazy="on demand: $first allocations in the recorded order first, $(grep -o 'gate open [0-9.]*' "$WORK/restore.log" | tail -n1) ms, $(grep -o 'all GPU data in at [0-9.]* ms' "$WORK/restore.log" | tail -n1), $(grep -o '[0-9]* calls checked, [0-9]* waited ([0-9]* for the whole fill)' "$WORK/restore.log" | tail -n1)"
  fi
  reach $((n - 2)) 120 "after the restore"  # steps 0..n-1
  gone $(workload_pids)
  cmp -s "$WORK/ref.out" "$WORK/run.out" ||
    fail "sums differ from the uninterrupted run's from step $(diff "$WORK/ref.out" "$WORK/run.out" | grep -m1 -o '^[<>] [0-9]*' | cut -c3-) on (dumped at step $DUMPED)"
  pass "$n steps' sums equal to an uninterrupted run's (dumped at step $DUMPED); $lazy"
}
case_lazy_read_honest() { lazy_read_case honest; }
case_lazy_read_planted() { lazy_read_case planted; }

case_two_processes() {
  setup "$bin/gpu_counter"
  start_workload --preload 1024 --child
  wait_counter_above 5
  wait_above "$WORK/state.child" 5 30 || fail "the child process does not count"
  local child_token; child_token=$(field_of "$WORK/state.child" 1)
  dump_restore
  local images; images=$(ls "$IMG"/phos-*-manifest.img 2>/dev/null | wc -l || true)
  [ "$images" = 2 ] || fail "$images GPU images, 2 expected"
  carried_on "$WORK/state" "$TOKEN" 1024
  local parent=$CARRIED
  carried_on "$WORK/state.child" "$child_token" 1024
  pass "both restored from one dump of the tree (dump $DUMP_S s, restore $RESTORE_S s; images $(phos_wrote)); parent: $parent; child: $CARRIED"
}

# The same restored on demand with a slowed fill: two fills, one after the
# other, each process running while its own memory is filled.
case_lazy_two_processes() {
  export PHOS_LAZY_RESTORE=on PHOS_FAULT=slow-fill
  case_two_processes
}

# A PyTorch job with more allocations than one message carries fds (253):
# torch_loop.py train, narrow and deep, so that its caching allocator holds
# hundreds of segments. A leave-running dump gives it its memory back, and
# its image restores; it trains on after each.
# Two processes sharing GPU memory through CUDA IPC (issue 31 part 1):
# torch_ipc.py, a parent and its spawned child exchanging activations
# through tensors shared with torch.multiprocessing (cudaIpcGetMemHandle and
# cudaIpcGetEventHandle underneath, served by phos). A leave-running dump,
# then a dump and restore of the pair: the shared memory stored once (in
# the parent's image), mapped into both after the restore; the curve of the
# whole run bitwise equal to an uninterrupted run's. torch.multiprocessing
# maps a POSIX semaphore whose /dev/shm file it has unlinked: criu needs
# --link-remap for it (its first GPU run failed on "Can't create link remap
# for /dev/shm/sem.*"), as a user's criu would.
case_torch_ipc() {
  local n=150 script=$here/torch_ipc.py
  setup "$script" "$(python3 -c 'import sys; print(sys.executable)')"
  export CUBLAS_WORKSPACE_CONFIG=:4096:8 CRIU_NET_ARGS="--link-remap"
  timeout 180 env LD_PRELOAD="$LIBPHOS" python3 "$script" "$WORK/ref.state" "$WORK/ref.losses" $n \
    > "$WORK/reference.log" 2>&1 || fail "the reference run failed (rc $?): $(tail -n 3 "$WORK/ref.state.error" 2>/dev/null)"
  start_workload --preload "$WORK/run.losses" $n
  reach 30 120 "before the dumps"
  local t0 t1
  t0=$(now); criu_dump --leave-running || fail "leave-running dump failed: $(phos_error "$WORK/dump.log")"; t1=$(now)
  local once
  once=$(grep -o "allocation #[0-9]* of process [0-9]* (pid in its namespace) mapped at 0x[0-9a-f]* ([0-9.]* MiB) through CUDA IPC" "$WORK/dump.log" | wc -l || true)
  [ "$once" -ge 3 ] || fail "the leave-running dump names $once IPC mappings stored once (3 expected: ACT, OUT, W2)"
  local lr_wrote; lr_wrote=$(phos_wrote)
  ! grep -q "unsupported call\|which phos cannot checkpoint" "$WORK/dump.log" || fail "a call phos does not serve: $(phos_error "$WORK/dump.log")"
  reach 60 120 "after the leave-running dump"
  rm -rf "${IMG:?}"/*
  dump_restore
  grep -q "through CUDA IPC: stored once, in its owner's image" "$WORK/dump.log" || fail "the dump stored no IPC memory once"
  grep -q "mapped again at 0x[0-9a-f]* through CUDA IPC" "$WORK/restore.log" || fail "the restore mapped no IPC memory again"
  reach $((n - 1)) 120 "after the restore"
  [ "$(state_token)" = "$TOKEN" ] || fail "token changed"
  cmp -s "$WORK/ref.losses" "$WORK/run.losses" ||
    fail "the curve differs from the uninterrupted run's from step $(diff "$WORK/ref.losses" "$WORK/run.losses" | grep -m1 -o '^[<>] [0-9]*' | cut -c3-) on (dumped at step $DUMPED)"
  "$PHOSCTL" show "$IMG" > "$WORK/show.txt" 2>&1 || true
  pass "curve of $n steps bitwise equal to an uninterrupted run's (leave-running dump $(dt "$t0" "$t1") s, $once IPC mappings stored once, images $lr_wrote; dumped at step $DUMPED, dump $DUMP_S s, restore $RESTORE_S s; images $(phos_wrote)); $(grep -c 'CUDA IPC: allocation' "$WORK/show.txt" || true) IPC mappings in phosctl show; $(driver_batches)"
}

# The same with the runtime's cudaIpc* and no PyTorch (gpu_ipc.cu): the
# owner and its child compute through one 64 MiB buffer S in turns.
case_gpu_ipc() {
  local n=300
  setup "$bin/gpu_ipc"
  timeout 120 env LD_PRELOAD="$LIBPHOS" "$bin/gpu_ipc" "$WORK/ref.state" "$WORK/ref.out" $n > "$WORK/reference.log" 2>&1 ||
    fail "the reference run failed (rc $?): $(tail -n 3 "$WORK/reference.log")"
  start_workload --preload "$WORK/run.out" $n
  reach 50 60 "before the dumps"
  local t0 t1
  t0=$(now); criu_dump --leave-running || fail "leave-running dump failed: $(phos_error "$WORK/dump.log")"; t1=$(now)
  grep -q "through CUDA IPC: stored once, in its owner's image" "$WORK/dump.log" || fail "the leave-running dump stored no IPC memory once"
  local lr_wrote; lr_wrote=$(phos_wrote)
  reach 100 60 "after the leave-running dump"
  rm -rf "${IMG:?}"/*
  dump_restore
  grep -q "mapped again at 0x[0-9a-f]* through CUDA IPC" "$WORK/restore.log" || fail "the restore mapped no IPC memory again"
  reach $((n - 1)) 60 "after the restore"
  [ "$(state_token)" = "$TOKEN" ] || fail "token changed"
  cmp -s "$WORK/ref.out" "$WORK/run.out" ||
    fail "the outputs differ from the uninterrupted run's from step $(diff "$WORK/ref.out" "$WORK/run.out" | grep -m1 -o '^[<>] [0-9]*' | cut -c3-) on (dumped at step $DUMPED)"
  pass "outputs of $n steps bitwise equal to an uninterrupted run's (leave-running dump $(dt "$t0" "$t1") s, images $lr_wrote; dumped at step $DUMPED, dump $DUMP_S s, restore $RESTORE_S s, images $(phos_wrote)); $(driver_batches)"
}

# An interprocess event recorded again and again for the other process to
# wait on each time (gpu_ipc_event.cu), not once per handle as
# torch.multiprocessing does: natively (the driver's event IPC), then under
# libphos, which serves it by completing every record of an interprocess
# event before the record returns. No dump: what is shown is that the reads
# are right on a real driver and that phos's records waited for the kernel.
case_gpu_ipc_event() {
  local rounds=5 spin=200
  setup "$bin/gpu_ipc_event"
  timeout 60 "$bin/gpu_ipc_event" $rounds $spin > "$WORK/native.log" 2>&1 ||
    fail "natively (rc $?): $(grep -m1 'bad\|failed\|error' "$WORK/native.log")"
  timeout 60 env LD_PRELOAD="$LIBPHOS" "$bin/gpu_ipc_event" $rounds $spin > "$WORK/phos.log" 2>&1 ||
    fail "under libphos (rc $?): $(grep -m1 'bad\|failed\|error' "$WORK/phos.log")"
  local n
  n=$(grep -c '^round .* ok$' "$WORK/phos.log" || true)
  [ "$n" = $((2 * rounds)) ] || fail "under libphos $n of $((2 * rounds)) reads right: $(cat "$WORK/phos.log")"
  local early
  early=$(awk -v min=$((spin * 8 / 10)) '$3 ~ /_record_ms$/ && $4 < min' "$WORK/phos.log" | head -n1)
  [ -z "$early" ] || fail "under libphos a record returned before the kernel before it was done: $early"
  ms() { awk '$3 ~ /_record_ms$/ {print $4}' "$1" | paste -sd' '; }
  pass "$((2 * rounds)) reads right each way, natively and under libphos; record ms natively [$(ms "$WORK/native.log")], under libphos [$(ms "$WORK/phos.log")] (the ${spin} ms kernel before each)"
}

case_torch_many_allocations() {
  setup "$here/torch_loop.py" "$(python3 -c 'import sys; print(sys.executable)')"
  start_workload --preload train --gib 6 --width 1024
  reach 5 120 "before the dump"
  local token; token=$(state_token)
  criu_dump --leave-running || fail "criu dump --leave-running failed: $(phos_error "$WORK/dump.log")"
  local n; n=$(grep -o 'wrote phos-[0-9]*-manifest.img ([0-9]* allocations' "$WORK/dump.log" | grep -o '([0-9]*' | tr -d '(' | tail -n1)
  [ "${n:-0}" -gt 253 ] || fail "only ${n:-0} allocations: not more than one page of fds"
  local at; at=$(state_counter)
  reach $((at + 5)) 60 "after the leave-running dump"
  kill -9 "$WORKLOAD_PID"; gone "$WORKLOAD_PID"; wait_pid_free
  criu_restore || fail "restore failed: $(phos_error "$WORK/restore.log")"
  restored_pid >/dev/null || fail "no restored process"
  at=$(state_counter)
  reach $((at + 5)) 60 "after the restore"
  [ "$(state_token)" = "$token" ] || fail "token changed"
  pass "$n allocations: given back after a leave-running dump and restored from its image, training on after each"
}

# gpu_used_mib: device memory in use on GPU 0, by anyone.
gpu_used_mib() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 | tr -d ' '; }

# metrics PID: "FDS THREADS RSS_MIB GPU_MIB" of a process (GPU: the whole
# GPU's memory in use, by anyone). FDS: the fewest of 5 looks 20 ms apart
# (torch_train.py opens its state and loss files for a moment every step).
metrics() {
  local fds=999999 threads rss f
  for _ in 1 2 3 4 5; do
    f=$(ls "/proc/$1/fd" 2>/dev/null | wc -l)
    [ "$f" -lt "$fds" ] && fds=$f
    sleep 0.02
  done
  threads=$(awk '/^Threads:/ {print $2}' "/proc/$1/status" 2>/dev/null)
  rss=$(awk '/^VmRSS:/ {printf "%d", $2 / 1024}' "/proc/$1/status" 2>/dev/null)
  echo "$fds $threads $rss $(gpu_used_mib)"
}

# soak_baseline TABLE: the first row of a soak's table, the baseline taken
# after the first checkpoint (it keeps one fd per allocation from then on:
# the memory it got back, once); sets SOAK_TABLE and B_* for soak_check.
soak_baseline() {
  SOAK_TABLE=$1
  echo "kind k step stall_ms fds threads rss_mib gpu_mib" > "$SOAK_TABLE"
  read -r B_FDS B_THREADS B_RSS B_GPU < <(metrics "$WORKLOAD_PID")
  echo "baseline 0 $(state_counter) - $B_FDS $B_THREADS $B_RSS $B_GPU" >> "$SOAK_TABLE"
}
# soak_check KIND K: a row (the stall from the last dump's log), and the
# leak criterion against the baseline: fds and threads equal, the RSS and
# the GPU's memory in use within 64 MiB.
soak_check() {
  local fds threads rss gpu stall
  read -r fds threads rss gpu < <(metrics "$WORKLOAD_PID")
  stall=$({ grep -o 'gate reopened after [0-9.]* ms' "$WORK/dump.log" 2>/dev/null || true; } | grep -o '[0-9.]*' | head -n1 || true)
  echo "$1 $2 $(state_counter) ${stall:--} $fds $threads $rss $gpu" >> "$SOAK_TABLE"
  [ "$fds" = "$B_FDS" ] && [ "$threads" = "$B_THREADS" ] && [ "$rss" -le $((B_RSS + 64)) ] &&
    [ "$gpu" -le $((B_GPU + 64)) ] ||
    fail "$1 $2: fds $B_FDS -> $fds, threads $B_THREADS -> $threads, RSS $B_RSS -> $rss MiB, GPU $B_GPU -> $gpu MiB"
}
# soak_stalls: "stall median M ms, max X ms" of the table's leave-running rows.
soak_stalls() {
  awk '$1 == "leave-running" && $4 != "-" {print $4}' "$SOAK_TABLE" | sort -n |
    awk '{a[NR]=$1} END {printf "stall median %.0f ms, max %.0f ms", a[int((NR+1)/2)], a[NR]}'
}
# soak_leave_running N STEPS: N leave-running checkpoints, each STEPS steps
# after the last, checked.
soak_leave_running() {
  local k at
  for k in $(seq "$1"); do
    at=$(state_counter); reach $((at + $2)) 60 "before checkpoint $k"
    rm -rf "$IMG" && mkdir -p "$IMG"
    criu_dump --leave-running || fail "checkpoint $k: criu dump failed: $(phos_error "$WORK/dump.log")"
    sleep 0.2
    soak_check leave-running "$k"
  done
}
# soak_chain N STEPS [MIB]: N dumps and restores in a chain (each restored
# process dumped again), each STEPS steps after the last, checked; with MIB
# (gpu_counter) every restore re-verifies all its device memory first.
soak_chain() {
  local k at
  for k in $(seq "$1"); do
    at=$(state_counter); reach $((at + $2)) 60 "before chain dump $k"
    rm -rf "$IMG" && mkdir -p "$IMG"
    criu_dump || fail "chain dump $k failed: $(phos_error "$WORK/dump.log")"
    gone "$WORKLOAD_PID"; wait_pid_free
    criu_restore || fail "chain restore $k failed: $(phos_error "$WORK/restore.log")"
    WORKLOAD_PID=$(restored_pid) || fail "chain $k: no restored process"
    if [ -n "${3:-}" ]; then carried_on "$WORK/state" "$TOKEN" "$3"
    else at=$(state_counter); reach $((at + 2)) 60 "after chain restore $k"; fi
    soak_check chain "$k"
  done
}

# The soak: torch_train.py checkpointed with --leave-running every 3 steps,
# PHOS_SOAK_CHECKPOINTS (100) times, then dumped and restored
# PHOS_SOAK_CHAIN (20) times in a chain (each restored process dumped
# again). After each: the process's fds and threads equal their baseline,
# its RSS and the GPU's memory in use within 64 MiB of theirs (a leak fails
# the case); one row per checkpoint in soak_torch.table. At the end its loss
# curve equals an uninterrupted run's, bit for bit.
case_soak_torch() {
  local checkpoints=${PHOS_SOAK_CHECKPOINTS:-100} chain=${PHOS_SOAK_CHAIN:-20}
  # 25 ms a step: the program outlives the soak (on an H200 about 31 steps
  # went by a leave-running checkpoint, 37 a dump and restore), and the
  # loss curve is compared at its end.
  local n=$((checkpoints * 40 + chain * 50 + 400))
  setup "$here/torch_train.py" "$(python3 -c 'import sys; print(sys.executable)')"
  export CUBLAS_WORKSPACE_CONFIG=:4096:8
  timeout 400 env LD_PRELOAD="$LIBPHOS" python3 "$here/torch_train.py" "$WORK/ref.state" "$WORK/ref.losses" $n 0 \
    > "$WORK/reference.log" 2>&1 || fail "the reference run failed (rc $?)"
  start_workload --preload "$WORK/run.losses" $n 25
  reach 20 120 "before the soak"
  local token; token=$(state_token)
  rm -rf "$IMG" && mkdir -p "$IMG"
  criu_dump --leave-running || fail "checkpoint 0: criu dump failed: $(phos_error "$WORK/dump.log")"
  sleep 0.2
  soak_baseline "$log/${SOAK_NAME:-soak_torch}.table"
  soak_leave_running "$checkpoints" 2
  soak_chain "$chain" 3
  reach $((n - 1)) 500 "to the end"
  [ "$(state_token)" = "$token" ] || fail "token changed"
  cmp -s "$WORK/ref.losses" "$WORK/run.losses" ||
    fail "loss curve differs from the uninterrupted run's from step $(diff "$WORK/ref.losses" "$WORK/run.losses" | grep -m1 -o '^[<>] [0-9]*' | cut -c3-) on"
  pass "$checkpoints leave-running checkpoints and $chain dumps+restores in a chain: loss curve of $n steps bitwise equal to an uninterrupted run's; fds ($B_FDS), threads ($B_THREADS) back to baseline after each, RSS and GPU memory within 64 MiB; $(soak_stalls); table: $SOAK_TABLE"
}

# The same with DDP in a job of one rank (PHOS_TEST_DDP=1): its NCCL
# communicator released and made again at every checkpoint; 20 and 5 by
# default. The leak criterion holds NCCL's threads and fds to it too.
case_soak_torch_ddp_one_rank() {
  export PHOS_TEST_DDP=1 SOAK_NAME=soak_torch_ddp_one_rank
  PHOS_SOAK_CHECKPOINTS=${PHOS_SOAK_CHECKPOINTS:-20} PHOS_SOAK_CHAIN=${PHOS_SOAK_CHAIN:-5} case_soak_torch
}

# The pattern program at 32 GiB (PHOS_SOAK_PATTERN_MIB): checkpointed with
# --leave-running PHOS_SOAK_CHECKPOINTS (20) times, then dumped and restored
# PHOS_SOAK_CHAIN (5) times in a chain, every restore re-verifying all its
# device memory; the same leak criterion after each (soak_pattern.table).
case_soak_pattern_32GiB() {
  local mib=${PHOS_SOAK_PATTERN_MIB:-32768} checkpoints=${PHOS_SOAK_CHECKPOINTS:-20} chain=${PHOS_SOAK_CHAIN:-5}
  setup "$bin/gpu_counter"
  start_workload --preload "$mib"
  wait_counter_above 5 120
  TOKEN=$(state_token)
  rm -rf "$IMG" && mkdir -p "$IMG"
  criu_dump --leave-running || fail "checkpoint 0: criu dump failed: $(phos_error "$WORK/dump.log")"
  sleep 0.2
  soak_baseline "$log/soak_pattern.table"
  soak_leave_running "$checkpoints" 2
  soak_chain "$chain" 2 "$mib"
  carried_on "$WORK/state" "$TOKEN" "$mib"
  pass "$mib MiB: $checkpoints leave-running checkpoints and $chain dumps+restores in a chain, all device memory re-verified after each restore and at the end ($CARRIED); fds ($B_FDS), threads ($B_THREADS) back to baseline after each, RSS and GPU memory within 64 MiB; $(soak_stalls); table: $SOAK_TABLE"
}

# Two criu dumps of two GPU processes at once, on one GPU, into two image
# directories: both succeed; each image, restored, carries on intact.
# start_two_counters MIB_A MIB_B: gpu_counter processes a and b under
# libphos.so, counting; their pids and tokens in PIDS and TOKENS (a, b).
start_two_counters() {
  local k mib
  for k in a b; do
    mib=$1; [ $k = b ] && mib=$2
    (setsid bash -c 'exec env LD_PRELOAD="$1" "$2" "$3" "$4" </dev/null >/dev/null 2>&1' _ \
       "$LIBPHOS" "$COUNTER" "$WORK/$k.state" "$mib" &)
  done
  AT_EXIT='pkill -9 -f "$COUNTER $WORK/[ab].state" || true'
  PIDS=() TOKENS=()
  for k in a b; do
    wait_above "$WORK/$k.state" 5 60 || fail "process $k does not count"
    PIDS+=("$(pgrep -o -f "^$COUNTER $WORK/$k.state")")
    TOKENS+=("$(field_of "$WORK/$k.state" 1)")
  done
}

case_two_dumps_at_once() {
  setup "$bin/gpu_counter"
  local k
  start_two_counters 2048 2048
  local pids=("${PIDS[@]}") tokens=("${TOKENS[@]}")
  mkdir -p "$WORK/0.img" "$WORK/1.img"
  local t0 criu_pids=(); t0=$(now)
  for k in 0 1; do
    criu_limit "$CRIU" dump -t "${pids[$k]}" -D "$WORK/${k}.img" --lib "$PLUGIN_DIR" -v4 -o "$WORK/dump.$k.log" \
      2>"$WORK/dump.$k.err" &
    criu_pids+=($!)
  done
  local rc0=0 rc1=0
  wait "${criu_pids[0]}" || rc0=$?
  wait "${criu_pids[1]}" || rc1=$?
  local secs; secs=$(dt "$t0" "$(now)")
  [ $rc0 = 0 ] && [ $rc1 = 0 ] ||
    fail "concurrent dumps: exit $rc0 and $rc1: $(phos_error "$WORK/dump.0.log") $(phos_error "$WORK/dump.1.log")"
  gone "${pids[@]}"
  for k in 0 1; do
    local name=a; [ $k = 1 ] && name=b
    criu_limit "$CRIU" restore -D "$WORK/${k}.img" --lib "$PLUGIN_DIR" -d -v4 -o "$WORK/restore.$k.log" \
      2>"$WORK/restore.$k.err" || fail "restore of image $k failed: $(phos_error "$WORK/restore.$k.log")"
    carried_on "$WORK/$name.state" "${tokens[$k]}" 2048
  done
  pass "two dumps of 2 GiB processes at once on one GPU both succeeded in $secs s; each image restored: $CARRIED"
}

# A dump next to a running restore on one GPU: process a (4 GiB) is dumped;
# then, at the same moment, a's image is restored and process b (2 GiB) is
# dumped; both succeed, and b's image restores too; each intact.
case_dump_next_to_restore() {
  setup "$bin/gpu_counter"
  start_two_counters 4096 2048
  local pids=("${PIDS[@]}") tokens=("${TOKENS[@]}")
  mkdir -p "$WORK/a.img" "$WORK/b.img"
  criu_limit "$CRIU" dump -t "${pids[0]}" -D "$WORK/a.img" --lib "$PLUGIN_DIR" -v4 -o "$WORK/dump.a.log" \
    2>"$WORK/dump.a.err" || fail "dump of a failed: $(phos_error "$WORK/dump.a.log")"
  gone "${pids[0]}"
  local t0 restore dump rc_r=0 rc_d=0; t0=$(now)
  criu_limit "$CRIU" restore -D "$WORK/a.img" --lib "$PLUGIN_DIR" -d -v4 -o "$WORK/restore.a.log" \
    2>"$WORK/restore.a.err" &
  restore=$!
  criu_limit "$CRIU" dump -t "${pids[1]}" -D "$WORK/b.img" --lib "$PLUGIN_DIR" -v4 -o "$WORK/dump.b.log" \
    2>"$WORK/dump.b.err" &
  dump=$!
  wait $restore || rc_r=$?
  wait $dump || rc_d=$?
  local secs; secs=$(dt "$t0" "$(now)")
  [ $rc_r = 0 ] && [ $rc_d = 0 ] ||
    fail "restore of a and dump of b at once: exit $rc_r and $rc_d: $(phos_error "$WORK/restore.a.log") $(phos_error "$WORK/dump.b.log")"
  carried_on "$WORK/a.state" "${tokens[0]}" 4096
  local a_ok=$CARRIED
  gone "${pids[1]}"
  criu_limit "$CRIU" restore -D "$WORK/b.img" --lib "$PLUGIN_DIR" -d -v4 -o "$WORK/restore.b.log" \
    2>"$WORK/restore.b.err" || fail "restore of b failed: $(phos_error "$WORK/restore.b.log")"
  carried_on "$WORK/b.state" "${tokens[1]}" 2048
  pass "a's restore (4 GiB) and b's dump (2 GiB) at once on one GPU both succeeded in $secs s; a: $a_ok; b restored: $CARRIED"
}

# restore_criu_killed eager|lazy: criu killed while a restore fills device
# memory; no process is left, the GPU's memory comes back, and the next
# restore of the same image works.
#   eager: PHOS_FAULT=stall-in-fill holds the fill once the memory is
#          allocated; criu waits in RESUME_DEVICES_LATE (hook 9) for it;
#   lazy:  an on-demand restore with a slowed fill: criu killed once the
#          process runs again, its memory still being filled; phos-keeper
#          ends it (it must not run on memory that will never be whole).
restore_criu_killed() {
  setup "$bin/gpu_counter"
  start_workload --preload 4096
  wait_counter_above 5
  local token; token=$(state_token)
  criu_dump || fail "criu dump failed: $(phos_error "$WORK/dump.log")"
  gone "$WORKLOAD_PID"; wait_pid_free
  local before; before=$(gpu_used_mib)
  local during=$before reached
  if [ "$1" = lazy ]; then
    PHOS_LAZY_RESTORE=on PHOS_FAULT=slow-fill criu_restore &
    reached="the process runs while its memory is filled"
  elif [ "$1" = early ]; then
    # criu still restoring the CPU side: the keeper knows the process only
    # from watching criu's tree.
    PHOS_FAULT=stall-before-resume criu_restore &
    reached="RESUME_DEVICES_LATE holds for 60 s"
  else
    PHOS_FAULT=stall-in-fill criu_restore &
    reached="plugin: .phos' hook 9"
  fi
  for _ in $(seq 300); do
    during=$(gpu_used_mib)
    [ "$during" -ge $((before + 4000)) ] && grep -q "$reached" "$WORK/restore.log" 2>/dev/null && break
    sleep 0.02
  done
  [ "$during" -ge $((before + 4000)) ] || fail "the restore did not allocate its memory ($before -> $during MiB)"
  grep -q "$reached" "$WORK/restore.log" || fail "the restore did not reach: $reached"
  [ "$1" != early ] && grep -q "all GPU data in" "$WORK/restore.log" && fail "the fill ended before criu could be killed"
  pkill -9 -f "$CRIU restore -D $IMG" || fail "no criu to kill"
  wait || true
  local after=$before
  for _ in $(seq 200); do
    after=$(gpu_used_mib)
    [ -z "$(workload_pids)" ] && [ "$after" -le $((before + 64)) ] && break
    sleep 0.05
  done
  [ -z "$(workload_pids)" ] || fail "a process is left after criu was killed mid-restore: $(ps -o pid,stat,wchan:20,cmd -p "$(workload_pids | paste -sd,)" | tail -n +2)"
  grep -q "ended (restored without its GPU state)" "$IMG/phos-keeper.log" 2>/dev/null ||
    fail "phos-keeper did not end the half-restored process: $(tail -n 3 "$IMG/phos-keeper.log" 2>/dev/null)"
  [ "$after" -le $((before + 64)) ] || fail "GPU memory used: $before MiB before, $during MiB during, $after MiB 10 s after criu was killed"
  criu_restore || fail "the next restore failed: $(phos_error "$WORK/restore.log")"
  restored_pid >/dev/null || fail "no restored process"
  carried_on "$WORK/state" "$token" 4096
  local when="mid-fill"
  [ "$1" = lazy ] && when="while the running process's memory was filled"
  [ "$1" = early ] && when="before RESUME_DEVICES_LATE (the CPU side still restoring)"
  pass "criu killed $when: GPU memory $before -> $during -> $after MiB, phos-keeper ended the half-restored process; the next restore works: $CARRIED"
}
case_restore_criu_killed() { restore_criu_killed eager; }
case_lazy_restore_criu_killed() { restore_criu_killed lazy; }
case_restore_criu_killed_early() { restore_criu_killed early; }

# criu driven through its RPC (criu swrk), as runc and podman drive it, with
# the plugin named in a configuration file, on a GPU process
# (test/e2e/criu_rpc.sh with gpu_counter): a leave_running dump the plugin
# learns of from the keeper, the image complete, the process given back;
# then a dump and a restore through the RPC, intact.
case_rpc_gpu() {
  local out rc
  out=$(PHOS_WORKLOAD=$bin/gpu_counter PHOS_WORKLOAD_ARGS=1024 PHOS_NO_PIDNS=1 bash "$here/../e2e/criu_rpc.sh" 2>&1); rc=$?
  echo "$out"
  [ $rc -eq 0 ] || fail "criu_rpc.sh: $(grep -m1 -o 'FAIL.*' <<<"$out")"
  pass "$(grep -o 'RPC dump with leave_running: .*' <<<"$out" | head -n1 | cut -c1-200); $(grep -o 'RPC dump and restore: .*' <<<"$out" | head -n1)"
}

# criu pre-dump of a GPU process under phos: refused by the plugin before
# criu stops it, saying why; the process counts on intact.
case_pre_dump_refused() {
  setup "$bin/gpu_counter"
  start_workload --preload 1024
  wait_counter_above 5
  local token; token=$(state_token)
  criu_limit "$CRIU" pre-dump -t "$WORKLOAD_PID" -D "$IMG" --lib "$PLUGIN_DIR" -v4 -o "$WORK/pre-dump.log" \
    2>"$WORK/pre-dump.err" && fail "criu pre-dump of a process under phos succeeded"
  local said; said=$(grep -m1 -o "phos: Error: process [0-9]* runs under phos: criu pre-dump.*" "$WORK/pre-dump.log" || true)
  [ -n "$said" ] || fail "no phos message in the pre-dump's log: $(grep -m1 -o 'Error.*' "$WORK/pre-dump.log")"
  carried_on "$WORK/state" "$token" 1024
  pass "refused: ${said:0:110}...; $CARRIED"
}

# lived_on TOKEN MIB: after a failed dump the process is alive, counts on
# intact, its gate is open (else fail); says so in CARRIED.
lived_on() {
  alive "$WORKLOAD_PID" || fail "the process is gone after the failed dump"
  carried_on "$WORK/state" "$1" "$2"
  timeout 20 "$PHOSCTL" status "$WORKLOAD_PID" > "$WORK/status.txt" 2>&1 || true
  grep -q "gate: open" "$WORK/status.txt" || fail "gate not open after the failed dump: $(tr '\n' ' ' < "$WORK/status.txt")"
  CARRIED="$CARRIED, gate open"
}

# onto_small_tmpfs SIZE: a 1 GiB gpu_counter whose images go to a tmpfs of
# SIZE (mount's size=); sets TOKEN.
onto_small_tmpfs() {
  setup "$bin/gpu_counter"
  start_workload --preload 1024
  wait_counter_above 5
  TOKEN=$(state_token)
  IMG=$WORK/small && mkdir -p "$IMG"
  mount -t tmpfs -o size="$1" phos-test-full "$IMG" || fail "cannot mount a small tmpfs"
  AT_EXIT='umount -l "$IMG"'
}

case_dump_disk_full() {
  onto_small_tmpfs 256m
  local token=$TOKEN
  if criu_dump; then fail "the dump of 1 GiB onto 256 MiB succeeded"; fi
  grep -q "phos: Error: .*No space left on device" "$WORK/dump.log" ||
    fail "the plugin's error does not name the full disk: $(phos_error "$WORK/dump.log")"
  lived_on "$token" 1024
  pass "dump refused: $(phos_error "$WORK/dump.log"); the process carried on: $CARRIED"
}

# The same with --leave-running: the image is written behind the process
# (from a snapshot on the GPU), so the disk fills after it runs again; criu
# must still exit with an error, and leave no completion marker. 1000 MiB:
# room for criu's own images (~550 MiB), not for the 1 GiB of GPU data.
case_dump_disk_full_leave_running() {
  onto_small_tmpfs 1000m
  local token=$TOKEN rc=0
  criu_dump --leave-running || rc=$?
  [ $rc -ne 0 ] || fail "the leave-running dump of 1 GiB onto 1000 MiB succeeded"
  grep -q "phos: Error: .*its image could not be written after it ran again: .*No space left on device" \
    "$WORK/dump.log" || fail "the plugin's error does not name the full disk after the process ran again: $(phos_error "$WORK/dump.log") $(grep -m1 Error "$WORK/dump.log")"
  grep -q "snapshotted on the GPU" "$WORK/dump.log" || fail "no snapshot was taken"
  [ ! -e "$IMG"/phos-*-complete.img ] || fail "a completion marker was left behind"
  lived_on "$token" 1024
  pass "criu exit $rc: $(phos_error "$WORK/dump.log"); the process carried on: $CARRIED"
}

# A leave-running dump that fails after the snapshot (its manifest cannot be
# written): the process gets its memory back at once, and the snapshot is
# not written out for nothing.
case_dump_fails_after_snapshot() {
  setup "$bin/gpu_counter"
  start_workload --preload 8192
  wait_counter_above 5
  local token; token=$(state_token)
  mkdir "$IMG/phos-$WORKLOAD_PID-manifest.img.tmp"   # the manifest's temporary file cannot be created
  if criu_dump --leave-running; then fail "the dump succeeded although the manifest could not be written"; fi
  grep -q "snapshotted on the GPU" "$WORK/dump.log" || fail "no snapshot was taken: $(phos_error "$WORK/dump.log")"
  grep -q "phos: Error: .*manifest.img.tmp: Is a directory" "$WORK/dump.log" ||
    fail "the dump log does not say why: $(phos_error "$WORK/dump.log")"
  local written; written=$(find "$IMG" -name 'phos-*-data-*.img' -printf '%s\n' | awk '{s += $1} END {print s + 0}')
  [ "$written" -lt 1048576 ] || fail "$written bytes of the abandoned snapshot were written to the image"
  lived_on "$token" 8192
  pass "dump refused after the snapshot: $(phos_error "$WORK/dump.log"); $written bytes of data written; the process carried on: $CARRIED"
}

case_dump_driver_refuses() {
  setup "$bin/gpu_counter"
  start_workload --preload 1024 --cupti
  wait_counter_above 5
  local token; token=$(state_token)
  if criu_dump; then skip "the driver checkpointed a process with CUPTI attached (dump succeeded); nothing refused here"; fi
  local err; err=$(phos_error "$WORK/dump.log")
  [ -n "$err" ] || err=$(grep -m1 "Error" "$WORK/dump.log" || true)
  [ -n "$err" ] || fail "criu dump failed without an error in its log"
  lived_on "$token" 1024
  pass "dump refused: $err; the process carried on: $CARRIED"
}

# Expected to fail until the plugin keeps device memory alive without criu.
case_dump_criu_killed() {
  setup "$bin/gpu_counter"
  local mib=8192
  start_workload --preload $mib
  wait_counter_above 5
  local token; token=$(state_token)
  # PHOS_FAULT holds the dump after the driver checkpoint, the deepest point
  # (device memory held by criu and phos-keeper only, driver checkpointed).
  PHOS_FAULT=stall-after-checkpoint "$CRIU" dump -t "$WORKLOAD_PID" -D "$IMG" --lib "$PLUGIN_DIR" -v4 \
    -o "$WORK/dump.log" 2>"$WORK/dump.err" &
  local criu=$!
  for _ in $(seq 600); do grep -q "fault injection" "$WORK/dump.log" 2>/dev/null && break; sleep 0.05; done
  grep -q "fault injection" "$WORK/dump.log" || { kill -9 $criu; fail "the dump never reached the injected stall"; }
  kill -9 $criu; wait $criu 2>/dev/null || true
  local at; at=$(state_counter)
  local slices=$((mib / 64)) ok=yes
  wait_above "$WORK/state" $((at + slices + 5)) 30 || ok=no
  local st gate driver
  st=$(alive "$WORKLOAD_PID" && echo alive || echo gone)
  gate=$(timeout 15 "$PHOSCTL" status "$WORKLOAD_PID" 2>&1 | grep -m1 -o "gate: [a-z]*" || echo "gate: no answer")
  driver=$(timeout 15 "$PHOS_BUILD/test/bench/cuda-checkpoint" --get-state --pid "$WORKLOAD_PID" 2>&1 | head -n1 || true)
  local last; last=$(grep -o "phos: .*" "$WORK/dump.log" | tail -n1 || true)
  local keeper; keeper=$(grep -o "phos: process.*given back.*" "$IMG/phos-keeper.log" 2>/dev/null | head -n1)
  local detail="criu killed after the driver checkpoint (its last phos line: '$last'); phos-keeper: '${keeper:-no log}'; within 30 s: process $st, counter $at -> $(state_counter) (state '$(cat "$WORK/state")'), $gate, driver state '$driver'"
  [ $ok = yes ] && [ "$st" = alive ] && intact "$WORK/state" && [ "$(state_token)" = "$token" ] || fail "$detail"
  pass "$detail"
}

# restore_case MIB: a dumped image of a MIB MiB process; sets PID.
restore_case() {
  setup "$bin/gpu_counter"
  start_workload --preload "$1"
  wait_counter_above 5
  criu_dump || fail "criu dump failed (rc $?)"
  PID=$WORKLOAD_PID
  gone "$PID"
  [ -z "$(workload_pids)" ] || fail "process still running after the dump"
}
# refused PATTERN: the restore fails, its log says PATTERN, nothing runs.
refused() {
  if criu_restore; then fail "the restore succeeded"; fi
  grep -q -- "$1" "$WORK/restore.log" || fail "the restore log does not say '$1': $(phos_error "$WORK/restore.log")"
  sleep 0.5
  [ -z "$(workload_pids)" ] || fail "a process runs after the refused restore"
  pass "restore refused: $(phos_error "$WORK/restore.log")"
}
case_restore_corrupt_chunk() {
  restore_case 1024
  [ -f "$IMG/phos-$PID-data-0.img" ] || fail "no data file phos-$PID-data-0.img in the image"
  printf '\xff' | dd of="$IMG/phos-$PID-data-0.img" bs=1 seek=$((4096 + 12345)) conv=notrunc status=none
  refused "checksum mismatch"
}
case_restore_missing_data_file() {
  restore_case 1024
  rm "$IMG/phos-$PID-data-0.img" || fail "no data file phos-$PID-data-0.img in the image"
  refused "data file phos-$PID-data-0.img is missing"
}
case_restore_incomplete_image() {
  restore_case 1024
  rm "$IMG/phos-$PID-complete.img" || fail "no completion marker phos-$PID-complete.img in the image"
  refused "incomplete image: phos-$PID-complete.img is missing"
}
case_restore_other_gpu_model() {
  restore_case 1024
  "$PHOS_BUILD/test/tools/phos-image-edit" "$IMG" "$PID" device-name 0 "NVIDIA Phos-Test-GPU" > "$WORK/edit.log" 2>&1 ||
    fail "phos-image-edit failed: $(cat "$WORK/edit.log")"
  # The host's own model, as the driver names it (H100, H200, ...).
  local model; model=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 | head -n1)
  refused "device 0 (NVIDIA Phos-Test-GPU) would go to GPU 0 here, a $model; restoring needs the same model"
}
case_restore_too_little_memory() {
  restore_case 2048
  "$bin/gpu_hog" "$WORK/hog.ready" --leave 1024 > "$WORK/hog.log" 2>&1 &
  local hog=$!
  AT_EXIT="kill $hog; wait $hog"
  for _ in $(seq 1200); do [ -s "$WORK/hog.ready" ] && break; alive $hog || break; sleep 0.05; done
  [ -s "$WORK/hog.ready" ] || fail "the memory hog did not start"
  echo "hog: $(cat "$WORK/hog.ready")"
  refused "OUT_OF_MEMORY"
}

case_not_preloaded() {
  setup "$bin/gpu_counter"
  export PATH=$PHOS_BUILD/test/bench:$PATH   # cuda-checkpoint, for CRIU's cuda plugin
  # The cuda plugin claims every process, so phos must be asked first. criu
  # loads the directory in its order (on tmpfs: creation order) and asks
  # the plugins in the reverse (measured: phos linked first was asked last),
  # so the cuda plugin's link goes in first.
  rm "$PLUGIN_DIR/phos_plugin.so"
  ln -s "$PHOS_BUNDLE/criu/cuda_plugin.so" "$PLUGIN_DIR/cuda_plugin.so"
  ln -s "$PHOS_BUILD/plugin/phos_plugin.so" "$PLUGIN_DIR/phos_plugin.so"
  start_workload 1024
  wait_counter_above 5
  dump_restore
  grep -q "phos: process $WORKLOAD_PID has no phos agent; left to other plugins" "$WORK/dump.log" ||
    fail "phos did not leave the process to other plugins; hooks called: $(grep -o "plugin: \`[^']*' hook [0-9]*" "$WORK/dump.log" | sort -u | tr '\n' ' ')"
  grep -q "Checkpointing CUDA devices on pid $WORKLOAD_PID" "$WORK/dump.log" || fail "CRIU's cuda plugin did not checkpoint the process"
  carried_on "$WORK/state" "$TOKEN" 1024
  pass "phos left it to other plugins, CRIU's cuda plugin dumped it in $DUMP_S s and restored it in $RESTORE_S s; $CARRIED"
}

case_restore_next_to_gpu_process() {
  setup "$bin/gpu_counter"
  "$bin/gpu_hog" "$WORK/hog.ready" --hold 8192 > "$WORK/hog.log" 2>&1 &
  local hog=$!
  AT_EXIT="kill $hog; wait $hog"
  for _ in $(seq 600); do [ -s "$WORK/hog.ready" ] && break; alive $hog || break; sleep 0.05; done
  [ -s "$WORK/hog.ready" ] || fail "the other GPU process did not start"
  start_workload --preload 1024
  wait_counter_above 5
  dump_restore
  carried_on "$WORK/state" "$TOKEN" 1024
  alive $hog || fail "the other GPU process died: $(cat "$WORK/hog.log")"
  pass "restored in $RESTORE_S s (dump $DUMP_S s) next to a GPU process that $(cut -d, -f1 "$WORK/hog.ready") and ran on unharmed; $CARRIED"
}

gpu_count() { nvidia-smi -L 2>/dev/null | grep -c '^GPU'; }
gpu_uuid() { nvidia-smi -L | sed -n "$(($1 + 1))s/.*(UUID: \(GPU-[^)]*\)).*/\1/p"; }
# The UUID of the GPU process PID runs on, as nvidia-smi sees it.
gpu_of_pid() { nvidia-smi --query-compute-apps=pid,gpu_uuid --format=csv,noheader | awk -F', *' -v p="$1" '$1 == p {print $2}' | head -n1; }

case_multi_gpu_process() {  # one process with 2 GiB on each of two GPUs
  [ "$(gpu_count)" -ge 2 ] || skip "needs 2 GPUs (nvidia-smi sees $(gpu_count))"
  setup "$bin/gpu_counter"
  start_workload --preload 2048 --devices 2
  wait_counter_above 5 60
  local token; token=$(state_token)
  local t0 t1; t0=$(now); criu_dump --leave-running || fail "leave-running dump failed (rc $?)"; t1=$(now)
  carried_on "$WORK/state" "$token" 2048
  local lr="leave-running dump in $(dt "$t0" "$t1") s, $CARRIED"
  local snap; snap=$(grep -o "[0-9.]* MiB snapshotted on the GPU in [0-9.]* ms" "$WORK/dump.log" | head -n1)
  [ -n "$snap" ] || fail "the leave-running dump took no snapshot: $(grep -o 'phos: process [0-9]*: no snapshot.*' "$WORK/dump.log")"
  # Its image, written behind the running process from snapshots on both
  # GPUs, restored: the memory as it was at the dump.
  kill -9 "$WORKLOAD_PID"; gone "$WORKLOAD_PID"
  rm -f "$WORK/state"
  criu_restore || fail "restore of the leave-running image failed (rc $?)"
  WORKLOAD_PID=$(restored_pid) || fail "no process restored from the leave-running image"
  for _ in $(seq 200); do [ -s "$WORK/state" ] && break; sleep 0.05; done
  carried_on "$WORK/state" "$token" 2048
  lr="$lr ($snap); its image restored: $CARRIED"
  rm -rf "$IMG" && mkdir "$IMG"
  dump_restore
  carried_on "$WORK/state" "$TOKEN" 2048
  local devs; devs=$("$PHOSCTL" show "$IMG" 2>/dev/null | grep -c "^ *device [0-9]:" || true)
  [ "$devs" = 2 ] || fail "the image names $devs devices, expected 2: $("$PHOSCTL" show "$IMG" 2>&1 | head -n 5)"
  pass "2 GPUs, $(phos_wrote); $lr; dump $DUMP_S s, restore $RESTORE_S s, restored process: $CARRIED on both GPUs"
}

# One process with 2 GiB on each of two GPUs, dumped with --leave-running
# under copy-on-write: one window over both GPUs' memory, a pool on each GPU,
# no stopped copy; the process runs on intact, and its image restored is the
# memory at the freeze on both GPUs.
case_multi_gpu_process_cow() {
  [ "$(gpu_count)" -ge 2 ] || skip "needs 2 GPUs (nvidia-smi sees $(gpu_count))"
  setup "$bin/gpu_counter"
  start_workload --preload 2048 --devices 2
  wait_counter_above 5 60
  local token; token=$(state_token)
  local t0 t1; t0=$(now)
  PHOS_COPY_ON_WRITE=always criu_dump --leave-running || fail "leave-running dump failed: $(phos_error "$WORK/dump.log")"
  t1=$(now)
  ! grep -q "no copy-on-write" "$WORK/dump.log" ||
    fail "the stopped copy: $(grep -o 'no copy-on-write.*' "$WORK/dump.log" | head -n1)"
  local window; window=$(grep -o "copy-on-write window over [0-9.]* MiB in [0-9]* chunks of [0-9]* KiB, on 2 GPUs; a pool per GPU: GPU [0-9]*: [0-9]* slots ([0-9.]* MiB); GPU [0-9]*: [0-9]* slots ([0-9.]* MiB)" "$WORK/dump.log")
  [ -n "$window" ] || fail "no window with a pool per GPU: $(grep -o 'phos: process [0-9]*: .*window.*' "$WORK/dump.log" | head -n2)"
  grep -q "copy-on-write window closed" "$WORK/dump.log" || fail "the process's copy window did not close: $(phos_error "$WORK/dump.log")"
  local checked; checked=$(grep -o "checksum: [0-9]* chunks equal to the freeze (T0: [0-9.]* GiB in [0-9.]* ms)" "$WORK/dump.log" | head -n1)
  [ -n "$checked" ] || fail "the copy was not checked by checksum (the default)"
  local saved; saved=$(grep -o '[0-9]* chunks ([0-9.]* MiB) saved into the pool' "$WORK/dump.log" | head -n1)
  carried_on "$WORK/state" "$token" 2048
  local lr="leave-running dump in $(dt "$t0" "$t1") s, $CARRIED"
  kill -9 "$WORKLOAD_PID"; gone "$WORKLOAD_PID"
  rm -f "$WORK/state"
  criu_restore || fail "restore of the copy-on-write image failed: $(phos_error "$WORK/restore.log")"
  WORKLOAD_PID=$(restored_pid) || fail "no process restored from the copy-on-write image"
  for _ in $(seq 200); do [ -s "$WORK/state" ] && break; sleep 0.05; done
  carried_on "$WORK/state" "$token" 2048
  pass "2 GPUs, $window; $lr; ${saved:-0 chunks saved}; $checked; its image restored: $CARRIED on both GPUs"
}

case_cuda_visible_devices() {  # the program sees only GPU 1, as its device 0
  [ "$(gpu_count)" -ge 2 ] || skip "needs 2 GPUs (nvidia-smi sees $(gpu_count))"
  setup "$bin/gpu_counter"
  CUDA_VISIBLE_DEVICES=1 start_workload --preload 1024
  wait_counter_above 5 60
  local token; token=$(state_token)
  local gpu1; gpu1=$(gpu_uuid 1)
  [ "$(gpu_of_pid "$WORKLOAD_PID")" = "$gpu1" ] || fail "the workload does not run on GPU 1 ($gpu1)"
  criu_dump --leave-running || fail "leave-running dump failed (rc $?)"
  grep -q "its device 0 is GPU 1 here" "$WORK/dump.log" ||
    fail "the plugin did not find the program's device 0 as GPU 1: $(grep -o 'phos: .*' "$WORK/dump.log" | head -n 8 | tr '\n' '|')"
  "$PHOSCTL" show "$IMG" > "$WORK/show.txt" 2>&1
  grep -q "$gpu1" "$WORK/show.txt" || fail "the image does not name GPU 1 ($gpu1): $(tr '\n' '|' < "$WORK/show.txt")"
  carried_on "$WORK/state" "$token" 1024
  local lr="leave-running: $CARRIED"
  # The leave-running image restored: onto GPU 1 again, intact.
  kill -9 "$WORKLOAD_PID"; gone "$WORKLOAD_PID"
  rm -f "$WORK/state"
  criu_restore || fail "restore failed (rc $?): $(phos_error "$WORK/restore.log")"
  local pid; pid=$(restored_pid) || fail "no restored process"
  for _ in $(seq 200); do [ -s "$WORK/state" ] && break; sleep 0.05; done
  carried_on "$WORK/state" "$token" 1024
  local after; after=$(gpu_of_pid "$pid")
  [ "$after" = "$gpu1" ] || fail "the restored process runs on '$after', not on GPU 1 ($gpu1)"
  ! grep -q "restored onto GPU" "$WORK/restore.log" || fail "the restore moved the GPU: $(grep -o 'phos: .*restored onto.*' "$WORK/restore.log")"
  pass "CUDA_VISIBLE_DEVICES=1: dumped from GPU 1 as the program's device 0 ($lr), restored onto GPU 1 ($after): $CARRIED"
}

case_restore_other_gpu() {  # dumped on GPU 0, restored onto GPU 1 (PHOS_GPU_MAP=0=1)
  [ "$(gpu_count)" -ge 2 ] || skip "needs 2 GPUs (nvidia-smi sees $(gpu_count))"
  setup "$bin/gpu_counter"
  start_workload --preload 1024
  wait_counter_above 5 60
  local before; before=$(gpu_of_pid "$WORKLOAD_PID")
  [ "$before" = "$(gpu_uuid 0)" ] || fail "the workload runs on '$before', not on GPU 0 ($(gpu_uuid 0))"
  PHOS_GPU_MAP=0=1 dump_restore
  local pid; pid=$(restored_pid)
  carried_on "$WORK/state" "$TOKEN" 1024
  local after; after=$(gpu_of_pid "$pid")
  grep -q "restored onto GPU 1" "$WORK/restore.log" || fail "the plugin did not place device 0 on GPU 1: $(phos_error "$WORK/restore.log")"
  [ "$after" = "$(gpu_uuid 1)" ] || fail "the restored process runs on '$after', not on GPU 1 ($(gpu_uuid 1))"
  pass "dumped on GPU 0 ($before), restored onto GPU 1 ($after) in $RESTORE_S s; $CARRIED"
}

# ---- migration (issue 18: phosctl migrate, migrate_to) ----------------------

# migrate_into_img PID GPU [ENV=VALUE...]: `phosctl migrate PID --to GPU`
# (GPU a map SRC:DST,...: --gpu-map) into $IMG, its criu logs kept as the
# case's dump.log and restore.log; MIGRATED: its summary line.
migrate_into_img() {
  local pid=$1 gpu=$2 to=--to
  shift 2
  [[ $gpu == *:* ]] && to=--gpu-map
  MIGRATED=$(env "$@" "$PHOSCTL" migrate "$pid" "$to" "$gpu" --dir "$IMG" --lib "$PLUGIN_DIR" --criu "$CRIU" 2>&1)
  local rc=$?
  cp "$IMG/migrate-dump.log" "$WORK/dump.log" 2>/dev/null || true
  cp "$IMG/migrate-restore.log" "$WORK/restore.log" 2>/dev/null || true
  cp "$IMG/phos-keeper.log" "$WORK/keeper.log" 2>/dev/null || true
  return $rc
}
# What a migration's dump log says it did: moved or kept, recopied.
migration_said() {
  { grep -a -o '[0-9]* allocations, [0-9.]* MiB \(moved to GPUs\? [-0-9>, ]* [^)]*)\|kept in place on GPUs\? [-0-9>, ]*\)' "$WORK/dump.log" | head -n1
    grep -a -o "first pass copied [0-9]* chunks ([0-9.]* MiB) in [0-9.]* ms" "$WORK/dump.log" | head -n1
    grep -a -o "final pass copied [0-9]* chunks ([0-9]* of them again)" "$WORK/dump.log" | head -n1; } | paste -sd';' - | sed 's/;/; /g'
}

# migrate_torch_case GPU [ENV=VALUE...]: torch_train.py (150 steps) moved to
# GPU with `phosctl migrate` after step 40 while it trains; its loss curve
# bitwise equal to an uninterrupted run's, no GPU data file in the image.
migrate_torch_case() {
  local n=150 script=$here/torch_train.py gpu=$1
  shift
  setup "$script" "$(python3 -c 'import sys; print(sys.executable)')"
  export CUBLAS_WORKSPACE_CONFIG=:4096:8
  timeout 180 env LD_PRELOAD="$LIBPHOS" python3 "$script" "$WORK/ref.state" "$WORK/ref.losses" $n 0 \
    > "$WORK/reference.log" 2>&1 || fail "the reference run failed (rc $?)"
  start_workload --preload "$WORK/run.losses" $n
  reach 40 120 "before the migration"
  TOKEN=$(state_token)
  local before; before=$(gpu_of_pid "$WORKLOAD_PID")
  migrate_into_img "$WORKLOAD_PID" "$gpu" "$@" || fail "phosctl migrate failed: $MIGRATED; $(phos_error "$WORK/dump.log") $(phos_error "$WORK/restore.log")"
  ls "$IMG"/phos-*-data-*.img >/dev/null 2>&1 && fail "the migration wrote GPU data files"
  grep -q "restored with its kept memory; let go" "$WORK/keeper.log" || fail "phos-keeper did not hand the memory over"
  local pid; pid=$(restored_pid) || fail "no restored process"
  local after; after=$(gpu_of_pid "$pid")
  [ "$after" = "$(gpu_uuid "$gpu")" ] || fail "the migrated process runs on '$after', not GPU $gpu ($(gpu_uuid "$gpu"))"
  reach $((n - 1)) 120 "after the migration"
  [ "$(state_token)" = "$TOKEN" ] || fail "token changed"
  cmp -s "$WORK/ref.losses" "$WORK/run.losses" ||
    fail "loss curve differs from the uninterrupted run's from step $(diff "$WORK/ref.losses" "$WORK/run.losses" | grep -m1 -o '^[<>] [0-9]*' | cut -c3-) on"
  pass "loss curve of $n steps bitwise equal to an uninterrupted run's across the migration (GPU $before -> $after); $(sed 's/^migrated //' <<<"$MIGRATED"); $(migration_said)"
}
# To the GPU it runs on: its memory stays in place, nothing is copied.
case_migrate_torch() { migrate_torch_case 0; }
# The same memory copied (migrate_copy=always): soft recopy's first pass
# while it trains, then what it wrote meanwhile, device to device.
case_migrate_torch_copy() { migrate_torch_case 0 PHOS_MIGRATE_COPY=always PHOS_COW_TRUST=speculated; }
# A DDP job of one rank (an NCCL communicator, its all-reduce every step):
# released at the migration's quiesce, made again on the target.
case_migrate_torch_ddp_one_rank() { PHOS_TEST_DDP=1 migrate_torch_case 0; }
# (2 GPUs) To the other GPU, peer to peer.
case_migrate_torch_2gpu() {
  [ "$(gpu_count)" -ge 2 ] || skip "needs 2 GPUs (nvidia-smi sees $(gpu_count))"
  migrate_torch_case 1 PHOS_COW_TRUST=speculated
}

# (2 GPUs) A process on both GPUs, with peer access both ways, migrated
# with its GPUs swapped (issue 31 part 2): each GPU's memory to the other.
case_migrate_multi_gpu() { migrate_multi_gpu_case --peer; }
# The same without peer access between its GPUs: whether the driver's
# restore onto swapped GPUs depends on it.
case_migrate_multi_gpu_nopeer() { migrate_multi_gpu_case; }
migrate_multi_gpu_case() {  # migrate_multi_gpu_case [--peer]
  [ "$(gpu_count)" -ge 2 ] || skip "needs 2 GPUs (nvidia-smi sees $(gpu_count))"
  setup "$bin/gpu_counter"
  start_workload --preload 1024 --devices 2 "$@"
  wait_counter_above 5 60
  TOKEN=$(state_token)
  intact "$WORK/state" || fail "the workload's memory or peer reads are wrong before the migration: $(cat "$WORK/state")"
  # A map that leaves one of its GPUs out: refused, the process runs on.
  if migrate_into_img "$WORKLOAD_PID" 0:1; then fail "a map leaving GPU 1 unmapped was taken"; fi
  grep -q "the process uses GPU 1, which the GPU map 0:1 leaves unmapped" "$WORK/dump.log" ||
    fail "the refusal does not say GPU 1 is unmapped: $MIGRATED"
  carried_on "$WORK/state" "$TOKEN" 1024
  local refused="map 0:1 refused (GPU 1 unmapped), $CARRIED"
  rm -rf "${IMG:?}"/*
  local uuid0 uuid1; uuid0=$(gpu_uuid 0) uuid1=$(gpu_uuid 1)
  migrate_into_img "$WORKLOAD_PID" 0:1,1:0 PHOS_COW_TRUST=speculated ||
    fail "phosctl migrate --gpu-map 0:1,1:0 failed: $MIGRATED; $(phos_error "$WORK/dump.log") $(phos_error "$WORK/restore.log")"
  ls "$IMG"/phos-*-data-*.img >/dev/null 2>&1 && fail "the migration wrote GPU data files"
  grep -q "MiB moved to GPUs 0->1, 1->0" "$WORK/dump.log" || fail "the dump did not move each GPU's memory to the other"
  grep -q "taken from phos-keeper, on GPUs device 0's on $uuid1, device 1's on $uuid0" "$WORK/restore.log" ||
    fail "the restore did not take device 0's memory on GPU 1 and device 1's on GPU 0"
  grep -q "restored with its kept memory; let go" "$WORK/keeper.log" || fail "phos-keeper did not hand the memory over"
  local pid; pid=$(restored_pid) || fail "no restored process"
  local on; on=$(nvidia-smi --query-compute-apps=pid,gpu_uuid --format=csv,noheader | awk -F', *' -v p="$pid" '$1 == p' | wc -l)
  [ "$on" = 2 ] || fail "the migrated process runs on $on GPU(s), not 2"
  carried_on "$WORK/state" "$TOKEN" 1024
  pass "$refused; $(sed 's/^migrated //' <<<"$MIGRATED"); $(migration_said); after it: $CARRIED on both GPUs${1:+, peer reads intact}"
}

# The target GPU fails mid-copy (PHOS_FAULT=fail-migration-copy): the dump
# fails, the source runs on intact where it was, no keeper is left.
case_migrate_fails_mid_copy() {
  setup "$bin/gpu_counter"
  start_workload --preload 1024
  wait_above "$WORK/state" 5 60 || fail "the workload does not count"
  TOKEN=$(state_token)
  if migrate_into_img "$WORKLOAD_PID" 0 PHOS_MIGRATE_COPY=always PHOS_COW_TRUST=speculated PHOS_RECOPY=off \
       PHOS_FAULT=fail-migration-copy; then fail "the migration succeeded although its copy failed"; fi
  grep -q "the target GPU fails" "$WORK/dump.log" || fail "the dump log does not say the copy failed"
  grep -q "the process runs on where it was" <<<"$MIGRATED" || fail "phosctl does not say the source runs on: $MIGRATED"
  alive "$WORKLOAD_PID" || fail "the source is gone"
  carried_on "$WORK/state" "$TOKEN" 1024
  sleep 0.5
  [ -z "$(pgrep -f 'phos-keeper --detach' || true)" ] || fail "a phos-keeper still runs after the failed migration"
  pass "the copy to the target failed; phosctl: $(grep -o 'the dump failed.*' <<<"$MIGRATED" | head -n1); the source $CARRIED"
}

# No restore comes (migrate_keep_s=2): phos-keeper writes the kept device
# memory of gpu_counter (4 GiB, in place or copied) into the image
# directory; the image then restores like any other, every byte verified,
# and the GPU's memory is back to where it was before the restore.
migrate_spilled_case() {
  setup "$bin/gpu_counter"
  start_workload --preload 4096
  wait_above "$WORK/state" 5 60 || fail "the workload does not count"
  TOKEN=$(state_token)
  ( export PHOS_MIGRATE_TO=0 PHOS_MIGRATE_KEEP_S=2 PHOS_COW_TRUST=speculated "$@"; criu_dump ) ||
    fail "the migration's dump failed: $(phos_error "$WORK/dump.log")"
  local kept_mib; kept_mib=$(gpu_used_mib)
  for _ in $(seq 400); do
    grep -q "written into the image directory\|could not be written" "$IMG/phos-keeper.log" 2>/dev/null && break
    sleep 0.05
  done
  cp "$IMG/phos-keeper.log" "$WORK/keeper.log" 2>/dev/null || true
  grep -q "kept GPU memory written into the image directory" "$IMG/phos-keeper.log" ||
    fail "phos-keeper did not write the kept memory: $(tail -n 3 "$IMG/phos-keeper.log" 2>/dev/null)"
  for _ in $(seq 100); do [ -z "$(pgrep -f 'phos-keeper --detach' || true)" ] && break; sleep 0.05; done
  local freed; freed=$(gpu_used_mib)
  [ "$freed" -le $((kept_mib - 3500)) ] || fail "the keeper did not let go of the GPU memory: $kept_mib MiB used kept, $freed MiB after"
  "$PHOSCTL" verify "$IMG" > "$WORK/verify.log" 2>&1 || fail "phosctl verify of the spilled image: $(tail -n 2 "$WORK/verify.log")"
  "$PHOSCTL" show --json "$IMG" | python3 -c '
import json, sys
m = json.load(sys.stdin)["images"][0]
assert m["complete"] and "kept" not in m and m["size"]["logical_bytes"] >= 4 << 30, m["size"]' ||
    fail "the spilled image is not an ordinary, complete one"
  wait_pid_free
  criu_restore || fail "restore of the spilled image failed: $(phos_error "$WORK/restore.log")"
  restored_pid >/dev/null || fail "no restored process"
  grep -q "taken from phos-keeper" "$WORK/restore.log" && fail "the restore asked a keeper"
  carried_on "$WORK/state" "$TOKEN" 4096
  pass "kept ${kept_mib} MiB used on the GPU; after migrate_keep_s the keeper wrote it into the image (phosctl verify: $(sed -n 's/.*: ok, //p' "$WORK/verify.log" | head -n1)) and let go (${freed} MiB used); restored from the files: $CARRIED"
}
case_migrate_spilled() { migrate_spilled_case; }
case_migrate_spilled_copy() { migrate_spilled_case PHOS_MIGRATE_COPY=always; }

# criu killed during a migration's restore, after it took the kept memory
# (held before RESUME_DEVICES_LATE): the half-restored process is ended, the
# memory stays with the migration's keeper, and the next restore maps it:
# every byte of gpu_counter's 4 GiB verified.
case_migrate_restore_killed() {
  setup "$bin/gpu_counter"
  start_workload --preload 4096
  wait_above "$WORK/state" 5 60 || fail "the workload does not count"
  TOKEN=$(state_token)
  PHOS_MIGRATE_TO=0 PHOS_MIGRATE_COPY=always PHOS_COW_TRUST=speculated criu_dump ||
    fail "the migration's dump failed: $(phos_error "$WORK/dump.log")"
  gone "$WORKLOAD_PID"; wait_pid_free
  PHOS_FAULT=stall-before-resume criu_restore &
  for _ in $(seq 600); do grep -q "fault injection (PHOS_FAULT)" "$WORK/restore.log" 2>/dev/null && break; sleep 0.05; done
  grep -q "taken from phos-keeper" "$WORK/restore.log" || fail "the restore did not take the kept memory"
  pkill -9 -f "$CRIU restore -D $IMG" || fail "no criu to kill"
  wait || true
  for _ in $(seq 200); do [ -z "$(workload_pids)" ] && break; sleep 0.05; done
  [ -z "$(workload_pids)" ] || fail "the half-restored process runs on"
  [ -n "$(pgrep -f 'phos-keeper --detach' || true)" ] || fail "the migration's keeper is gone"
  criu_restore || fail "the next restore failed: $(phos_error "$WORK/restore.log")"
  restored_pid >/dev/null || fail "no restored process"
  cp "$IMG/phos-keeper.log" "$WORK/keeper.log" 2>/dev/null || true
  grep -q "restored with its kept memory; let go" "$IMG/phos-keeper.log" || fail "the keeper did not hand the memory over"
  carried_on "$WORK/state" "$TOKEN" 4096
  pass "criu killed mid-restore; the kept memory stayed with phos-keeper; the next restore took it: $CARRIED"
}

# llama_request DIR SEED: one request to llama_server.py; its tokens.
llama_request() {
  rm -f "$1/reply"
  echo "seed=$2 prompt_len=32 new_tokens=24" > "$1/request.tmp" && mv "$1/request.tmp" "$1/request"
  for _ in $(seq 1200); do [ -s "$1/reply" ] && break; sleep 0.05; done
  [ -s "$1/reply" ] || fail "no reply from the inference server"
  sed -n 's/^tokens //p' "$1/reply"
}
# An inference server (llama_server.py, 1b shape, seeded random weights)
# migrated between two requests: the same request answered with the same
# tokens after the migration as before it (and as a second request before).
migrate_llama_case() {
  local gpu=$1
  shift
  setup "$here/llama_server.py" "$(python3 -c 'import sys; print(sys.executable)')"
  local req=$WORK/req
  mkdir -p "$req"
  ( setsid env LD_PRELOAD="$LIBPHOS" "$PHOS_WORKLOAD_RUNNER" "$here/llama_server.py" --reqdir "$req" --shape 1b \
      --seed 7 </dev/null >/dev/null 2>&1 & )
  for _ in $(seq 2400); do [ -s "$req/ready" ] && break; sleep 0.05; done
  [ -s "$req/ready" ] || fail "the server did not start: $(tail -n 3 "$req/server.log" 2>/dev/null | tr '\n' ' ')"
  local pid; pid=$(awk '$1 == "pid" {print $2}' "$req/ready")
  AT_EXIT="kill -9 $pid 2>/dev/null; $AT_EXIT"
  local first second after
  first=$(llama_request "$req" 11)
  second=$(llama_request "$req" 11)
  [ "$first" = "$second" ] || fail "the server answers one request two ways before any migration"
  WORKLOAD_PID=$pid
  migrate_into_img "$pid" "$gpu" "$@" || fail "phosctl migrate failed: $MIGRATED; $(phos_error "$WORK/dump.log") $(phos_error "$WORK/restore.log")"
  after=$(llama_request "$req" 11)
  local by; by=$(sed -n 's/^pid //p' "$req/reply")
  [ "$after" = "$first" ] || fail "the migrated server answers differently: $after (before: $first)"
  kill -9 "$by" 2>/dev/null
  pass "the same 24 tokens after the migration as before (answered by pid $by); $(sed 's/^migrated //' <<<"$MIGRATED"); $(migration_said)"
}
case_migrate_llama() { migrate_llama_case 0; }
case_migrate_llama_copy() { migrate_llama_case 0 PHOS_MIGRATE_COPY=always PHOS_COW_TRUST=speculated; }
case_migrate_llama_2gpu() {
  [ "$(gpu_count)" -ge 2 ] || skip "needs 2 GPUs (nvidia-smi sees $(gpu_count))"
  migrate_llama_case 1 PHOS_COW_TRUST=speculated
}

# An inference server with a port (llama_server.py --http-port, 1b shape,
# under libphos): criu must dump its listening socket (criu 4.2 on these
# kernels; --tcp-established, nftables network lock). It answers over HTTP,
# is dumped with --leave-running and answers the next request; then killed
# and restored from that image, the restored server answers the same request
# with the same tokens, on the same port.
http_generate() {  # http_generate PORT SEED: the tokens of one HTTP request
  LD_PRELOAD= timeout 60 python3 -c '
import sys, urllib.request
with urllib.request.urlopen("http://127.0.0.1:%s/generate?seed=%s&prompt_len=32&new_tokens=24" % tuple(sys.argv[1:3]), timeout=50) as r:
    print(dict(l.split(" ", 1) for l in r.read().decode().splitlines())["tokens"])' "$1" "$2"
}
case_llama_http() {
  setup "$here/llama_server.py" "$(python3 -c 'import sys; print(sys.executable)')"
  export CRIU_NET_ARGS="--tcp-established --network-lock nftables"
  local req=$WORK/req
  mkdir -p "$req"
  ( setsid env LD_PRELOAD="$LIBPHOS" "$PHOS_WORKLOAD_RUNNER" "$here/llama_server.py" --reqdir "$req" --shape 1b \
      --seed 7 --http-port 0 </dev/null >/dev/null 2>&1 & )
  for _ in $(seq 2400); do [ -s "$req/ready" ] && break; sleep 0.05; done
  [ -s "$req/ready" ] || fail "the server did not start: $(tail -n 3 "$req/server.log" 2>/dev/null | tr '\n' ' ')"
  local pid port; pid=$(awk '$1 == "pid" {print $2}' "$req/ready"); port=$(awk '$1 == "port" {print $2}' "$req/ready")
  AT_EXIT="pkill -9 -f -- '--reqdir $req' 2>/dev/null; $AT_EXIT"
  local first after original restored t0 t1 t2 t3
  first=$(http_generate "$port" 11) || fail "no HTTP answer before the dump"
  WORKLOAD_PID=$pid
  t0=$(now); criu_dump --leave-running || fail "criu dump --leave-running failed: $(phos_error "$WORK/dump.log")"; t1=$(now)
  original=$(http_generate "$port" 11) || fail "no HTTP answer after the leave-running dump"
  [ "$original" = "$first" ] || fail "the server answers otherwise after the dump"
  kill -9 "$pid"; gone "$pid"; wait_pid_free
  t2=$(now); criu_restore || fail "criu restore failed: $(phos_error "$WORK/restore.log")"; t3=$(now)
  restored=$(http_generate "$port" 11) || fail "the restored server does not answer on port $port"
  [ "$restored" = "$original" ] || fail "the restored server answers otherwise: $restored (before: $original)"
  pass "24 tokens over HTTP on port $port equal before the dump, after the leave-running dump and from the restored server; dump $(dt "$t0" "$t1") s, restore $(dt "$t2" "$t3") s"
}

# ---- jobs over 2 GPUs (issue 31): tensor parallel, device_map, peer access --

need_2gpus() { [ "$(gpu_count)" -ge 2 ] || skip "needs 2 GPUs (nvidia-smi sees $(gpu_count))"; }
# tree_pids PID: PID and every process below it.
tree_pids() {
  local c
  echo "$1"
  for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do tree_pids "$c"; done
}
# The GPUs (UUIDs) a process has memory on, as nvidia-smi sees it, sorted.
gpus_of_pid() { nvidia-smi --query-compute-apps=pid,gpu_uuid --format=csv,noheader | awk -F', *' -v p="$1" '$1 == p {print $2}' | sort -u; }
# Stalls of a leave-running dump, per process, from its log ("12.3/45.6 ms").
dump_stalls() { { grep -o 'gate reopened after [0-9.]* ms' "$WORK/dump.log" || true; } | { grep -o '[0-9.]*' || true; } | paste -sd/ -; }
# first_diff RUN REF: the first step at which two "STEP ..." files differ.
first_diff() { diff "$2" "$1" | grep -m1 -o '^[<>] [0-9]*' | cut -c3-; }
# wait_lines FILE N: FILE has N lines within 10 s (a job's other ranks
# write their last step a moment after rank 0).
wait_lines() {
  for _ in $(seq 200); do [ "$(wc -l < "$1" 2>/dev/null || echo 0)" -ge "$2" ] && return 0; sleep 0.05; done
  return 1
}
# same_as_ref NAME...: run.NAME equals ref.NAME for each (else fail, naming
# the first step that differs).
same_as_ref() {
  local f
  for f in "$@"; do
    [ -s "$WORK/ref.$f" ] || fail "the reference run wrote no $f"
    wait_lines "$WORK/run.$f" "$(wc -l < "$WORK/ref.$f")" || true
    cmp -s "$WORK/ref.$f" "$WORK/run.$f" ||
      fail "$f differs from the uninterrupted run's from step $(first_diff "$WORK/run.$f" "$WORK/ref.$f") on (dumped at step ${DUMPED:-?})"
  done
}
# restored_tail_same NAME N: after a leave-running dump the program ran to
# step N; its image restored runs again from its freeze (step F) and
# appends F+1..N to run.NAME; those lines must equal ref.NAME's. Sets FROZEN.
restored_tail_same() {
  local run=$WORK/run.$1 first
  for _ in $(seq 2400); do
    [ "$(wc -l < "$run")" -gt "$2" ] && [ "$(tail -n1 "$run" | cut -d' ' -f1)" = "$2" ] && break
    sleep 0.05
  done
  first=$(sed -n "$(($2 + 1))p" "$run" | cut -d' ' -f1)
  [ -n "$first" ] || fail "the restored program wrote nothing to $1"
  tail -n +$(($2 + 1)) "$run" | cmp -s - <(tail -n +"$first" "$WORK/ref.$1") ||
    fail "the restored image's $1 differ from the uninterrupted run's (frozen at step $((first - 1)))"
  FROZEN=$((first - 1))
}
# step_gaps FILE FROM TO: the program's own view of a stall, from "STEP
# TIME" lines: its longest step of FROM..TO (a dump's) and the median step
# of the whole run, in ms.
step_gaps() {
  local longest median
  longest=$(awk -v a="$2" -v b="$3" 'NR > 1 && $1 > a && $1 <= b && ($2 - t) * 1000 > m {m = ($2 - t) * 1000} {t = $2} END {printf "%.0f", m}' "$1")
  median=$(awk 'NR > 1 {print ($2 - t) * 1000} {t = $2}' "$1" | sort -n | awk '{a[NR] = $1} END {if (NR) printf "%.0f", a[int((NR + 1) / 2)]}')
  echo "longest step around it ${longest} ms (median ${median} ms)"
}

# CRIU's cuda plugin beside a case (anchor_*): the same program without
# libphos, dumped with --leave-running, then dumped and restored, through
# CRIU's cuda plugin (cuda-checkpoint on PATH). What it did goes into the
# case's line ("CRIU's cuda plugin: PASS|FAIL ..."); the case passes once it
# knows (it fails only where its own harness does: no reference run), so a
# refusal by CRIU's cuda plugin fails no phos case.
anchor_plugins() {
  [ -f "$PHOS_BUNDLE/criu/cuda_plugin.so" ] || skip "no cuda_plugin.so in the bundle"
  export PATH=$PHOS_BUILD/test/bench:$PATH CRIU_TIMEOUT=${CRIU_TIMEOUT:-120}
  rm -f "$PLUGIN_DIR"/*.so && ln -s "$PHOS_BUNDLE/criu/cuda_plugin.so" "$PLUGIN_DIR/"
}
# anchor_run N NAME... [-- CRIU_ARGS...]: with the workload past its first
# steps; compares run.NAME with ref.NAME once it reaches step N.
anchor_run() {
  local n=$1 names=() extra=() said t0 t1 at
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do names+=("$1"); shift; done
  [ "${1:-}" = -- ] && shift && extra=("$@")
  criu_err() { criu_errors "$1" | cut -c1-300; }
  at=$(state_counter)
  t0=$(now)
  if criu_dump --leave-running "${extra[@]}"; then
    t1=$(now); said="leave-running dump ok in $(dt "$t0" "$t1") s"
    wait_above "$WORK/state" $((at + 5)) 60 || pass "CRIU's cuda plugin: FAIL: $said, but the program did not run on (step $(state_counter))"
  else
    said="leave-running dump FAILED (rc $?): $(criu_err "$WORK/dump.log")"
    cp "$WORK/dump.log" "$WORK/dump-leave-running.log" 2>/dev/null || true
    wait_above "$WORK/state" $((at + 5)) 60 || pass "CRIU's cuda plugin: FAIL: $said; the program did not run on after it"
  fi
  rm -rf "${IMG:?}"/*
  [ -n "$(workload_pids)" ] || pass "CRIU's cuda plugin: FAIL: $said; the program ended (step $(state_counter)) before the stopped dump could be tried"
  t0=$(now)
  criu_dump "${extra[@]}" || pass "CRIU's cuda plugin: FAIL: $said; dump FAILED (rc $?): $(criu_err "$WORK/dump.log")"
  t1=$(now); DUMPED=$(state_counter)
  wait_pid_free
  local t2; t2=$(now)
  criu_restore "${extra[@]}" || pass "CRIU's cuda plugin: FAIL: $said; dumped at step $DUMPED in $(dt "$t0" "$t1") s; restore FAILED (rc $?): $(criu_err "$WORK/restore.log")"
  said="$said; dumped at step $DUMPED in $(dt "$t0" "$t1") s, restored in $(dt "$t2" "$(now)") s"
  wait_above "$WORK/state" $((n - 1)) 240 || pass "CRIU's cuda plugin: FAIL: $said, but the restored program stopped at step $(state_counter)"
  local f
  for f in "${names[@]}"; do
    wait_lines "$WORK/run.$f" "$(wc -l < "$WORK/ref.$f")" || true
    cmp -s "$WORK/ref.$f" "$WORK/run.$f" || pass "CRIU's cuda plugin: FAIL: $said, but $f differs from the uninterrupted run's from step $(first_diff "$WORK/run.$f" "$WORK/ref.$f") on"
  done
  pass "CRIU's cuda plugin: PASS: $said; ${names[*]} bitwise equal to an uninterrupted run's"
}

# A 2-process tensor-parallel MLP (tp_mlp.py): rank 0 spawns rank 1 with
# torch.multiprocessing, one GPU each; each holds half of every block
# (column- then row-parallel); the partial sums meet through NCCL
# all-reduce and, in turns, through slots each rank shares with the other
# as CUDA IPC handles, copied across the GPUs. --link-remap: the POSIX
# semaphore torch.multiprocessing unlinked (torch_ipc).
TP_STEPS=150
tp_setup() {  # tp_setup [native]: the reference run's curves, in ref.losses(.r1)
  need_2gpus
  python3 -c 'import torch' 2>/dev/null || skip "no torch"
  setup "$here/tp_mlp.py" "$(python3 -c 'import sys; print(sys.executable)')"
  export CUBLAS_WORKSPACE_CONFIG=:4096:8 CRIU_NET_ARGS="--link-remap"
  # rank 1 and the resource tracker are not workload_pids
  AT_EXIT='kill -9 ${TP_TREE:-} 2>/dev/null || true'
  local pre=(env LD_PRELOAD="$LIBPHOS")
  [ "${1:-}" = native ] && pre=(env)
  timeout 240 "${pre[@]}" python3 "$here/tp_mlp.py" "$WORK/ref.state" "$WORK/ref.losses" $TP_STEPS 0 \
    > "$WORK/reference.log" 2>&1 ||
    fail "the reference run failed (rc $?): $(tail -n 3 "$WORK"/ref.state.error.* 2>/dev/null | tr '\n' ' ')"
  [ "$(wc -l < "$WORK/ref.losses.r1")" = $TP_STEPS ] || fail "rank 1 of the reference run wrote $(wc -l < "$WORK/ref.losses.r1") steps"
}
tp_start() {  # tp_start [--preload]: the job, past step 30; TP_TREE: its processes
  start_workload "$@" "$WORK/run.losses" $TP_STEPS
  reach 30 180 "before the dumps"
  TP_TREE=$(tree_pids "$WORKLOAD_PID" | paste -sd' ')
}
# tp_image_said: what a dump of the job must show: a GPU image for each
# rank, the slots each rank maps from the other stored once (by their
# owners), each rank's NCCL communicator released. TP_SAID: its figures.
tp_image_said() {
  local images mapped
  # Images with device memory: the tree's other processes under libphos
  # (torch.multiprocessing's resource tracker) get an image of 0 allocations.
  images=$({ grep -o "wrote phos-[0-9]*-manifest.img ([1-9][0-9]* allocations" "$WORK/dump.log" || true; } | wc -l)
  [ "$images" = 2 ] || fail "$images GPU images with device memory, one per rank (2) expected: $(phos_wrote)"
  mapped=$({ grep -o "mapped at 0x[0-9a-f]* ([0-9.]* MiB) through CUDA IPC: stored once, in its owner's image" "$WORK/dump.log" || true; } | wc -l)
  [ "$mapped" -ge 2 ] || fail "$mapped IPC mappings stored once; each rank maps the other's slot (2 at least)"
  local released
  released=$({ grep -o '[0-9]* NCCL communicator(s) released in [0-9.]* ms' "$WORK/dump.log" || true; } | paste -sd, -)
  [ -n "$released" ] || fail "the dump log says no NCCL communicator was released"
  TP_SAID="$mapped IPC mappings stored once, $released, images $(phos_wrote)"
}
tp_curves() { same_as_ref losses losses.r1; }

case_tp_mlp_2proc() {
  tp_setup
  tp_start --preload
  local t0 t1 lr
  t0=$(now); criu_dump --leave-running || fail "leave-running dump failed: $(phos_error "$WORK/dump.log")"; t1=$(now)
  tp_image_said
  lr="leave-running dump $(dt "$t0" "$t1") s (stall $(dump_stalls) ms; $TP_SAID)"
  reach $(($(state_counter) + 10)) 120 "after the leave-running dump"
  rm -rf "${IMG:?}"/*
  dump_restore
  tp_image_said
  local again; again=$({ grep -o "mapped again at 0x[0-9a-f]* through CUDA IPC" "$WORK/restore.log" || true; } | wc -l)
  [ "$again" -ge 2 ] || fail "the restore mapped $again IPC mappings again (2 expected)"
  reach $((TP_STEPS - 1)) 180 "after the restore"
  [ "$(state_token)" = "$TOKEN" ] || fail "token changed"
  tp_curves
  pass "both ranks' curves of $TP_STEPS steps bitwise equal to an uninterrupted run's; $lr; dumped at step $DUMPED, dump $DUMP_S s, restore $RESTORE_S s ($TP_SAID; $again IPC mappings mapped again); $(driver_batches)"
}
# Left running with copy_on_write=always: both ranks get copy-on-write, the
# slots each shares through CUDA IPC copied while both are stopped (by
# their owners, checked against the freeze) and left out of the windows;
# the job runs on to the same curves, and its image restored (the pair
# killed first) carries on to the uninterrupted run's curves. The line
# gives each rank's protocol, its memory copied stopped, its window's saves
# and the stall.
case_tp_mlp_2proc_cow() {
  tp_setup
  tp_start --preload
  TOKEN=$(state_token)
  PHOS_COPY_ON_WRITE=always criu_dump --leave-running || fail "leave-running dump failed: $(phos_error "$WORK/dump.log")"
  tp_image_said
  ! grep -q "no copy-on-write" "$WORK/dump.log" ||
    fail "copy-on-write refused: $(grep -o 'no copy-on-write.*' "$WORK/dump.log" | head -n1)"
  local ranks stalls ghosts
  # Each rank's image with device memory: "pid protocol, S MiB shared copied stopped, W MiB saved, window T ms".
  ranks=$("$PHOSCTL" show --json "$IMG" | python3 -c '
import json, sys
out, bad = [], []
for i in json.load(sys.stdin)["images"]:
    if not i["allocations"]:
        continue  # torch.multiprocessing'"'"'s resource tracker
    s = i["statistics"]
    out.append("rank pid %d: %s, %.1f MiB shared through IPC copied stopped, %.1f MiB saved, window %.0f ms"
               % (i["pid"], i["protocol"], s.get("ipc_stopped_bytes", 0) / 2**20, s.get("cow_saved_bytes", 0) / 2**20,
                  s.get("cow_window_ns", 0) / 1e6))
    if i["protocol"] != "soft-copy-on-write" or not s.get("ipc_stopped_bytes"):
        bad.append(out[-1])
print("; ".join(out))
sys.exit(1 if bad or len(out) != 2 else 0)') ||
    fail "copy-on-write not used for both ranks, or no shared slot copied stopped: $ranks"
  stalls=$(dump_stalls)
  # torch.multiprocessing's semaphores (their /dev/shm path gone): ghosts in
  # a leave-running image (CRIU patch 0004), since a link remap is removed
  # as such a dump ends.
  ghosts=$({ grep -o "Dumping [^ ]*sem\.[^ ]* as a ghost file" "$WORK/dump.log" || true; } | wc -l)
  reach $((TP_STEPS - 1)) 180 "after the leave-running dump"
  tp_curves
  kill -9 $TP_TREE 2>/dev/null || true
  gone $TP_TREE
  criu_restore || fail "restore of the leave-running image failed: $(phos_error "$WORK/restore.log")"
  restored_pid >/dev/null || fail "no restored process"
  restored_tail_same losses $TP_STEPS
  restored_tail_same losses.r1 $TP_STEPS
  [ "$(state_token)" = "$TOKEN" ] || fail "the restored job's token is not the dumped job's"
  pass "copy-on-write for both ranks ($ranks), stall $stalls ms; both ranks' curves bitwise equal to an uninterrupted run's; their image restored (frozen at step $FROZEN) carried on to the same curves; $ghosts semaphore file(s) dumped as ghosts; $TP_SAID"
}
case_anchor_tp_mlp_2proc() {
  tp_setup native
  anchor_plugins
  tp_start
  anchor_run $TP_STEPS losses losses.r1 -- --tcp-established
}

# One Llama-shaped model (8 layers, random weights) over 2 GPUs in one
# process (llama_split.py): transformers' device_map="auto" with GPU 0
# capped at about half the model, so both GPUs hold decoder layers; greedy
# generate every step, tokens compared with an uninterrupted run's.
DM_STEPS=60
dm_setup() {  # dm_setup [native]: the reference run's tokens in ref.tokens; DM_SPLIT
  need_2gpus
  python3 -c 'import torch, transformers' 2>/dev/null || skip "no torch and transformers"
  setup "$here/llama_split.py" "$(python3 -c 'import sys; print(sys.executable)')"
  export CUBLAS_WORKSPACE_CONFIG=:4096:8
  local pre=(env LD_PRELOAD="$LIBPHOS")
  [ "${1:-}" = native ] && pre=(env)
  timeout 300 "${pre[@]}" python3 "$here/llama_split.py" "$WORK/ref.state" "$WORK/ref.tokens" $DM_STEPS 0 \
    > "$WORK/reference.log" 2>&1 || fail "the reference run failed (rc $?): $(tail -n 3 "$WORK/ref.state.error" 2>/dev/null | tr '\n' ' ')"
  DM_SPLIT="$(sed -n 's/^how //p' "$WORK/split"): layers on GPU 0: $(grep -c '\.layers\.[0-9]* 0$' "$WORK/split" || true), on GPU 1: $(grep -c '\.layers\.[0-9]* 1$' "$WORK/split" || true)"
}
dm_start() {  # dm_start [--preload]: the process, past step 5, on both GPUs
  start_workload "$@" "$WORK/run.tokens" $DM_STEPS
  reach 5 240 "before the dump"
  [ "$(gpus_of_pid "$WORKLOAD_PID" | wc -l)" = 2 ] || fail "the process is not on 2 GPUs: $(gpus_of_pid "$WORKLOAD_PID" | paste -sd' ')"
}

case_device_map_auto_2gpu() {
  dm_setup
  dm_start --preload
  local t0 t1 lr at
  at=$(state_counter)
  t0=$(now); criu_dump --leave-running || fail "leave-running dump failed: $(phos_error "$WORK/dump.log")"; t1=$(now)
  local devs; devs=$("$PHOSCTL" show "$IMG" 2>/dev/null | grep -c "^ *device [0-9]:" || true)
  [ "$devs" = 2 ] || fail "the leave-running image names $devs devices, expected 2"
  reach $(($(state_counter) + 5)) 120 "after the leave-running dump"
  lr="leave-running dump $(dt "$t0" "$t1") s, stall $(dump_stalls) ms ($(step_gaps "$WORK/run.tokens.times" "$at" $(($(state_counter) - 2))) as the program saw it), images $(phos_wrote)"
  rm -rf "${IMG:?}"/*
  dump_restore
  local pid; pid=$(restored_pid) || fail "no restored process"
  reach $((DUMPED + 2)) 120 "after the restore"
  [ "$(gpus_of_pid "$pid" | wc -l)" = 2 ] || fail "the restored process is not on 2 GPUs: $(gpus_of_pid "$pid" | paste -sd' ')"
  reach $((DM_STEPS - 1)) 240 "after the restore"
  [ "$(state_token)" = "$TOKEN" ] || fail "token changed"
  same_as_ref tokens
  pass "$DM_STEPS steps' tokens (greedy, 16 each) bitwise equal to an uninterrupted run's; split: $DM_SPLIT; $lr; dumped at step $DUMPED, dump $DUMP_S s, restore $RESTORE_S s, images $(phos_wrote)"
}
case_anchor_device_map_auto_2gpu() {
  dm_setup native
  anchor_plugins
  dm_start
  anchor_run $DM_STEPS tokens
}

# `phosctl migrate` of the process with a target per source GPU: the option
# comes with per-GPU migration (another branch); until phosctl's usage
# names one (--map, --device-map, --gpu-map), the case skips saying so.
# MAP: "0=0,1=1" (in place) or "0=1,1=0" (the GPUs swapped).
migrate_map_option() {
  local o usage; usage=$("$PHOS_BUILD/plugin/phosctl" 2>&1 || true)
  for o in --map --device-map --gpu-map; do
    grep -q -- "migrate .*$o\|^ *$o" <<<"$usage" && { echo "$o"; return 0; }
  done
  return 1
}
device_map_migrate_case() {
  local map=$1 opt
  need_2gpus
  opt=$(migrate_map_option) ||
    skip "phosctl migrate has no per-GPU device map option (--map, --device-map or --gpu-map in its usage): per-GPU migration not built"
  dm_setup
  dm_start --preload
  TOKEN=$(state_token)
  local before; before=$(state_counter)
  MIGRATED=$("$PHOSCTL" migrate "$WORKLOAD_PID" "$opt" "$map" --dir "$IMG" --lib "$PLUGIN_DIR" --criu "$CRIU" 2>&1) ||
    fail "phosctl migrate $opt $map failed: $MIGRATED; $(phos_error "$IMG/migrate-dump.log") $(phos_error "$IMG/migrate-restore.log")"
  cp "$IMG"/migrate-*.log "$IMG/phos-keeper.log" "$WORK/" 2>/dev/null || true
  cp "$IMG/migrate-dump.log" "$WORK/dump.log" 2>/dev/null || true
  ls "$IMG"/phos-*-data-*.img >/dev/null 2>&1 && fail "the migration wrote GPU data files"
  grep -q "restored with its kept memory; let go" "$WORK/phos-keeper.log" || fail "phos-keeper did not hand the memory over"
  local pid; pid=$(restored_pid) || fail "no migrated process"
  reach $((before + 3)) 120 "after the migration"
  [ "$(gpus_of_pid "$pid" | wc -l)" = 2 ] || fail "the migrated process is not on 2 GPUs: $(gpus_of_pid "$pid" | paste -sd' ')"
  reach $((DM_STEPS - 1)) 240 "after the migration"
  [ "$(state_token)" = "$TOKEN" ] || fail "token changed"
  same_as_ref tokens
  pass "tokens bitwise equal to an uninterrupted run's across phosctl migrate $opt $map (split: $DM_SPLIT); $(sed 's/^migrated //' <<<"$MIGRATED"); $(migration_said); $(step_gaps "$WORK/run.tokens.times" "$before" $((before + 10)))"
}
case_device_map_auto_migrate() { device_map_migrate_case 0=0,1=1; }
case_device_map_auto_migrate_swap() { device_map_migrate_case 0=1,1=0; }

# Peer access (peer_access.cu): a kernel on GPU 1 reads and writes GPU 0's
# memory, phos's (cudaMalloc, reached through cuCtxEnablePeerAccess) and
# the program's own VMM memory (cuMemSetAccess for GPU 1). Left running,
# then dumped and restored: the outputs bitwise equal to an uninterrupted
# run's, and what the driver says of peer access and of the mappings
# (state.props: cuCtxGetFlags, cuDeviceCanAccessPeer, peer access 1 -> 0
# enabled, cuMemGetAccess of each buffer for each GPU) the same after each
# as before.
PEER_STEPS=400
peer_setup() {  # peer_setup [native]
  need_2gpus
  setup "$bin/peer_access"
  local pre=(env LD_PRELOAD="$LIBPHOS") rc=0
  [ "${1:-}" = native ] && pre=(env)
  timeout 120 "${pre[@]}" "$bin/peer_access" "$WORK/ref.state" "$WORK/ref.out" $PEER_STEPS 0 > "$WORK/reference.log" 2>&1 || rc=$?
  [ $rc = 77 ] && skip "$(tail -n1 "$WORK/reference.log")"
  [ $rc = 0 ] || fail "the reference run failed (rc $rc): $(tail -n 3 "$WORK/reference.log" | tr '\n' ' ')"
}
# props_now FILE: the props of a step at least 2 past the current one.
props_now() {
  reach $(($(state_counter) + 2)) 60 "for the props"
  cp "$WORK/state.props" "$1"
}
props_same() {  # props_same FILE WHEN
  cmp -s "$WORK/before.props" "$1" || fail "$2, the driver says otherwise of peer access or the mappings: $(diff "$WORK/before.props" "$1" | grep '^[<>]' | head -n 6 | tr '\n' ' ')"
}
case_peer_access_2gpu() {
  peer_setup
  start_workload --preload "$WORK/run.out" $PEER_STEPS
  reach 50 60 "before the dumps"
  props_now "$WORK/before.props"
  grep -q "peer_access 1->0 already-enabled" "$WORK/before.props" || fail "peer access 1 -> 0 not enabled before the dump: $(tr '\n' ' ' < "$WORK/before.props")"
  local t0 t1 lr
  t0=$(now); criu_dump --leave-running || fail "leave-running dump failed: $(phos_error "$WORK/dump.log")"; t1=$(now)
  lr="leave-running dump $(dt "$t0" "$t1") s, stall $(dump_stalls) ms, images $(phos_wrote)"
  props_now "$WORK/leave-running.props"
  props_same "$WORK/leave-running.props" "after the leave-running dump"
  rm -rf "${IMG:?}"/*
  dump_restore
  props_now "$WORK/restored.props"
  props_same "$WORK/restored.props" "after the restore"
  reach $((PEER_STEPS - 1)) 120 "after the restore"
  [ "$(state_token)" = "$TOKEN" ] || fail "token changed"
  same_as_ref out
  pass "outputs of $PEER_STEPS steps (a kernel on GPU 1 writing GPU 0's memory, phos's and the program's own VMM) bitwise equal to an uninterrupted run's; peer access and every mapping's access the same after the leave-running dump and after the restore ($(grep -c . "$WORK/before.props") properties: $(grep -o 'access [AVB]@[^ ]* gpu[01] [0-9]*' "$WORK/before.props" | sed 's/@[^ ]*//' | paste -sd, -)); $lr; dumped at step $DUMPED, dump $DUMP_S s, restore $RESTORE_S s"
}
case_anchor_peer_access_2gpu() {
  peer_setup native
  anchor_plugins
  start_workload "$WORK/run.out" $PEER_STEPS
  reach 50 60 "before the dumps"
  anchor_run $PEER_STEPS out
}

# ---- driver ----------------------------------------------------------------

if [ "${1:-}" = --case ]; then
  CASE=$2
  "case_$CASE"
  exit 1  # a case ends in pass, skip or fail
fi

# Under a subreaper that reaps at once (subreaper.py says why).
[ -n "${PHOS_SUBREAPER:-}" ] || PHOS_SUBREAPER=1 exec python3 "$here/subreaper.py" bash "$0" "$@"
source "$here/run-on-host.sh"
bin=$PHOS_BUNDLE/gpu
mkdir -p "$log"
# Images of up to 32 GiB: memory-backed, fast, and large enough.
[ -d /dev/shm ] && [ -w /dev/shm ] && export TMPDIR=/dev/shm
export PHOS_CRIU_TIMEOUT=${PHOS_CRIU_TIMEOUT:-240}
limit_of() {  # seconds a case may take
  case $1 in
    pattern_32GiB | torch_mlp* | torch_ipc | lazy_torch_mlp | sdk_torch_step | torch_*dead_memory | torch_cow* | torch_many_allocations) echo 420 ;;
    migrate_torch* | migrate_llama* | migrate_multi_gpu* | llama_http | torchrun_ddp* | torch_import_dump) echo 300 ;;
    supervise_torch*) echo 590 ;;
    torchrun_2host* | torchrun_4rank_2host*) echo 420 ;;
    tp_mlp_2proc* | anchor_tp_mlp_2proc | device_map_auto* | anchor_device_map_auto_2gpu) echo 420 ;;
    peer_access_2gpu | anchor_peer_access_2gpu) echo 200 ;;
    pattern_8GiB | dump_criu_killed | cow_pattern_8GiB | sparse_8GiB | incremental_8GiB) echo 200 ;;
    cow_random | cow_planted | cow_planted_sass | recopy_random | recopy_random_unspeculated | recopy_planted | soak_torch | soak_pattern_32GiB) echo 590 ;;
    recopy_pattern_8GiB | lazy_pattern_8GiB | cow_cublas_workspace) echo 200 ;;
    *) echo 150 ;;
  esac
}
all="pattern_1GiB pattern_8GiB pattern_32GiB sparse_8GiB incremental_8GiB cublas cuda_graph torch_mlp torch_mlp_expandable two_processes
  dump_disk_full dump_disk_full_leave_running dump_fails_after_snapshot dump_driver_refuses dump_criu_killed restore_corrupt_chunk restore_missing_data_file
  restore_incomplete_image restore_other_gpu_model restore_too_little_memory not_preloaded
  restore_next_to_gpu_process multi_gpu_process multi_gpu_process_cow restore_other_gpu cuda_visible_devices
  cow_pattern_8GiB cow_random cow_planted cow_planted_sass cow_cublas_workspace torch_cow torch_cow_async recopy_pattern_8GiB recopy_random recopy_random_unspeculated recopy_planted lazy_pattern_8GiB lazy_torch_mlp lazy_read_honest lazy_read_planted lazy_restore_criu_killed lazy_two_processes sdk_torch_step torch_dead_memory torch_cow_dead_memory pre_dump_refused rpc_gpu dump_next_to_restore
  two_dumps_at_once restore_criu_killed restore_criu_killed_early torch_many_allocations torch_ipc gpu_ipc gpu_ipc_event soak_torch soak_pattern_32GiB
  migrate_torch migrate_torch_copy migrate_torch_ddp_one_rank migrate_fails_mid_copy migrate_spilled migrate_spilled_copy migrate_restore_killed migrate_llama migrate_llama_copy
  migrate_torch_2gpu migrate_llama_2gpu migrate_multi_gpu migrate_multi_gpu_nopeer llama_http torchrun_ddp_2gpu torchrun_ddp_2gpu_cow
  supervise_torch supervise_torch_2gpu torch_import_dump
  tcpstore_interop torchrun_2host torchrun_2host_leave_running torchrun_2host_host_fails torchrun_2host_c10d torchrun_4rank_2host torchrun_4rank_2host_leave_running
  tp_mlp_2proc tp_mlp_2proc_cow anchor_tp_mlp_2proc device_map_auto_2gpu anchor_device_map_auto_2gpu device_map_auto_migrate
  device_map_auto_migrate_swap peer_access_2gpu anchor_peer_access_2gpu"
passed=0 failed=0
for c in ${*:-$all}; do
  if ! declare -F "case_$c" >/dev/null; then
    echo "gpu-criu: $c: FAIL  no such case (cases: $(echo $all))"; failed=$((failed + 1)); continue
  fi
  out=$log/$c.log t0=$(now)
  timeout -k 15 "$(limit_of "$c")" bash "$here/criu_suite.sh" --case "$c" > "$out" 2>&1
  rc=$? secs=$(dt "$t0" "$(now)")
  case $rc in
    0) echo "gpu-criu: $c: PASS  $(sed -n 's/^RESULT PASS //p' "$out") [${secs} s]"; passed=$((passed + 1)) ;;
    77) echo "gpu-criu: $c: SKIP  $(sed -n 's/^RESULT SKIP //p; s/^\[.*\] SKIP: //p' "$out" | head -n1)" ;;
    124 | 137) echo "gpu-criu: $c: FAIL  timed out after $(limit_of "$c") s; last: $(grep -v '^RESULT' "$out" | tail -n1); log: $out"
      failed=$((failed + 1)) ;;
    *) echo "gpu-criu: $c: FAIL  $(grep -m1 -o '\] FAIL: .*' "$out" | cut -c9- || echo "rc $rc"); log: $out [${secs} s]"
      failed=$((failed + 1)) ;;
  esac
done
echo "gpu-criu: $passed passed, $failed failed"
