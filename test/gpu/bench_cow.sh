#!/usr/bin/env bash
# Copy-on-write against the stopped copy, side by side in one run, on a GPU
# host (after `source test/gpu/run-on-host.sh`); images on a tmpfs of huge
# pages (warmed first: the host's memory grows on first use).
#
#  1. Leave-running dumps of the pattern program (gpu_counter) holding SIZE
#     MiB, once per mode (off: copy_on_write=off, stopped while the engine
#     copies what the snapshot cannot hold; auto: copy-on-write where the
#     snapshot does not fit, the snapshot where it does, cow_trust=checksum,
#     the default, the copy starting once the process runs again; speculated:
#     the same with cow_trust=speculated (nothing checked); validated:
#     cow_trust=validated (no validator runs in the program: stopped);
#     pause: checksum, the copy starting during the stall, cow_start=pause):
#     the stall the program saw (its longest gap between two state writes),
#     criu's time until the image is complete, the stall's parts, the
#     freeze's fingerprint pass (T0), bytes saved copy-on-write, calls that
#     waited. The program must carry on intact after each.
#  2. The pool's size: cow_random (a program that writes at random all the
#     time) of POOL_MIB MiB dumped with copy_on_write=always, cow_trust=
#     checksum and pools of 0, 256, 1024 and 2048 MiB and auto (the
#     default: what the GPU has free at the stall less the program's reserve,
#     at most the program's memory; the copy after the stall,
#     cow_start=resume): its
#     operations per second from the dump's start to criu's exit, against
#     before; calls that waited; bytes saved.
#  3. With --train GIB: GPT-style training (torch_loop.py train) holding GIB
#     GiB of device memory, dumped with --leave-running while it trains,
#     copy-on-write (copy_on_write=auto, cow_trust=checksum) and the
#     stopped copy (copy_on_write=off) in turns: the iteration the dump
#     lands in (the dump starts as an iteration starts) against the
#     iterations before it, and CRIU's cuda plugin where the host's memory
#     holds it (CSV: FILE-train.csv). With --phos-step the training marks
#     each iteration's start with phos.step() (sdk/python): the dump lands
#     there and the caching allocator's free blocks are dead memory, not
#     stored nor protected (CSV: FILE-train-step.csv; the column dead_mib).
#     --train-args "ARGS": more arguments for torch_loop.py train (e.g.
#     --grads-to-none: the gradients let go as each iteration ends, free at
#     phos.step() too).
#  4. With --server SHAPE:GIB: llama_server.py of SHAPE (8b: Llama-3-8B,
#     15 GiB) with a KV-cache pool that brings its device memory to about
#     GIB GiB, all of it written (random values: nothing sparse), answering
#     a client (request_loop.py) that asks one-token requests back to back;
#     dumped with --leave-running once per mode (off, auto = cow_trust=
#     checksum, the default, and speculated): the stall its client saw
#     (the longest reply while the dump ran, less the median reply before
#     it), criu's time, the T0 fingerprint pass, and every reply's tokens
#     equal to the first's (CSV: FILE-server.csv).
#     BENCH_SERVER_KV_WRITTEN_MIB=M: only the pool's first M MiB written
#     (a server that just started: the rest all zero); BENCH_SERVER_MODES
#     may then name MODE_zerocopy: MODE with cow_zero=copy (chunks all zero
#     at the freeze copied like any other, as before cow_zero=settle);
#     MODE_nice0: MODE with behind_nice=0 (criu's threads keep their
#     priority once the server runs again). The excess column sums what
#     every reply while criu ran took over the median.
# One CSV row per dump (--csv); the tables go to stdout.
# Each size is dumped once first, unmeasured (a fresh host's first dumps are
# slower: its memory grows on first use), then the modes take turns, --reps
# times; the table gives each mode's median, and the stall's range.
# usage: bench_cow.sh [--sizes MIB,...] [--pools MIB,...] [--pool-mib MIB] [--reps N] [--train GIB] [--phos-step] [--train-args "ARGS"] [--server SHAPE:GIB] [--csv FILE]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
sizes=32768 pools=0,256,1024,2048,auto pool_mib=16384 reps=3 train= phos_step= train_args= server= csv=${OUT:-/tmp}/bench_cow.csv
while [ $# -gt 0 ]; do
  case $1 in
    --sizes) sizes=$2; shift 2 ;;
    --pools) pools=$2; shift 2 ;;
    --pool-mib) pool_mib=$2; shift 2 ;;
    --csv) csv=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --train) train=$2; shift 2 ;;
    --phos-step) phos_step=--phos-step; shift ;;
    --train-args) train_args=$2; shift 2 ;;
    --server) server=$2; shift 2 ;;
    *) echo "usage: bench_cow.sh [--sizes MIB,...] [--pools MIB,...] [--pool-mib MIB] [--reps N] [--train GIB] [--phos-step] [--train-args \"ARGS\"] [--server SHAPE:GIB] [--csv FILE]" >&2; exit 2 ;;
  esac
done
export PHOS_NO_PIDNS=1 PHOS_WORKLOAD=$PHOS_BUNDLE/gpu/gpu_counter
# Images on a tmpfs of huge pages (bench_lib.sh), warmed with the largest.
[ -z "$server" ] || [[ $server =~ ^(tiny|1b|8b|13b):[0-9]+$ ]] || { echo "bench_cow.sh: --server SHAPE:GIB (shape tiny, 1b, 8b or 13b)" >&2; exit 2; }
largest=$( (tr ',' '\n' <<<"$sizes"; [ -n "$train" ] && echo $((train * 1400 + 4096)); [ -n "$server" ] && echo $((${server#*:} * 1024 + 4096))) | sort -n | tail -n1)  # training holds ~1.3x its GIB (AdamW's temporaries)
source "$here/bench_lib.sh"
bench_tmpfs bench-cow $(((largest >> 10) + 8))
export PHOS_CRIU_TIMEOUT=300 CUBLAS_WORKSPACE_CONFIG=:4096:8
source "$here/../e2e/lib.sh"
TEST_NAME=bench_cow
# pool_sized: the copy-on-write pool criu's log sized (each GPU's), and
# whether the program asked for it back.
pool_sized() {
  { grep -o 'copy-on-write pool on GPU [0-9]*: .*' "$WORK/dump.log" | sed 's/^copy-on-write pool on //' || echo "no pool sized"; } | paste -sd';'
  grep -o 'copy-on-write pool given back ([0-9.]* MiB)' "$WORK/dump.log" | head -n1 || true
}
# longest_waits LOG: the calls that waited longest on copy-on-write in LOG.
longest_waits() { grep -o 'copy-on-write: \(the calls\? that waited\|no call waited\).*' "$1" | head -n1 || echo "none logged"; }
# num PATTERN [N]: the Nth number in the first match of PATTERN in criu's log (digits of the pattern's own words count: "T0: 80.0 GiB in 21.4 ms" has 0, 80.0, 21.4); empty if none.
num() { { grep -o "$1" "$WORK/dump.log" || true; } | head -n1 | { grep -o '[0-9.]*' || true; } | head -n"${2:-1}" | tail -n1; }


echo "kind,size_mib,mode,stall_ms,criu_s,image_gbps,saved_mib,calls_waited,wait_ms,ops_before,ops_window,quiesce_ms,driver_checkpoint_ms,criu_cpu_ms,give_back_ms,sum_pass_ms" > "$csv"
row() { echo "$*" >> "$csv"; }

# 1. The pattern program: stall and time until the image is complete.
for size in ${sizes//,/ }; do
  start_workload --preload "$size"
  wait_counter_above 5 60
  for mode in warmup $(for _ in $(seq "$reps"); do echo off auto speculated validated pause; done); do
    touch "$WORK/state.reset"; sleep 0.3
    rm -rf "$IMG" && mkdir -p "$IMG"
    t0=$(now)
    cow=$mode trust=checksum start=resume
    [ "$mode" = speculated ] && cow=auto trust=speculated
    [ "$mode" = validated ] && cow=auto trust=validated
    [ "$mode" = pause ] && cow=auto start=pause
    [ "$mode" = warmup ] && cow=auto
    PHOS_COW_START=$start PHOS_COPY_ON_WRITE=$cow PHOS_COW_TRUST=$trust criu_dump --leave-running ||
      fail "$size MiB, copy_on_write=$cow cow_trust=$trust: criu dump failed"
    t1=$(now)
    at=$(state_counter); wait_counter_above $((at + 10)) 30
    read -r _ _ _ errors _ gap < "$WORK/state"
    [ "$errors" = 0 ] || fail "$size MiB, copy_on_write=$mode: the program's memory is damaged ($errors errors)"
    criu_s=$(dt "$t0" "$t1")
    gbps=$(awk -v m="$size" -v s="$criu_s" 'BEGIN {printf "%.1f", m / 1024 * 1.073741824 / s}')
    saved=$(num '[0-9]* chunks ([0-9.]* MiB) saved' 2); waited=$(num '[0-9]* calls waited'); wait_ms=$(num 'unknown write set) [0-9.]* ms')
    [ "$mode" = warmup ] && continue
    row "pattern,$size,$mode,$gap,$criu_s,$gbps,${saved:-0},${waited:-0},${wait_ms:-0},,,$(num 'quiesce [0-9.]* ms'),$(num 'driver checkpoint [0-9.]* ms'),$(num "criu's CPU dump [0-9.]* ms"),$(num 'give-back ([^)]*) [0-9.]* ms'),$(num 'T0: [0-9.]* GiB in [0-9.]* ms' 3)"
    cp "$WORK/dump.log" "${OUT:-/tmp}/bench_cow.$size.$mode.log" 2>/dev/null || true
  done
  kill -9 "$WORKLOAD_PID"; wait_pid_free
done

# 2. The pool: a program that writes all the time, its throughput in the window.
COUNTER=$PHOS_BUNDLE/gpu/cow_random
MATCH="^$COUNTER $WORK/state"
ops() { cut -d' ' -f2 "$WORK/state" 2>/dev/null || echo 0; }
ops_above() { for _ in $(seq 1200); do [ "$(ops)" -gt "$1" ] && return 0; sleep 0.05; done; return 1; }
for pool in ${pools//,/ }; do
  rm -f "$WORK/state"
  start_workload --preload "$WORK/verify.log" --mib "$pool_mib" --seed 7
  ops_above 4096 || fail "cow_random does not run"
  o0=$(ops); s0=$(now); sleep 1; o1=$(ops); s1=$(now)
  before=$(awk -v a="$o0" -v b="$o1" -v t="$(dt "$s0" "$s1")" 'BEGIN {printf "%.0f", (b - a) / t}')
  rm -rf "$IMG" && mkdir -p "$IMG"
  o2=$(ops); t0=$(now)
  PHOS_COPY_ON_WRITE=always PHOS_COW_POOL_MIB=$pool PHOS_COW_TRUST=checksum \
    criu_dump --leave-running ||
    fail "pool $pool MiB: criu dump failed"
  t1=$(now); o3=$(ops)
  # Operations per second from the dump's start to criu's exit (the image
  # complete): the stall and the window together.
  during=$(awk -v a="$o2" -v b="$o3" -v t="$(dt "$t0" "$t1")" 'BEGIN {printf "%.0f", (b - a) / t}')
  saved=$(num '[0-9]* chunks ([0-9.]* MiB) saved' 2); waited=$(num '[0-9]* calls waited'); wait_ms=$(num 'unknown write set) [0-9.]* ms')
  row "pool,$pool_mib,$pool,$(num 'gate reopened after [0-9.]* ms'),$(dt "$t0" "$t1"),,${saved:-0},${waited:-0},${wait_ms:-0},$before,$during,,,,"
  cp "$WORK/dump.log" "${OUT:-/tmp}/bench_cow.pool$pool.log" 2>/dev/null || true
  say "pool $pool: $(pool_sized)"
  kill -9 "$WORKLOAD_PID"; wait_pid_free
done

# 3. GPT-style training: the iteration a leave-running dump lands in.
train_csv=${csv%.csv}-train${phos_step:+-step}$(tr -c 'a-z0-9\n' _ <<<"${train_args:+$train_args}" | tr -d '\n').csv
if [ -n "$train" ]; then
  echo "mode,stall_ms,criu_s,step_before_ms,step_hit_ms,saved_mib,calls_waited,wait_ms,dead_mib" > "$train_csv"
  python=$(python3 -c 'import sys; print(sys.executable)')
  COUNTER=$here/torch_loop.py RUNNER=$python
  MATCH="^$RUNNER $COUNTER $WORK/state"
  rm -f "$WORK/state" "$WORK/state.steps" "$WORK/state.error"
  # shellcheck disable=SC2086 # the extra arguments are words
  start_workload --preload train --gib "$train" $phos_step $train_args
  wait_counter_above 6 600 || fail "training does not run: $(tail -n 2 "$WORK/state.error" 2>/dev/null)"
  used_gib=$(( $(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0) / 1024 ))
  say "training: $used_gib GiB of device memory used"
  for mode in warmup $(for _ in $(seq "$reps"); do echo cow off; done); do
    rm -rf "$IMG" && mkdir -p "$IMG"
    # At the start of an iteration: as soon as the last one wrote its state.
    n0=$(state_counter); until [ "$(state_counter)" != "$n0" ]; do sleep 0.002; done
    n0=$(state_counter); t0=$(now)
    cow=auto; [ "$mode" = off ] && cow=off
    PHOS_COPY_ON_WRITE=$cow PHOS_COW_TRUST=checksum criu_dump --leave-running ||
      fail "training, copy_on_write=$cow: criu dump failed: $(grep -o 'phos: Error: .*' "$WORK/dump.log" | head -n1)"
    t1=$(now)
    cp "$WORK/dump.log" "${OUT:-/tmp}/bench_cow.train.$mode.log" 2>/dev/null || true
    if [ "$mode" = cow ]; then say "training, copy-on-write: pool $(pool_sized); $(longest_waits "$WORK/dump.log")"; fi
    wait_counter_above $((n0 + 4)) 300 || fail "training stopped after the dump"
    [ "$mode" = warmup ] && continue
    if [ -n "$phos_step" ]; then
      grep -q "gate closed at the program's iteration boundary" "$WORK/dump.log" || fail "training, $mode: the dump did not land on phos.step()"
      grep -q "whole chunks ([0-9.]* MiB) dead" "$WORK/dump.log" ||
        fail "training, $mode: no dead memory: $(grep -o "its allocator's free blocks not used.*" "$WORK/dump.log" | head -n1)"
    fi
    # The median of the 5 steps before the dump began, and the longest of
    # the 3 steps that ended after it began.
    read -r before hit < <(step_times "$t0" "$WORK/state.steps")
    saved=$(num '[0-9]* chunks ([0-9.]* MiB) saved' 2); waited=$(num '[0-9]* calls waited'); wait_ms=$(num 'unknown write set) [0-9.]* ms')
    dead=$(num 'whole chunks ([0-9.]* MiB) dead')
    echo "$mode,$(num 'gate reopened after [0-9.]* ms'),$(dt "$t0" "$t1"),$before,$hit,${saved:-0},${waited:-0},${wait_ms:-0},${dead:-0}" >> "$train_csv"
  done
  kill -9 "$WORKLOAD_PID"; wait_pid_free
  rm -rf "$IMG" && mkdir -p "$IMG"
  # CRIU's own cuda plugin, where this host's memory holds the device memory
  # moved into the process and the image beside it.
  avail=$(awk '/^MemAvailable:/ {print int($2 / 1048576)}' /proc/meminfo)
  cuda_plugin_note="CRIU's cuda plugin: not run: it needs about $((2 * used_gib + 8)) GiB of host memory ($used_gib GiB of device memory moved into the process, the image as much again on the tmpfs), $avail GiB available"
  [ -n "$phos_step" ] && cuda_plugin_note="CRIU's cuda plugin: not run with --phos-step (its row is the run without)"
  if [ -z "$phos_step" ] && [ "$avail" -ge $((2 * used_gib + 8)) ] && [ -f "$PHOS_BUNDLE/criu/cuda_plugin.so" ]; then
    export PATH=$PHOS_BUILD/test/bench:$PATH  # cuda-checkpoint
    rm -f "$WORK/state" "$WORK/state.steps"
    start_workload train --gib "$train"
    wait_counter_above 6 600 || fail "training (not preloaded) does not run"
    rm -f "$PLUGIN_DIR"/*.so && ln -s "$PHOS_BUNDLE/criu/cuda_plugin.so" "$PLUGIN_DIR/"
    n0=$(state_counter); until [ "$(state_counter)" != "$n0" ]; do sleep 0.002; done
    n0=$(state_counter); t0=$(now)
    if criu_dump --leave-running; then
      t1=$(now)
      cp "$WORK/dump.log" "${OUT:-/tmp}/bench_cow.train.cuda_plugin.log" 2>/dev/null || true
      if wait_counter_above $((n0 + 4)) 300; then
        read -r before hit < <(step_times "$t0" "$WORK/state.steps")
        echo "cuda_plugin,,$(dt "$t0" "$t1"),$before,$hit,,," >> "$train_csv"
        cuda_plugin_note=
      else
        cuda_plugin_note="CRIU's cuda plugin: the training did not carry on after its leave-running dump"
      fi
    else
      cp "$WORK/dump.log" "${OUT:-/tmp}/bench_cow.train.cuda_plugin.log" 2>/dev/null || true
      cuda_plugin_note="CRIU's cuda plugin: its leave-running dump failed: $(grep -m1 -E 'Error|error' "$WORK/dump.log" | cut -c1-200)"
    fi
    kill -9 "$WORKLOAD_PID"; wait_pid_free
  fi
fi

# 4. An inference server whose KV cache fills the GPU: the stall its client sees.
server_csv=${csv%.csv}-server.csv
if [ -n "$server" ]; then
  shape=${server%:*} server_gib=${server#*:}
  python=$(python3 -c 'import sys; print(sys.executable)')
  reqdir=$WORK/server && mkdir -p "$reqdir"
  declare -A weights_gib=([tiny]=0 [1b]=3 [8b]=16 [13b]=25)
  kv_gib=$((server_gib - ${weights_gib[$shape]}))
  [ "$kv_gib" -gt 0 ] || fail "--server $server: GIB must exceed the model's ${weights_gib[$shape]} GiB"
  (setsid env LD_PRELOAD="$LIBPHOS" "$python" "$here/llama_server.py" --reqdir "$reqdir" --shape "$shape" \
     --kv-cache-gib "$kv_gib" --kv-written-mib "${BENCH_SERVER_KV_WRITTEN_MIB:--1}" </dev/null >"$reqdir/server.out" 2>&1 &)
  for _ in $(seq 1200); do [ -s "$reqdir/ready" ] || [ -e "$reqdir/error" ] && break; sleep 0.1; done
  [ -s "$reqdir/ready" ] || fail "the server did not start: $(tail -n 3 "$reqdir/error" "$reqdir/server.out" 2>/dev/null | tr '\n' ' ')"
  WORKLOAD_PID=$(awk '$1 == "pid" {print $2}' "$reqdir/ready")
  used_gib=$(awk '$1 == "gpu_used_bytes" {printf "%.1f", $2 / 2^30}' "$reqdir/ready")
  say "server $shape: $used_gib GiB of device memory in use"
  ( "$python" "$here/request_loop.py" "$reqdir" "$reqdir/latency.log" </dev/null >"$reqdir/client.out" 2>&1 & )
  sleep 5
  echo "mode,stall_ms,reply_median_ms,reply_max_ms,criu_s,sum_pass_ms,saved_mib,calls_waited,quiesce_ms,driver_checkpoint_ms,criu_cpu_ms,give_back_ms,replies_wrong,image,criu_pages,excess_ms" > "$server_csv"
  # BENCH_SERVER_MODES: the modes' order (default "off auto speculated");
  # a mode is a base (off, auto, speculated) and any of these suffixes:
  # _nocopy: criu's copies of the pages before the resume turned off (CRIU
  # patch 0005: --leave-running-copy-limit 0), the pages written while the
  # server is stopped, as before it; _zerocopy: cow_zero=copy; _nice0:
  # behind_nice=0; _v3: criu at log level 3 (info, phos's lines; criu's
  # debug lines not written), not 4; _pipe4m: fs.pipe-max-size raised to 4
  # MiB for the dump (criu's page pipes grow to 3.2 MiB, not the default's
  # 1 MiB: a quarter of the parasite's rounds), set back after it.
  echo "leave-running-copy-limit 0" > "$WORK/nocopy.conf"
  pipe_max_was=$(cat /proc/sys/fs/pipe-max-size)
  for mode in warmup $(for _ in $(seq "$reps"); do echo ${BENCH_SERVER_MODES:-off auto speculated}; done); do
    rm -rf "$IMG" && mkdir -p "$IMG"
    sleep 2
    t0=$(date +%s.%N)
    cow=auto trust=checksum conf=/dev/null zero=settle nice=10 verbosity=4 base=${mode%%_*}
    [ "$base" = off ] && cow=off
    [ "$base" = speculated ] && trust=speculated
    [[ $mode == *_nocopy* ]] && conf=$WORK/nocopy.conf
    [[ $mode == *_zerocopy* ]] && zero=copy
    [[ $mode == *_nice0* ]] && nice=0
    [[ $mode == *_v3* ]] && verbosity=3
    if [[ $mode == *_pipe4m* ]]; then
      echo 4194304 > /proc/sys/fs/pipe-max-size || fail "server, $mode: fs.pipe-max-size cannot be set"
    fi
    # _pipe16m: page pipes of 16 MiB, with a criu built to grow them that
    # far (CRIU_PIPE16M; criu's own cap is 819 pages).
    criu_bin=$CRIU
    if [[ $mode == *_pipe16m* ]]; then
      echo 16777216 > /proc/sys/fs/pipe-max-size || fail "server, $mode: fs.pipe-max-size cannot be set"
      criu_bin=${CRIU_PIPE16M:?_pipe16m needs CRIU_PIPE16M}
    fi
    outcome=complete
    if ! CRIU=$criu_bin CRIU_VERBOSITY=$verbosity CRIU_CONFIG_FILE=$conf PHOS_COPY_ON_WRITE=$cow PHOS_COW_TRUST=$trust PHOS_COW_ZERO=$zero PHOS_BEHIND_NICE=$nice criu_dump --leave-running; then
      # Checksum validation refusing the image (a write speculation missed)
      # is the default's answer, not the bench's failure: the server runs on.
      grep -qE "(differs from its|differ from their) content at the freeze" "$WORK/dump.log" ||
        fail "server, copy_on_write=$cow cow_trust=$trust cow_zero=$zero: criu dump failed: $(grep -o 'phos: Error: .*' "$WORK/dump.log" | head -n1 | cut -c1-300)"
      outcome=refused
    fi
    [[ $mode == *_pipe4m* || $mode == *_pipe16m* ]] && echo "$pipe_max_was" > /proc/sys/fs/pipe-max-size
    t1=$(date +%s.%N)
    sleep 2
    cp "$WORK/dump.log" "${OUT:-/tmp}/bench_cow.server.$mode.log" 2>/dev/null || true
    [ "$mode" = warmup ] && continue
    if [ "$mode" != off ]; then say "server, $mode ($outcome): pool $(pool_sized); $(longest_waits "$WORK/dump.log")"; fi
    if [ "$outcome" = refused ]; then
      say "server, $mode: refused: $(grep -o 'launches that pointed into[^;]*\|no launch on a trusted[^;]*' "$WORK/dump.log" | head -n1)"
    fi
    # Replies before the dump: the median; sent or answered while it ran: the longest.
    median=$(awk -v a="$t0" '$2 < a - 0.05 {printf "%.1f\n", ($2 - $1) * 1000}' "$reqdir/latency.log" | sort -n |
      awk '{v[NR] = $1} END {print NR ? v[int((NR + 1) / 2)] : 0}')
    # excess: what every reply of the dump's time took over the median,
    # the longest's included (the copies behind the server slow it too).
    read -r longest wrong excess < <(awk -v a="$t0" -v b="$t1" -v med="$median" '
      $2 >= a && $1 <= b { l = ($2 - $1) * 1000; if (l > m) m = l; if (l > med) x += l - med }
      $3 == 0 { w++ }
      END { printf "%.1f %d %.0f\n", m, w, x }' "$reqdir/latency.log")
    [ "$wrong" = 0 ] || fail "server, $mode: $wrong replies' tokens differ from the first reply's"
    saved=$(num '[0-9]* chunks ([0-9.]* MiB) saved' 2); waited=$(num '[0-9]* calls waited')
    echo "$mode,$(awk -v m="$median" -v l="$longest" 'BEGIN {printf "%.0f", l - m}'),$median,$longest,$(dt "$t0" "$t1"),$(num 'T0: [0-9.]* GiB in [0-9.]* ms' 3),${saved:-0},${waited:-0},$(num 'quiesce [0-9.]* ms'),$(num 'driver checkpoint [0-9.]* ms'),$(num "criu's CPU dump [0-9.]* ms"),$(num 'give-back ([^)]*) [0-9.]* ms'),$wrong,$outcome,$(criu_pages "$WORK/dump.log"),$excess" >> "$server_csv"
  done
  touch "$reqdir/client.stop" "$reqdir/stop"; sleep 1
  cp "$reqdir/server.out" "${OUT:-/tmp}/bench_cow.server.out" 2>/dev/null || true  # libphos's own lines
  replies=$(wc -l < "$reqdir/latency.log")
  kill -9 "$WORKLOAD_PID" 2>/dev/null; wait_pid_free
fi

echo "## off, auto (cow_trust=checksum), speculated, validated and pause: leave-running dumps of the pattern program (images on a tmpfs of huge pages)"
echo "medians of $reps dumps each"
echo "| size | mode | stall (program; range) | criu until the image is complete | GB/s | saved copy-on-write | calls waited | driver checkpoint | criu's CPU dump | give-back | T0 fingerprint pass |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
# Medians per (size, mode), in the order first seen; the stall's range too.
awk -F, "$awk_median"'
  $1 == "pattern" {
    key = $2 "," $3
    gather(key, 4, 16)
    if (!(key in lo) || $4 + 0 < lo[key]) lo[key] = $4 + 0
    if (!(key in hi) || $4 + 0 > hi[key]) hi[key] = $4 + 0
  }
  END {
    for (i = 1; i <= k; i++) {
      split(order[i], f, ",")
      printf "| %d GiB | %s | %.0f ms (%.0f-%.0f) | %s s | %s | %s MiB | %s | %s ms | %s ms | %s ms | %s ms |\n", f[1] / 1024, f[2],
        median(order[i], 4), lo[order[i]], hi[order[i]], median(order[i], 5), median(order[i], 6), median(order[i], 7),
        median(order[i], 8), median(order[i], 13), median(order[i], 14), median(order[i], 15), median(order[i], 16)
    }
  }' "$csv"
echo
echo "## the pool's size: cow_random of $((pool_mib / 1024)) GiB, copy_on_write=always"
echo "| pool | stall | criu until the image is complete | saved copy-on-write | calls waited | their wait | ops/s before | ops/s during the dump |"
echo "|---|---|---|---|---|---|---|---|"
awk -F, '$1 == "pool" {printf "| %s | %s ms | %s s | %s MiB | %s | %s ms | %s | %s |\n", $3 == "auto" ? "auto" : $3 " MiB", $4, $5, $7, $8, $9, $10, $11}' "$csv"
grep -q '^pool,' "$csv" && python3 "$here/plot_cow.py" "$csv" "${csv%.csv}-pool.svg" && echo "plot: ${csv%.csv}-pool.svg"
if [ -n "$train" ]; then
  echo
  echo "## GPT-style training (AdamW) sized $train GiB ($used_gib GiB of device memory in use), dumped with --leave-running while it trains${phos_step:+, phos.step() as each iteration starts (its free blocks dead)}${train_args:+, torch_loop.py $train_args}"
  echo "| path | stall | criu until the image is complete | step before (median of 5) | the step the dump landed in | saved copy-on-write | calls waited | their wait | dead, not stored |"
  echo "|---|---|---|---|---|---|---|---|---|"
  awk -F, 'NR > 1 {printf "| %s | %s ms | %s s | %s ms | %s ms (+%d ms) | %s MiB | %s | %s ms | %s MiB |\n", $1 == "cow" ? "phos copy-on-write" : $1 == "off" ? "phos stopped copy (copy_on_write=off)" : "CRIU cuda plugin", $2, $3, $4, $5, $5 - $4, $6, $7, $8, $9}' "$train_csv"
  [ -z "$cuda_plugin_note" ] || echo "$cuda_plugin_note"
fi
if [ -n "$server" ]; then
  echo
  echo "## $shape server, its KV cache bringing the GPU to $used_gib GiB ($( [ "${BENCH_SERVER_KV_WRITTEN_MIB:--1}" = -1 ] && echo "all written" || echo "its first ${BENCH_SERVER_KV_WRITTEN_MIB} MiB written, the rest zero")), answering one-token requests back to back, dumped with --leave-running"
  echo "$replies replies, every one's tokens equal to the first's; stall = the longest reply while the dump ran, less the median reply before it"
  echo "excess = what all replies while criu ran took over the median reply, the longest one's included"
  echo "| mode | stall (client) | excess | reply median | longest reply | criu until the image is complete | T0 fingerprint pass | saved copy-on-write | calls waited | quiesce | driver checkpoint | criu's CPU dump | give-back | image | criu's pages |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
  awk -F, 'function label(m,  l) {
      l = m; sub(/_.*$/, "", l)
      l = l == "auto" ? "auto, cow_trust=checksum (default)" : l == "off" ? "off (stopped copy)" : "auto, cow_trust=" l
      return l (m ~ /_nocopy/ ? ", criu copies off" : "") (m ~ /_zerocopy/ ? ", cow_zero=copy" : "") (m ~ /_nice0/ ? ", behind_nice=0" : "") \
        (m ~ /_v3/ ? ", criu -v3" : "") (m ~ /_pipe4m/ ? ", pipes 4 MiB" : "") (m ~ /_pipe16m/ ? ", pipes 16 MiB" : "")
    }
    NR > 1 {printf "| %s | %s ms | %s ms | %s ms | %s ms | %s s | %s ms | %s MiB | %s | %s ms | %s ms | %s ms | %s ms | %s | %s |\n", label($1), $2, $NF, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $14, $15}' "$server_csv"
fi
exit 0
