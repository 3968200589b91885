#!/usr/bin/env bash
# Cold start of an inference server: restore until the program answers
# (issue 14), on a GPU host (after `source test/gpu/run-on-host.sh`), the
# images on a tmpfs of huge pages of its own (bench_lib.sh's bench_tmpfs).
#
# The program: test/gpu/llama_server.py, transformers' LlamaForCausalLM of a
# Llama shape with seeded random bf16 weights on cuda:0, answering requests
# through files (REQDIR/request -> REQDIR/reply, polled every 1 ms), each a
# greedy generate of --new-tokens tokens from a prompt drawn from the
# request's seed. Every case asks the same request.
#
# Per shape (--shapes) and path (--paths), --reps times (the paths take
# turns within a rep, native first):
#   native        the server started with the request already waiting:
#                 first reply = the reply's time stamp - the time just before
#                 the start (imports, CUDA, the model built and initialized
#                 on the GPU, a 4-token warm-up, the request's generate; the
#                 weights are drawn on the GPU: a real server also reads its
#                 weights from storage, so its start is longer)
#   cuda_plugin   criu 4.1.1 with CRIU's own cuda plugin (cuda-checkpoint from
#                 $PHOS_BUILD/test/bench; its plugin directory holds only
#                 cuda_plugin.so; the server without libphos.so)
#   phos_eager    criu 4.1.1 with the phos plugin, default settings (the
#                 server under LD_PRELOAD=libphos.so, criu never)
#   phos_eager_serial  phos_eager with PHOS_RESTORE_OVERLAP=off: the
#                 restore's order before issue 30 (the GPU memory created
#                 inside the plugin's init, the driver restore after the
#                 fill), to compare with phos_eager in one run
#   phos_eager_shrink  phos_eager with the server under
#                 PHOS_SHRINK_DRIVER_STATE=1: its contexts' limits lowered
#                 for the driver's checkpoint (less device state in criu's
#                 CPU pages), set back before its gate opens (the default
#                 since 2026-11-27: the same as phos_eager)
#   phos_eager_noshrink  phos_eager with PHOS_SHRINK_DRIVER_STATE=0 (the
#                 limits left as they are: the default before)
#   phos_eager_modeager  phos_eager with the server under
#                 CUDA_MODULE_LOADING=EAGER: every module's kernels loaded at
#                 its start, so none is loaded at its first launch after the
#                 restore (is a first generate's extra time lazy loading?)
#   phos_lazy     the same, PHOS_LAZY_RESTORE=on in criu's environment
#   phos_lazy_pages  phos_lazy, and criu restore --lazy-pages with a
#                 `criu lazy-pages -D DIR` daemon started before (its start
#                 not counted): criu's own pages come in on demand too
#   phos_eager_criu_dev  phos_eager with $CRIU_DEV (CRIU's development
#                 branch; run-on-host.sh sets it where the bundle carries
#                 one) dumping and restoring; SKIP without it
# A checkpoint path: start the server, wait for REQDIR/ready (after its
# warm-up), `criu dump` (no --leave-running: criu ends it) into an image
# directory on the tmpfs, wait until its pid is free (no pid namespace:
# PHOS_NO_PIDNS as in the GPU suite, the restored pid is the dumped one),
# write the request, then t0 and `criu restore -d` (detached):
#   first reply   reply time stamp - t0
#   criu returns  when criu restore -d exited - t0
#   seen          when the restored program saw the request - t0 (it runs)
#   GPU data in   from criu's restore log: the plugin's init + the time at
#                 which all GPU data was in (lazy: "all GPU data in at G ms",
#                 eager: "filled B"; older plugins: the line "restored to
#                 device memory"); cuda_plugin: the end of its driver restore
#   criu CPU restore  criu's start to its RESUME_DEVICES_LATE hook (criu's
#                 "plugin: ... hook 9" line; else plugin init + "resume hook")
#   driver restore  the plugin's "driver restore D ms" (else the time between
#                 its "driver restore" and "driver restored and unlocked"
#                 lines; cuda_plugin: from "resuming devices" to its next line)
#   tokens        the reply's tokens against the native run's of the same
#                 shape and request: OK, DIFF (REF: no native run to compare
#                 with: this reply becomes the reference); the same for the
#                 warm-up's tokens, made before the checkpoint ("DIFF (warm-up
#                 too)": the environment differs, libphos.so or the GPU, not
#                 the restore)
#   image         du of criu's own files and of phos-*.img (GiB), and
#                 phosctl show's "size: ... logical, ... stored" line
#   dump          criu dump's wall time
#   driver state  from the dump's log: the driver's checkpoint (ms) and the
#                 resident memory it added to the process (MiB)
#   second reply  right after the first reply the same request again: its
#                 time from being written to its reply, its generate, and
#                 its tokens against the first reply's (what a first
#                 generate costs beyond a warm one)
#   slow calls    (phos paths, --trace-slow-ms N, default 5) the server runs
#                 with PHOS_TRACE_SLOW_CALLS_MS=N: from the gate's opening
#                 after the restore, libphos logs each CUDA call of N ms or
#                 more and each gap of N ms or more between calls (the
#                 program's own time: Python, the CPU); those within the
#                 first reply (restore start to reply) are summed and the
#                 slowest printed, the gap before the first call too
# Times from criu's log count from criu's own log start, a few ms after t0.
# The plugin's breakdown line, parsed leniently ("-" where absent):
#   phos: process P: restore breakdown (ms after the plugin's init): GPU
#   memory created A, filled B (X MiB at Y GB/s), resume hook C, waited for
#   the fill until W, driver restore D ms, remap E ms, gate open F
#   phos: process P: all GPU data in at G ms after the plugin's init
#   phos: process P: on-demand restore: N calls checked, M waited (...), T ms
#   waited in all
# With lazy restore the plugin finishes the fill at criu's exit, so criu
# returns only once all GPU data is in: the first reply may come before.
# One CSV row per (shape, path, rep); at the end a table of medians.
#
# usage: bench_coldstart.sh [--shapes 1b,8b,13b] [--paths native,cuda_plugin,...]
#          [--reps N] [--kv-cache-frac F] [--csv FILE] [--logs DIR] [--budget S]
#          [--new-tokens N] [--prompt-len L] [--resume] [--kill-stale] [--protocol-only]
#          [--trace-slow-ms N]
#   --shapes    tiny, 1b, 8b, 13b (default 1b,8b; llama_server.py has them)
#   --paths     default native,cuda_plugin,phos_eager,phos_lazy,phos_lazy_pages,phos_eager_criu_dev
#   --reps      repetitions of each case (default 1); the table takes medians
#   --kv-cache-frac  the server preallocates a zeroed KV-cache pool of F x
#               its free GPU memory, writing only its first 256 MiB (sparse
#               images; default 0: none)
#   --csv       results (default $PHOS_BENCH_RESULTS/coldstart.csv, outside
#               the bundle; started afresh unless --resume)
#   --logs      every case's logs (criu's, the server's, its reply):
#               default /tmp/phos-coldstart-RUN; with $OUT set, gzipped into
#               $OUT/bench_coldstart-logs.tar.gz after every case
#   --budget    a case whose estimate does not fit in what is left of this
#               many seconds is DEFERRED (default 540: one 10-minute call);
#               the same command with --resume runs them
#   --resume    append to the CSV; skip cases it already has (ok or failed)
#   (PHOS_PLUGIN_SO=PATH in the environment: the phos paths use that plugin,
#   an earlier build's, say, to compare two builds on one host)
#   --kill-stale  kill servers an earlier run left behind (by pid, after
#               naming them); without it they are only named
#   --new-tokens, --prompt-len  the request's generate (default 16, 32)
#   --warmup-tokens  the server's warm-up generate before any checkpoint
#               (default 4; --new-tokens makes the dumped server one that
#               has answered a request of the request's shape, as a server
#               in service has: its first reply after the restore is then
#               not also its first generate of that shape)
#   --trace-slow-ms  the slow-call trace's threshold in ms (0: off)
#   --protocol-only  the server without torch (tokens: a hash of the
#               prompt): the plumbing, on a host without a GPU
# PHOS_BENCH_SHM names an image directory instead of the tmpfs at
# /mnt/phos-coldstart; PHOS_BENCH_RESULTS the CSV's directory (default
# /var/tmp/phos-bench-results); PHOS_PYTHON the interpreter (default python3's).
# With $OUT set, the CSV, the table and the logs' tarball go there after
# every case, so a call cut off at its limit still returns them.
#
# Run time, roughly (H100/H200): the server starts in ~10 s (1b), ~20-30 s
# (8b), ~30-40 s (13b); phos dumps and restores at ~20-40 GB/s; the cuda plugin
# takes ~1.9 s per GiB (dump and restore). 1b all paths ~2 min, 8b ~4-5 min,
# 13b ~6 min: --shapes 1b,8b in one call, --shapes 13b in another.
set -uo pipefail
export LC_ALL=C   # a '.' in EPOCHREALTIME and printf
here=$(cd "$(dirname "$0")" && pwd)
source "$here/bench_lib.sh"
unset LD_PRELOAD   # never criu under libphos.so: only the server gets it

SHAPES=1b,8b PATHS=native,cuda_plugin,phos_eager,phos_lazy,phos_lazy_pages,phos_eager_criu_dev REPS=1 KV_FRAC=0
RESULTS=${PHOS_BENCH_RESULTS:-/var/tmp/phos-bench-results}
CSV='' LOGDIR='' BUDGET=540 NEW_TOKENS=16 PROMPT_LEN=32 WARMUP_TOKENS=4 RESUME='' KILL_STALE='' PROTOCOL_ONLY='' TRACE_MS=5
SEED=1234 REQ_SEED=4242   # the weights' seed; the request's prompt seed
die() { echo "bench_coldstart: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --shapes) SHAPES=${2:?}; shift 2 ;;
    --paths) PATHS=${2:?}; shift 2 ;;
    --reps) REPS=${2:?}; shift 2 ;;
    --kv-cache-frac) KV_FRAC=${2:?}; shift 2 ;;
    --csv) CSV=${2:?}; shift 2 ;;
    --logs) LOGDIR=${2:?}; shift 2 ;;
    --budget) BUDGET=${2:?}; shift 2 ;;
    --new-tokens) NEW_TOKENS=${2:?}; shift 2 ;;
    --prompt-len) PROMPT_LEN=${2:?}; shift 2 ;;
    --warmup-tokens) WARMUP_TOKENS=${2:?}; shift 2 ;;
    --resume) RESUME=1; shift ;;
    --kill-stale) KILL_STALE=1; shift ;;
    --protocol-only) PROTOCOL_ONLY=1; shift ;;
    --trace-slow-ms) TRACE_MS=${2:?}; shift 2 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument $1 (--help)" ;;
  esac
done
IFS=, read -r -a SHAPES <<<"$SHAPES"
IFS=, read -r -a PATHS <<<"$PATHS"
for s in "${SHAPES[@]}"; do [[ $s =~ ^(tiny|1b|8b|13b)$ ]] || die "--shapes: $s is not tiny, 1b, 8b or 13b"; done
for p in "${PATHS[@]}"; do
  [[ $p =~ ^(native|cuda_plugin|phos_eager|phos_eager_serial|phos_eager_shrink|phos_eager_noshrink|phos_eager_modeager|phos_lazy|phos_lazy_pages|phos_eager_criu_dev)$ ]] || die "--paths: unknown path $p"
done
[[ $REPS =~ ^[1-9][0-9]*$ ]] || die "--reps: $REPS is not a count"
[[ $KV_FRAC =~ ^0*(\.[0-9]+)?$|^0\.[0-9]+$ ]] || die "--kv-cache-frac: $KV_FRAC is not in [0, 1)"
[[ $BUDGET =~ ^[0-9]+$ ]] || die "--budget: $BUDGET is not a number of seconds"
[[ $NEW_TOKENS =~ ^[1-9][0-9]*$ ]] || die "--new-tokens: $NEW_TOKENS is not a count"
[[ $PROMPT_LEN =~ ^[1-9][0-9]*$ ]] || die "--prompt-len: $PROMPT_LEN is not a count"
[[ $TRACE_MS =~ ^[0-9]+(\.[0-9]+)?$ ]] || die "--trace-slow-ms: $TRACE_MS is not a number of ms"
# native first in each rep: the reference tokens, and a measured start time.
ordered=()
for p in "${PATHS[@]}"; do [ "$p" = native ] && ordered=(native); done
for p in "${PATHS[@]}"; do [ "$p" = native ] || ordered+=("$p"); done
PATHS=("${ordered[@]}")

: "${PHOS_BUILD:?run 'source test/gpu/run-on-host.sh' first}" "${CRIU:?}" "${PHOS_BUNDLE:?}"
export PATH=$PHOS_BUILD/test/bench:$PATH   # cuda-checkpoint, for CRIU's cuda plugin
CRIU_DEV=${CRIU_DEV:-}
LIBPHOS=$PHOS_BUILD/cuda_hooks/libphos.so
# PHOS_PLUGIN_SO: another build's plugin (an earlier one, to compare in one run).
PHOS_PLUGIN_SO=${PHOS_PLUGIN_SO:-$PHOS_BUILD/plugin/phos_plugin.so}
PHOSCTL=$PHOS_BUILD/plugin/phosctl
CUDA_PLUGIN_SO=$PHOS_BUNDLE/criu/cuda_plugin.so
SERVER=$here/llama_server.py
PYTHON=${PHOS_PYTHON:-$(python3 -c 'import sys; print(sys.executable)')}
RUN_ID=$(date -u +%Y%m%dT%H%M%SZ)
CSV=${CSV:-$RESULTS/coldstart.csv}
LOGDIR=${LOGDIR:-/tmp/phos-coldstart-$RUN_ID}
REQUEST="seed=$REQ_SEED prompt_len=$PROMPT_LEN new_tokens=$NEW_TOKENS"
GIB=1073741824
START=$EPOCHSECONDS

# ---------------------------------------------------------------- helpers
now() { echo "$EPOCHREALTIME"; }
dt() { if [ -z "$1" ] || [ -z "$2" ]; then echo -; else awk -v a="$1" -v b="$2" 'BEGIN {printf "%.3f", b - a}'; fi; }
say() { printf '%s +%4ss %s\n' "$(date +%H:%M:%S)" $((EPOCHSECONDS - START)) "$*"; }
mem_available_gib() { awk '/^MemAvailable:/ {printf "%.1f", $2 / 1048576}' /proc/meminfo; }
avail_gib() { df -P -B1 "$1" 2>/dev/null | awk 'NR == 2 {printf "%.1f", $4 / 2^30}'; }
csv_quote() { local s=${1//\"/\"\"}; printf '"%s"' "${s//$'\n'/ }"; }
# gib BYTES
gib() { awk -v b="$1" -v g=$GIB 'BEGIN {printf "%.2f", b / g}'; }
# lt A B: A < B, numerically
lt() { awk -v a="$1" -v b="$2" 'BEGIN {exit !(a + 0 < b + 0)}'; }
# kv FILE KEY: the value of a "KEY VALUE..." line (the server's ready and reply files)
kv() { awk -v k="$2" '$1 == k {sub(/^[^ ]+ ?/, ""); print; exit}' "$1" 2>/dev/null; }

# The process PID is ours: its command line has PATTERN.
owned() { tr '\0' ' ' <"/proc/$1/cmdline" 2>/dev/null | grep -qF -- "$2"; }
# wait_gone PID SECONDS
wait_gone() {
  local i
  for ((i = 0; i < $2 * 20; i++)); do proc_alive "$1" || return 0; sleep 0.05; done
  return 1
}
# wait_pid_free PID SECONDS: no process, not even a zombie, holds PID.
wait_pid_free() {
  local i
  for ((i = 0; i < $2 * 100; i++)); do [ -e "/proc/$1" ] || return 0; sleep 0.01; done
  return 1
}
# end_pid PID PATTERN: kill -9 PID if it is still ours, and wait until it is gone.
end_pid() {
  [ -n "$1" ] || return 0
  if proc_alive "$1" && owned "$1" "$2"; then
    kill -9 "$1" 2>/dev/null
    wait_gone "$1" 15 || say "warning: pid $1 still there 15 s after kill -9"
  fi
  return 0
}

# Rough sizes (GiB) and times (s) for the budget and the memory checks:
# bf16 weights + ~0.6 GiB (CUDA context, cuBLAS workspace, the allocator).
weights_gib() { case $1 in tiny) echo 0.1 ;; 1b) echo 2.3 ;; 8b) echo 15.0 ;; 13b) echo 24.3 ;; esac; }
start_est_s() { case $1 in tiny) echo 8 ;; 1b) echo 15 ;; 8b) echo 28 ;; 13b) echo 38 ;; esac; }
GPU_TOTAL_GIB=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 2>/dev/null |
                awk 'NR == 1 && $1 + 0 > 0 {printf "%.1f", $1 / 1024}')
GPU_TOTAL_GIB=${GPU_TOTAL_GIB:-80}
# GPU memory the server holds: weights, context, KV-cache pool.
gpu_est_gib() {
  awk -v w="$(weights_gib "$1")" -v f="$KV_FRAC" -v t="$GPU_TOTAL_GIB" -v p="$PROTOCOL_ONLY" \
    'BEGIN {if (p) {print 0; exit}; g = w + 0.6; printf "%.1f", g + f * (t - g)}'
}
declare -A took   # seconds a (shape, path) took last
estimate_s() {  # estimate_s SHAPE PATH
  local g s; g=$(gpu_est_gib "$1"); s=$(start_est_s "$1")
  awk -v g="$g" -v s="$s" -v path="$2" -v last="${took[$1:$2]:-0}" -v native="${took[$1:native]:-0}" 'BEGIN {
    if (native > s) s = native
    e = s + 3
    if (path == "cuda_plugin") e += 10 + 1.9 * g
    else if (path != "native") e += 8 + 0.15 * g
    if (last > e) e = last
    printf "%d", e + 0.5 }'
}

# ------------------------------------------------------------- the CSV
COLS=run,shape,path,rep,status,first_reply_s,criu_s,seen_s,gen_ms,gpu_in_s,init_s,cpu_restore_s,driver_start_s,created_ms,filled_ms,fill_mib,fill_gbps,resume_ms,fill_wait_ms,driver_ms,remap_ms,gate_ms,all_in_ms,lazy_calls_waited,lazy_wait_ms,lazy_pages_done_s,tokens_check,warmup_check,second_s,second_gen_ms,second_check,faults_first,faults_second,first_call_gap_ms,slow_calls,slow_calls_ms,slow_gaps,slow_gaps_ms,image_criu_gib,image_phos_gib,image_phos_apparent_gib,phos_size,dump_s,driver_ckpt_ms,driver_state_mib,gpu_used_gib,rss_gib,srv_imported_s,srv_model_s,srv_ready_s,request,tokens,warmup_tokens,note
IFS=, read -r -a COL_NAMES <<<"$COLS"
csv_init() {
  mkdir -p "$(dirname "$CSV")" || die "cannot create the directory of $CSV"
  if [ -z "$RESUME" ] && [ -s "$CSV" ]; then mv -f "$CSV" "$CSV.prev"; echo "bench_coldstart: the earlier $CSV is now $CSV.prev"; fi
  if [ -s "$CSV" ] && [ "$(head -n1 "$CSV")" != "$COLS" ]; then die "$CSV has other columns (an older version's?): move it away"; fi
  [ -s "$CSV" ] || echo "$COLS" > "$CSV"
}
declare -A R   # the current case's row, by column name
row_reset() { local c; for c in "${COL_NAMES[@]}"; do R[$c]=-; done; R[note]=''; }
row_write() {
  local c line=''
  R[run]=$RUN_ID
  for c in "${COL_NAMES[@]}"; do
    if [ "$c" = note ]; then line+=$(csv_quote "${R[$c]}")
    else line+="${R[$c]//,/;},"; fi
  done
  echo "$line" >> "$CSV"
}
# has_result SHAPE PATH REP: the CSV holds that case, ok or failed.
has_result() {
  awk -F, -v s="$1" -v p="$2" -v r="$3" 'NR > 1 && $2 == s && $3 == p && $4 == r && ($5 == "ok" || $5 == "failed") {f = 1}
    END {exit !f}' "$CSV"
}
# ref_tokens SHAPE [COLUMN]: the tokens (or COLUMN) of a successful native
# run of SHAPE for this request, if any.
ref_tokens() {
  awk -F, -v s="$1" -v q="$REQUEST" -v col="${2:-tokens}" 'NR == 1 {for (i = 1; i <= NF; i++) c[$i] = i; next}
    $(c["shape"]) == s && $(c["path"]) == "native" && $(c["status"]) == "ok" && $(c["request"]) == q {t = $(c[col])}
    END {print t}' "$CSV"
}

# Everything so far, into $OUT (a call cut off still returns it); the logs
# in one tarball under 16 MiB (what a device call brings back of one file):
# without criu's full logs where they do not fit (their phos, cuda_plugin
# and hook lines stay, in *-lines.txt).
publish() {
  [ -n "${OUT:-}" ] || return 0
  cp "$CSV" "$OUT/bench_coldstart.csv" 2>/dev/null
  [ -d "$LOGDIR" ] || return 0
  local tarball=$OUT/bench_coldstart-logs.tar.gz ex
  for ex in '' '--exclude=dump.log.gz' '--exclude=*.log.gz'; do
    tar -czf "$tarball" ${ex:+"$ex"} -C "$(dirname "$LOGDIR")" "$(basename "$LOGDIR")" 2>/dev/null
    [ "$(stat -c %s "$tarball" 2>/dev/null || echo 0)" -lt $((15 << 20)) ] && break
  done
  return 0
}

# ------------------------------------------------------------ the server
SERVER_PID='' LAZY_PID='' IMG='' W='' REQ=''
SERVER_ENV=()   # a path's own variables for the server (phos_eager_shrink)
# start_server SHAPE PRELOAD(0|1) [ARGS...]: in $REQ, in a session of its
# own, stdio to files; SERVER_PID.
start_server() {
  local shape=$1 preload=$2; shift 2
  local envs=(HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 CUBLAS_WORKSPACE_CONFIG=:4096:8 TOKENIZERS_PARALLELISM=false)
  [ "$preload" = 1 ] && envs+=("LD_PRELOAD=$LIBPHOS")
  envs+=("${SERVER_ENV[@]}")
  # Armed only when the gate opens after a checkpoint: the start is untouched.
  [ "$preload" = 1 ] && [ "$TRACE_MS" != 0 ] && envs+=("PHOS_TRACE_SLOW_CALLS_MS=$TRACE_MS")
  local args=(--reqdir "$REQ" --shape "$shape" --seed "$SEED" --kv-cache-frac "$KV_FRAC" --warmup-prompt-len "$PROMPT_LEN" --warmup-tokens "$WARMUP_TOKENS")
  [ -n "$PROTOCOL_ONLY" ] && args+=(--protocol-only)
  rm -f "$REQ/pid"
  # bash writes its pid, then execs env, which execs python: one pid. Its
  # parent is a shell of its own, detached from ours, that waits for it:
  # the pid is free as soon as criu's dump ends it (a restore needs it), even
  # where a subreaper that does not reap would adopt an orphan.
  # shellcheck disable=SC2016  # expanded by the inner bash
  ( (setsid bash -c 'cd "$0" || exit 1; echo $$ > pid; exec env "$@" </dev/null >>server.out 2>&1' "$REQ" \
       "${envs[@]}" "$PYTHON" "$SERVER" "${args[@]}" "$@"; exit 0) </dev/null >/dev/null 2>&1 & )
  local i
  for ((i = 0; i < 100; i++)); do [ -s "$REQ/pid" ] && break; sleep 0.05; done
  SERVER_PID=$(cat "$REQ/pid" 2>/dev/null)
  [ -n "$SERVER_PID" ]
}
server_said() {  # the end of what the server left: its error, its output
  { tail -n 3 "$REQ/error" 2>/dev/null || tail -n 3 "$REQ/server.out" 2>/dev/null; } | tr '\n' ' ' | cut -c1-400
}
# wait_file NAME SECONDS: REQDIR/NAME appears while the server lives.
wait_file() {
  local deadline=$((EPOCHSECONDS + $2))
  while [ "$EPOCHSECONDS" -lt "$deadline" ]; do
    [ -e "$REQ/$1" ] && return 0
    if ! proc_alive "$SERVER_PID"; then [ -e "$REQ/$1" ] && return 0; return 2; fi
    sleep 0.005
  done
  return 1
}
write_request() { printf '%s\n' "$REQUEST" > "$REQ/request.tmp" && mv -f "$REQ/request.tmp" "$REQ/request"; }
# proc_faults PID: its minor and major page faults so far ("MIN MAJ"; the
# fields after the command's closing parenthesis, which may hold spaces).
proc_faults() {
  local stat; stat=$(cat "/proc/$1/stat" 2>/dev/null) || { echo "0 0"; return; }
  set -- ${stat##*) }
  echo "${8:-0} ${10:-0}"
}
# faults_between "MIN MAJ" "MIN MAJ": the second less the first, "MIN/MAJ".
faults_between() { awk -v a="$1" -v b="$2" 'BEGIN {split(a, x, " "); split(b, y, " "); printf "%d/%d", y[1] - x[1], y[2] - x[2]}'; }

# The reply into R: first_reply_s, seen_s, gen_ms, tokens, tokens_check; 1
# when the server answered with an error.
take_reply() {
  local t0=$1 shape=$2 ref
  cp "$REQ/reply" "$W/reply" 2>/dev/null
  R[first_reply_s]=$(dt "$t0" "$(kv "$REQ/reply" time)")
  R[seen_s]=$(dt "$t0" "$(kv "$REQ/reply" seen)")
  R[gen_ms]=$(kv "$REQ/reply" gen_ms)
  R[request]=$(kv "$REQ/reply" request)
  R[tokens]=$(kv "$REQ/reply" tokens)
  if [ -z "${R[tokens]}" ]; then
    R[tokens]=- R[note]="the server's reply: $(kv "$REQ/reply" error)"; return 1
  fi
  ref=$(ref_tokens "$shape")
  [ -z "$ref" ] && ref=${first_tokens[$shape]:-}
  if [ -z "$ref" ]; then R[tokens_check]=REF; first_tokens[$shape]=${R[tokens]}
  elif [ "$ref" = "${R[tokens]}" ]; then R[tokens_check]=OK
  else R[tokens_check]=DIFF; fi
  # The warm-up's tokens, made before any checkpoint: a DIFF there too is
  # the environment's (libphos.so, another GPU), not the restore's.
  ref=$(ref_tokens "$shape" warmup_tokens)
  [ -z "$ref" ] && ref=${first_warmup[$shape]:-}
  if [ -z "${R[warmup_tokens]}" ] || [ "${R[warmup_tokens]}" = - ]; then R[warmup_check]=-
  elif [ -z "$ref" ]; then R[warmup_check]=REF; first_warmup[$shape]=${R[warmup_tokens]}
  elif [ "$ref" = "${R[warmup_tokens]}" ]; then R[warmup_check]=OK
  else R[warmup_check]=DIFF; fi
  return 0
}
declare -A first_tokens first_warmup

# The same request again right after the first reply: R[second_s] (written
# to reply), R[second_gen_ms], R[second_check] (its tokens against the
# first reply's). The server deletes a request after its reply: the next is
# written only once that one is gone.
second_request() {
  local i t0 rc
  for ((i = 0; i < 500; i++)); do [ -e "$REQ/request" ] || break; sleep 0.01; done
  [ -e "$REQ/request" ] && { R[note]="${R[note]:+${R[note]}; }the first request was not taken away"; return 1; }
  rm -f "$REQ/reply"
  t0=$(now)
  write_request
  wait_file reply 120; rc=$?
  [ $rc -eq 0 ] || { R[note]="${R[note]:+${R[note]}; }no second reply"; return 1; }
  cp "$REQ/reply" "$W/reply.second" 2>/dev/null
  SECOND_T0=$t0
  R[second_s]=$(dt "$t0" "$(kv "$REQ/reply" time)")
  R[second_gen_ms]=$(kv "$REQ/reply" gen_ms)
  if [ "$(kv "$REQ/reply" tokens)" = "${R[tokens]}" ]; then R[second_check]=OK; else R[second_check]=DIFF; fi
}

# server_line PATTERN: the server's last stderr line with PATTERN, said
# where there is one (libphos's lines: PHOS_SHRINK_DRIVER_STATE's).
server_line() {
  local l; l=$(grep -a -- "$1" "$REQ/server.out" 2>/dev/null | tail -n1)
  [ -n "$l" ] && say "    server: $l"
  return 0
}

# The slow-call trace (PHOS_TRACE_SLOW_CALLS_MS) of the restored server,
# from its stderr, placed by the wall clock: within the first reply
# (T0 .. its reply) into R[slow_calls], R[slow_calls_ms], R[slow_gaps],
# R[slow_gaps_ms] and R[first_call_gap_ms]; every line kept in
# $W/slow-calls.txt; the slowest of the first reply into $W/slow-first.txt.
slow_calls_report() {
  local t0=$1 first=$2 second_t0=${3:-} second=${4:-} out
  grep -a 'phos: slow' "$REQ/server.out" > "$W/slow-calls.txt" 2>/dev/null || return 0
  # (the first call is logged whatever it took: counted only if slow)
  out=$(awk -v a="$t0" -v b="$first" -v th="$TRACE_MS" -v top="$W/slow-first.txt" '
    function wall(   s) { if (!match($0, /wall [0-9.]+/)) return -1; s = substr($0, RSTART + 5, RLENGTH - 5); return s + 0 }
    /^phos: slow call: / { w = wall(); if (w < a || w > b || $5 + 0 < th) next; n++; t += $5; print $5, "call", $4, $0 > top }
    /^phos: slow gap: / { w = wall(); if (w < a || w > b) next
      if ($0 ~ / before call 1 /) g1 = $4; else { gn++; gt += $4; print $4, "gap", "-", $0 > top } }
    END { printf "%d %.1f %d %.1f %s\n", n, t, gn, gt, g1 == "" ? "-" : sprintf("%.1f", g1) }' "$W/slow-calls.txt")
  read -r R[slow_calls] R[slow_calls_ms] R[slow_gaps] R[slow_gaps_ms] R[first_call_gap_ms] <<<"$out"
  if [ -s "$W/slow-first.txt" ]; then sort -rn -o "$W/slow-first.txt" "$W/slow-first.txt"; fi
}
# print_slow_calls: the first reply's slowest calls and gaps (10), for the log.
print_slow_calls() {
  [ -s "$W/slow-first.txt" ] || return 0
  say "    slow calls within the first reply (>= $TRACE_MS ms): ${R[slow_calls]} calls took ${R[slow_calls_ms]} ms; ${R[slow_gaps]} gaps between calls took ${R[slow_gaps_ms]} ms; the first call came ${R[first_call_gap_ms]} ms after the gate opened; slowest:"
  head -n 10 "$W/slow-first.txt" | awk '{ at = ""; if (match($0, /ending at \+[0-9.]+ ms/)) at = substr($0, RSTART + 10, RLENGTH - 10)
      if ($2 == "call") printf "      %9.1f ms  %-28s (call ending at %s)\n", $1, $3, at
      else printf "      %9.1f ms  %-28s (ending at %s)\n", $1, "gap (program, no CUDA call)", at }'
  local summary; summary=$(grep -a 'slow-call trace:' "$W/slow-calls.txt" | tail -n1)
  [ -n "$summary" ] && say "    ${summary#*phos: }"
  return 0
}
# The server's own timeline (ready file), relative to T0.
take_ready() {
  local t0=$1 t
  for t in imported model ready; do R[srv_${t}_s]=$(dt "$t0" "$(kv "$REQ/ready" "t_$t")"); done
  R[gpu_used_gib]=$(gib "$(kv "$REQ/ready" gpu_used_bytes)")
  R[warmup_tokens]=$(kv "$REQ/ready" warmup_tokens)
  R[warmup_tokens]=${R[warmup_tokens]:--}
  R[rss_gib]=$(awk '/^VmRSS:/ {printf "%.2f", $2 / 1048576}' "/proc/$SERVER_PID/status" 2>/dev/null)
  R[rss_gib]=${R[rss_gib]:--}
}

# -------------------------------------------------------------- criu
# run_criu NAME BIN [VAR=VALUE...] -- ARGS...: bounded by CRIU_TIMEOUT,
# stderr to $W/NAME.err, never under LD_PRELOAD; PHOS_LAZY_RESTORE only
# where VAR=VALUE names it.
run_criu() {
  local name=$1 bin=$2 envs=(); shift 2
  while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
  timeout --foreground -k 10 "$CRIU_TIMEOUT" env -u LD_PRELOAD -u PHOS_LAZY_RESTORE "${envs[@]}" "$bin" "$@" 2>"$W/$name.err"
}
criu_error() {
  { grep -hE "Error|error" "$W/$1.err" "$W/$1.log" 2>/dev/null || true; } | tail -n 2 | tr '\n' ' ' | cut -c1-400
}
# images_gib: du of criu's own files and of phos-*.img, apparent size of the latter.
images_gib() {
  R[image_criu_gib]=$(find "$IMG" -maxdepth 1 -type f ! -name 'phos-*' -printf '%b\n' | awk -v g=$GIB '{s += $1 * 512} END {printf "%.2f", s / g}')
  if compgen -G "$IMG/phos-*" >/dev/null; then
    R[image_phos_gib]=$(find "$IMG" -maxdepth 1 -type f -name 'phos-*' -printf '%b\n' | awk -v g=$GIB '{s += $1 * 512} END {printf "%.2f", s / g}')
    R[image_phos_apparent_gib]=$(find "$IMG" -maxdepth 1 -type f -name 'phos-*' -printf '%s\n' | awk -v g=$GIB '{s += $1} END {printf "%.2f", s / g}')
  fi
}

# restore_breakdown LOG TOOL: criu's restore log into R (times in s since
# criu's start, durations in ms; "-" where the log does not say).
restore_breakdown() {
  local out
  out=$(awk -v tool="$2" '
    function t() { return substr($1, 2) + 0 }
    # nums(RE): the numbers in the first match of RE in this line, into n[]
    function nums(re,   s) { delete n; if (!match($0, re)) return 0; s = substr($0, RSTART, RLENGTH)
                             gsub(/[^0-9.]+/, " ", s); return split(s, n, " ") }
    function v(x, f) { return x == "" ? "-" : sprintf(f, x) }
    tool != "cuda_plugin" && / phos: / && init == "" { init = t() }
    tool == "cuda_plugin" && / cuda_plugin: / && init == "" { init = t() }
    / plugin: .* hook 9 -> / && hook == "" { hook = t() }
    # phos
    / phos: process [0-9]+: driver restore/ && drv == "" { drv = t() }
    / phos: process [0-9]+: driver restored and unlocked/ && drv_end == "" { drv_end = t() }
    / phos: process [0-9]+: .* mapped at the original addresses/ && remap_end == "" { remap_end = t() }
    / phos: process [0-9]+: .*GPU state restored, gate open/ && gate == "" { gate = t() }
    / phos: process [0-9]+: .* MiB restored to device memory in / && fill_t == "" {
      fill_t = t()
      if (nums("[0-9.]+ MiB restored to device memory in [0-9.]+ ms [(][0-9.]+ GB/s") >= 3) { mib0 = n[1]; gbps0 = n[3] } }
    / phos: .*restore breakdown/ {
      if (nums("GPU memory created [0-9.]+")) created = n[1]
      # eager: "filled B (X MiB at Y GB/s)"; lazy: "filled behind the running process (X MiB)"
      if (nums("filled [0-9.]+ [(][0-9.]+ MiB at [0-9.]+ GB/s") >= 3) { filled = n[1]; mib = n[2]; gbps = n[3] }
      else { if (nums("filled [0-9.]+")) filled = n[1]; if ((k = nums("filled [^(]*[(][0-9.]+ MiB"))) mib = n[k] }
      if (nums("waited for the fill until [0-9.]+")) waited = n[1]
      if (nums("resume hook [0-9.]+")) resume = n[1]
      if (nums("driver restore [0-9.]+")) driver = n[1]
      if (nums("remap [0-9.]+")) remap = n[1]
      if (nums("gate open [0-9.]+")) gopen = n[1]
      if (drv == "") drv = t() }
    / phos: .*all GPU data in at [0-9.]+/ { if (nums("all GPU data in at [0-9.]+")) allin = n[1] }
    / phos: .*on-demand restore: [0-9]+ calls checked/ {
      if (nums("[0-9]+ calls checked, [0-9]+ waited") >= 2) lwaited = n[2]
      if (nums("[0-9.]+ ms waited in all")) lwait = n[1] }
    # CRIU cuda plugin: its driver restore runs from "resuming devices" to its next line
    tool == "cuda_plugin" && cdrv != "" && cdrv_end == "" && !/Restore thread pid/ { cdrv_end = t() }
    tool == "cuda_plugin" && / cuda_plugin: resuming devices on pid/ && cdrv == "" { cdrv = t() }
    END {
      if (tool == "cuda_plugin") {
        drv = cdrv; if (cdrv != "" && cdrv_end != "") driver = (cdrv_end - cdrv) * 1000
        gpu_in = cdrv_end
      } else {
        if (driver == "" && drv != "" && drv_end != "") driver = (drv_end - drv) * 1000
        if (remap == "" && drv_end != "" && remap_end != "") remap = (remap_end - drv_end) * 1000
        if (gopen == "" && gate != "" && init != "") gopen = (gate - init) * 1000
        if (filled == "" && fill_t != "" && init != "") { filled = (fill_t - init) * 1000; mib = mib0; gbps = gbps0 }
        if (init != "" && allin != "") gpu_in = init + allin / 1000
        else if (init != "" && filled != "") gpu_in = init + filled / 1000
      }
      cpu = hook; if (cpu == "" && init != "" && resume != "") cpu = init + resume / 1000
      print v(init, "%.3f"), v(cpu, "%.3f"), v(drv, "%.3f"), v(created, "%.1f"), v(filled, "%.1f"), v(mib, "%.0f"),
            v(gbps, "%.1f"), v(resume, "%.1f"), v(waited, "%.1f"), v(driver, "%.1f"), v(remap, "%.1f"), v(gopen, "%.1f"),
            v(allin, "%.1f"), v(gpu_in, "%.3f"), v(lwaited, "%d"), v(lwait, "%.1f")
    }' "$1" 2>/dev/null)
  local names=(init_s cpu_restore_s driver_start_s created_ms filled_ms fill_mib fill_gbps resume_ms fill_wait_ms driver_ms
               remap_ms gate_ms all_in_ms gpu_in_s lazy_calls_waited lazy_wait_ms) vals i
  read -r -a vals <<<"$out"
  for i in "${!names[@]}"; do R[${names[$i]}]=${vals[$i]:--}; done
}

# ------------------------------------------------------------ one case
# no_room PATH GPU_GIB RSS_GIB: why this host cannot hold the case (nothing
# when it can): the image (on the tmpfs: RAM) and the restored process; with
# the cuda plugin the device memory is in both (the driver moves it into the
# process, criu dumps it with the process's pages).
no_room() {
  local r=${3/#-/3} need have img
  need=$(awk -v g="$2" -v r="$r" -v p="$1" 'BEGIN {printf "%.1f", (p == "cuda_plugin") ? 2 * (g + r) + 4 : g + 2 * r + 4}')
  have=$(mem_available_gib)
  if lt "$have" "$need"; then echo "needs ~$need GiB of host memory, $have GiB available"; return; fi
  img=$(awk -v g="$2" -v r="$r" 'BEGIN {printf "%.1f", g + r + 1}')
  have=$(avail_gib "$SHM")
  if lt "$have" "$img"; then echo "the image needs ~$img GiB on $SHM, $have GiB free"; fi
}
# case_cleanup: the case's processes gone (their GPU and host memory free
# for the next), its image removed.
case_cleanup() {
  end_pid "$LAZY_PID" criu
  end_pid "$SERVER_PID" llama_server.py
  [ -n "$IMG" ] && rm -rf "$IMG"
  LAZY_PID='' SERVER_PID='' IMG=''
}
trap 'case_cleanup; publish' EXIT
trap 'exit 130' INT TERM

# fail MESSAGE: the case failed (the caller returns 1).
fail() {
  R[status]=failed R[note]="$*"
  say "    FAIL: $*"
  local f
  for f in "$W"/*.err "$REQ/error"; do
    [ -s "$f" ] && { echo "    ---- $(basename "$f") (last 5 lines)"; tail -n 5 "$f" | sed 's/^/    /'; }
  done
  return 0
}

case_native() {  # case_native SHAPE
  local shape=$1 t0 rc
  write_request
  t0=$(now)
  start_server "$shape" 0 --native-start || { fail "the server did not start"; return 1; }
  wait_file reply $((300 + $(start_est_s "$shape") * 4)); rc=$?
  [ $rc -eq 0 ] || { fail "no reply ($([ $rc -eq 2 ] && echo "the server died: $(server_said)" || echo "timed out"))"; return 1; }
  take_ready "$t0"
  take_reply "$t0" "$shape" || { fail "${R[note]}"; return 1; }
  second_request
  R[status]=ok
  say "    native: first reply ${R[first_reply_s]} s (imports ${R[srv_imported_s]} s, model ${R[srv_model_s]} s, ready ${R[srv_ready_s]} s, generate ${R[gen_ms]} ms); GPU ${R[gpu_used_gib]} GiB; tokens ${R[tokens_check]} (warm-up's ${R[warmup_check]})"
  say "    second request: reply ${R[second_s]} s after it was written (generate ${R[second_gen_ms]} ms; tokens ${R[second_check]} against the first reply's)"
  say "    the server's page faults (minor/major): from criu's return to the first reply ${R[faults_first]}, in the second request ${R[faults_second]}"
  : > "$REQ/stop"
  wait_gone "$SERVER_PID" 5
  return 0
}

case_checkpoint() {  # case_checkpoint SHAPE PATH
  local shape=$1 path=$2 bin=$CRIU preload=1 so=$PHOS_PLUGIN_SO renv=() lazy_pages='' rc t0 t1 why
  SERVER_ENV=()
  case $path in
    phos_eager_shrink) SERVER_ENV=(PHOS_SHRINK_DRIVER_STATE=1) ;;
    phos_eager_noshrink) SERVER_ENV=(PHOS_SHRINK_DRIVER_STATE=0) ;;
    phos_eager_modeager) SERVER_ENV=(CUDA_MODULE_LOADING=EAGER) ;;
    cuda_plugin) preload=0 so=$CUDA_PLUGIN_SO ;;
    phos_eager_serial) renv=(PHOS_RESTORE_OVERLAP=off) ;;
    phos_lazy) renv=(PHOS_LAZY_RESTORE=on) ;;
    phos_lazy_pages) renv=(PHOS_LAZY_RESTORE=on) lazy_pages=1 ;;
    phos_eager_criu_dev) bin=$CRIU_DEV ;;
  esac
  mkdir -p "$W/plugins" && ln -sf "$so" "$W/plugins/"
  IMG=$(mktemp -d "$SHM/coldstart-img.XXXXXX") || { fail "cannot create an image directory in $SHM"; return 1; }
  CRIU_TIMEOUT=$(awk -v g="$(gpu_est_gib "$shape")" 'BEGIN {printf "%d", 120 + 4 * g}')

  why=$(no_room "$path" "$(gpu_est_gib "$shape")" 3)   # before the start: estimates
  [ -z "$why" ] || { R[status]=skip R[note]=$why; return 0; }
  t0=$(now)
  start_server "$shape" "$preload" || { fail "the server did not start"; return 1; }
  wait_file ready $((300 + $(start_est_s "$shape") * 4)); rc=$?
  [ $rc -eq 0 ] || { fail "not ready ($([ $rc -eq 2 ] && echo "the server died: $(server_said)" || echo "timed out"))"; return 1; }
  take_ready "$t0"
  why=$(no_room "$path" "${R[gpu_used_gib]}" "${R[rss_gib]}")
  [ -z "$why" ] || { R[status]=skip R[note]=$why; return 0; }

  # The dump: criu ends the server.
  t0=$(now)
  run_criu dump "$bin" -- dump -t "$SERVER_PID" -D "$IMG" --lib "$W/plugins" -v4 -o "$W/dump.log"; rc=$?
  t1=$(now)
  [ $rc -eq 0 ] || { fail "criu dump failed (exit $rc): $(criu_error dump)"; return 1; }
  R[dump_s]=$(dt "$t0" "$t1")
  # Without a pid namespace the restored pid is the dumped one: free first.
  wait_pid_free "$SERVER_PID" 30 || { fail "pid $SERVER_PID not free 30 s after the dump ($(if proc_alive "$SERVER_PID"; then echo "the server still runs"; else echo "a zombie nobody reaps"; fi))"; return 1; }
  images_gib
  local shown=''
  if [ "$preload" = 1 ]; then
    "$PHOSCTL" show "$IMG" > "$W/phosctl-show.txt" 2>&1
    shown=$(grep -m1 -E 'size: .*logical' "$W/phosctl-show.txt" || grep -m1 -E 'stored' "$W/phosctl-show.txt")
    shown=${shown#"${shown%%[! ]*}"}
    grep -q "phos: process $SERVER_PID: closing its gate" "$W/dump.log" ||
      R[note]="dump.log: phos did not close the gate of pid $SERVER_PID"
    R[phos_size]=$shown
  elif ! grep -q "Checkpointing CUDA devices on pid $SERVER_PID" "$W/dump.log"; then
    R[note]="dump.log: CRIU's cuda plugin did not checkpoint pid $SERVER_PID"
  fi
  # "process P: driver checkpoint T ms; resident memory A -> B MiB (+D MiB: ...)"
  local drv; drv=$(grep -aoE "driver checkpoint [0-9.]+ ms; resident memory [0-9.]+ -> [0-9.]+ MiB \([+-][0-9.]+ MiB" "$W/dump.log" | head -n1)
  if [ -n "$drv" ]; then
    R[driver_ckpt_ms]=$(awk '{print $3}' <<<"$drv")
    R[driver_state_mib]=$(sed -E 's/.*\(([+-][0-9.]+) MiB$/\1/' <<<"$drv")
  fi
  say "    dump ${R[dump_s]} s; image: criu ${R[image_criu_gib]} GiB, phos ${R[image_phos_gib]} GiB${shown:+ ($shown)}; driver checkpoint ${R[driver_ckpt_ms]} ms, ${R[driver_state_mib]} MiB of device state into the process"
  server_line 'context limits lowered'

  # The restore, the request waiting.
  rm -f "$REQ/reply"
  write_request
  if [ -n "$lazy_pages" ]; then
    local tl; tl=$(now)
    run_criu lazy-pages "$bin" -- lazy-pages -D "$IMG" -d --pidfile "$W/lazy-pages.pid" -v4 -o "$W/lazy-pages.log"; rc=$?
    LAZY_PID=$(cat "$W/lazy-pages.pid" 2>/dev/null)
    if [ $rc -ne 0 ] || [ -z "$LAZY_PID" ]; then fail "criu lazy-pages did not start (exit $rc): $(criu_error lazy-pages)"; return 1; fi
  fi
  local cargs=(restore -D "$IMG" --lib "$W/plugins" -d -v4 -o "$W/restore.log")
  [ -n "$lazy_pages" ] && cargs+=(--lazy-pages)
  t0=$(now)
  run_criu restore "$bin" "${renv[@]}" -- "${cargs[@]}"; rc=$?
  t1=$(now)
  R[criu_s]=$(dt "$t0" "$t1")
  [ $rc -eq 0 ] || { fail "criu restore failed (exit $rc): $(criu_error restore)"; return 1; }
  # The restored server's page faults (is the first generate's extra time
  # the CPU's first touch of pages criu did not map, its libraries' code?).
  local f0 f1 f2; f0=$(proc_faults "$SERVER_PID")
  wait_file reply $((120 + ${R[gpu_used_gib]%.*})); rc=$?
  [ $rc -eq 0 ] || { fail "no reply from the restored server ($([ $rc -eq 2 ] && echo "it died: $(server_said)" || echo "timed out"))"; return 1; }
  f1=$(proc_faults "$SERVER_PID")
  take_reply "$t0" "$shape" || { fail "${R[note]}"; return 1; }
  SECOND_T0=''
  second_request
  f2=$(proc_faults "$SERVER_PID")
  R[faults_first]=$(faults_between "$f0" "$f1") R[faults_second]=$(faults_between "$f1" "$f2")
  [ "$preload" = 1 ] && slow_calls_report "$t0" "$(kv "$W/reply" time)"
  restore_breakdown "$W/restore.log" "$([ "$path" = cuda_plugin ] && echo cuda_plugin || echo phos)"
  if [ -n "$lazy_pages" ]; then
    # The daemon ends once every page is in; when, from its log (its own clock).
    wait_gone "$LAZY_PID" 30 || say "    warning: criu lazy-pages still runs 30 s after the reply"
    local last; last=$(criu_log_at "$W/lazy-pages.log" . last)
    [ -n "$last" ] && R[lazy_pages_done_s]=$(awk -v a="$tl" -v b="$t0" -v l="$last" 'BEGIN {printf "%.3f", a - b + l}')
  fi
  if [[ $path == phos_lazy* ]] && ! grep -q 'phos: settings.*lazy_restore=on' "$W/restore.log"; then
    R[note]="${R[note]:+${R[note]}; }the plugin's settings line has no lazy_restore=on: restored eagerly"
  fi
  R[status]=ok
  say "    restore: criu returned ${R[criu_s]} s, program saw the request ${R[seen_s]} s, first reply ${R[first_reply_s]} s (generate ${R[gen_ms]} ms); tokens ${R[tokens_check]} (warm-up's ${R[warmup_check]})"
  say "    second request: reply ${R[second_s]} s after it was written (generate ${R[second_gen_ms]} ms; tokens ${R[second_check]} against the first reply's)"
  say "    the server's page faults (minor/major): from criu's return to the first reply ${R[faults_first]}, in the second request ${R[faults_second]}"
  print_slow_calls
  server_line 'context limits set back'
  say "    criu log: plugin init ${R[init_s]} s, resume hook ${R[cpu_restore_s]} s, GPU data in ${R[gpu_in_s]} s"
  local overlap
  overlap=$(grep -ao "phos: process [0-9]*: restore breakdown .*; overlap=.*" "$W/restore.log" 2>/dev/null | head -n1 | sed 's/.*; overlap=/overlap=/')
  [ -n "$overlap" ] && say "    plugin: $overlap"
  say "    plugin (ms after its init): created ${R[created_ms]}, filled ${R[filled_ms]} (${R[fill_mib]} MiB at ${R[fill_gbps]} GB/s), resume hook ${R[resume_ms]}, waited for the fill until ${R[fill_wait_ms]}, driver restore ${R[driver_ms]} ms, remap ${R[remap_ms]} ms, gate open ${R[gate_ms]}, all in ${R[all_in_ms]}; on-demand: ${R[lazy_calls_waited]} calls waited ${R[lazy_wait_ms]} ms${lazy_pages:+; criu lazy-pages done at ${R[lazy_pages_done_s]} s}"
  [ -n "${R[note]}" ] && say "    note: ${R[note]}"
  return 0
}

# run_case SHAPE PATH REP: one row.
run_case() {
  local shape=$1 path=$2 rep=$3
  row_reset
  R[shape]=$shape R[path]=$path R[rep]=$rep R[status]=failed R[request]=$REQUEST
  W=$LOGDIR/$shape-$path-$rep
  rm -rf "$W"; mkdir -p "$W/req" || die "cannot create $W"
  REQ=$W/req
  if [ "$path" = native ]; then case_native "$shape"; else case_checkpoint "$shape" "$path"; fi
  case_cleanup
  # criu's logs are large: their plugin lines apart, then gzipped in place.
  local f
  for f in "$W"/*.log; do
    [ -s "$f" ] || continue
    grep -E " (phos|cuda_plugin): | hook [0-9]+ -> |Restore finished|Dumping finished|Error" "$f" > "${f%.log}-lines.txt"
    gzip -f "$f"
  done
  row_write
}

# ----------------------------------------------------------------- main
[ "$(id -u)" -eq 0 ] || die "needs root (criu, the tmpfs)"
[ -f "$SERVER" ] || die "no $SERVER"
for p in "${PATHS[@]}"; do
  [ "$p" = native ] && continue
  [ -x "$CRIU" ] || die "no criu at $CRIU"
  [ "$p" = cuda_plugin ] || [ -f "$LIBPHOS" ] || die "no $LIBPHOS: build the bundle (test/gpu/make-bundle.sh)"
done
# Servers and images an earlier run left behind (a call cut off at its limit).
stale=$(pgrep -f "llama_server\.py --reqdir " | tr '\n' ' ')
if [ -n "$stale" ] && [ -n "$KILL_STALE" ]; then
  echo "bench_coldstart: killing servers an earlier run left behind: pids $stale"
  for p in $stale; do end_pid "$p" llama_server.py; done
elif [ -n "$stale" ]; then
  echo "bench_coldstart: warning: servers of an earlier run still hold GPU and host memory: pids $stale(--kill-stale ends them)"
fi
if [ -z "$PROTOCOL_ONLY" ]; then
  versions=$("$PYTHON" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())' 2>&1 | tail -n1)
  [[ $versions == torch* ]] || die "$PYTHON cannot import torch and transformers: $versions"
else
  versions="protocol only (no torch)"
fi
# The images' tmpfs, warmed with the largest image that any case makes.
need_shm=0
for p in "${PATHS[@]}"; do [ "$p" = native ] || need_shm=1; done
SHM=''
if [ $need_shm = 1 ]; then
  largest=$(for s in "${SHAPES[@]}"; do gpu_est_gib "$s"; done | sort -n | tail -n1)
  # (at most what the host's memory holds beside a process: a larger case is skipped)
  bench_tmpfs coldstart "$(awk -v g="$largest" -v m="$(mem_available_gib)" 'BEGIN {g += 4.5; if (g > m - 8) g = m - 8; if (g < 1) g = 1; printf "%d", g}')"
  SHM=$TMPDIR
  for d in "$SHM"/coldstart-img.*; do [ -d "$d" ] && { echo "bench_coldstart: removing the image $d left by an earlier run"; rm -rf "$d"; }; done
fi
mkdir -p "$LOGDIR" || die "cannot create $LOGDIR"
csv_init
echo "bench_coldstart: run $RUN_ID: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n1 || echo 'no nvidia-smi'); $(nproc) cores; RAM $(awk '/^MemTotal/ {printf "%d GiB", $2 / 1048576}' /proc/meminfo), $(mem_available_gib) GiB available"
echo "bench_coldstart: $versions; criu $("$CRIU" --version 2>/dev/null | awk '/^Version/ {print $2}')${CRIU_DEV:+, criu-dev $CRIU_DEV}"
echo "bench_coldstart: shapes ${SHAPES[*]}, paths ${PATHS[*]}, $REPS reps, kv-cache-frac $KV_FRAC, request '$REQUEST'"
echo "bench_coldstart: CSV $CSV, logs $LOGDIR${SHM:+, images on $SHM}, budget $BUDGET s"

deferred=()
for shape in "${SHAPES[@]}"; do
  for rep in $(seq "$REPS"); do
    for path in "${PATHS[@]}"; do
      label="$shape $path rep $rep"
      if [ -n "$RESUME" ] && has_result "$shape" "$path" "$rep"; then say "$label: done in an earlier run"; continue; fi
      if [ "$path" = phos_eager_criu_dev ] && { [ -z "$CRIU_DEV" ] || [ ! -x "$CRIU_DEV" ]; }; then
        say "$label: SKIP: no CRIU_DEV (CRIU's development branch: test/gpu/build-criu-dev.sh, then make-bundle.sh)"
        continue
      fi
      if [ "$path" = cuda_plugin ] && { [ ! -f "$CUDA_PLUGIN_SO" ] || ! command -v cuda-checkpoint >/dev/null; }; then
        say "$label: SKIP: no $CUDA_PLUGIN_SO or no cuda-checkpoint on PATH"
        continue
      fi
      est=$(estimate_s "$shape" "$path")
      left=$((BUDGET - (EPOCHSECONDS - START)))
      if [ "$est" -gt "$left" ]; then
        say "$label: DEFERRED: estimated $est s, $left s left of the budget (the same command with --resume runs it)"
        deferred+=("$label"); continue
      fi
      gpu_used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 2>/dev/null | head -n1)
      say "$label: start (estimated $est s; GPU ${gpu_used:-?} MiB used, host $(mem_available_gib) GiB available)"
      t=$EPOCHSECONDS
      run_case "$shape" "$path" "$rep"
      took[$shape:$path]=$((EPOCHSECONDS - t))
      case ${R[status]} in
        ok) say "$label: done in ${took[$shape:$path]} s" ;;
        skip) say "$label: SKIP: ${R[note]}" ;;
        *) say "$label: FAILED in ${took[$shape:$path]} s: ${R[note]}" ;;
      esac
      publish
    done
  done
done

# ---------------------------------------------------------------- table
table=${CSV%.csv}.md
{
  echo "## Cold start: restore until the program answers (medians over the reps; images on a tmpfs of huge pages)"
  echo "request '$REQUEST'; kv-cache-frac $KV_FRAC; $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1)"
  echo
  echo "| shape | path | first reply s | x native | generate ms (first / second request) | slow calls in the first reply (n, ms / gaps n, ms) | criu returns s | GPU data in s | criu CPU restore s | driver restore ms | tokens | image GiB (criu / phos) | dump s | driver checkpoint ms (state MiB) | ok/n |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
  awk -F, "$awk_median"'
    function col(name) { return c[name] }
    function add(key, name,   x) { x = $(col(name)); if (x != "-" && x != "") vals[key, col(name)] = vals[key, col(name)] " " x }
    function med(key, name,   m) { m = median(key, col(name)); return m == "" ? "-" : m }
    NR == 1 { for (i = 1; i <= NF; i++) c[$i] = i; next }
    $(col("status")) == "skip" { next }
    {
      key = $(col("shape")) "," $(col("path"))
      if (!(key in n)) order[++k] = key
      n[key]++
      if ($(col("status")) != "ok") next
      ok[key]++
      add(key, "first_reply_s"); add(key, "criu_s"); add(key, "gpu_in_s"); add(key, "cpu_restore_s"); add(key, "driver_ms")
      add(key, "image_criu_gib"); add(key, "image_phos_gib"); add(key, "dump_s")
      add(key, "driver_ckpt_ms"); add(key, "driver_state_mib")
      add(key, "gen_ms"); add(key, "second_gen_ms"); add(key, "slow_calls"); add(key, "slow_calls_ms"); add(key, "slow_gaps"); add(key, "slow_gaps_ms")
      tk[key] = tk[key] " " $(col("tokens_check")); wk[key] = wk[key] " " $(col("warmup_check"))
    }
    END {
      for (i = 1; i <= k; i++) {
        key = order[i]; split(key, f, ",")
        nat = median(f[1] ",native", col("first_reply_s")); fr = med(key, "first_reply_s")
        x = (nat != "" && fr != "-" && fr + 0 > 0) ? sprintf("%.1f", nat / fr) : "-"
        t = tk[key]; tokens = "-"
        if (t ~ /DIFF/) tokens = (wk[key] ~ /DIFF/) ? "DIFF (warm-up too)" : "DIFF"; else if (t ~ /OK/) tokens = "OK"; else if (t ~ /REF/) tokens = "REF"
        printf "| %s | %s | %s | %s | %s / %s | %s, %s / %s, %s | %s | %s | %s | %s | %s | %s / %s | %s | %s (%s) | %d/%d |\n", f[1], f[2], fr, x,
          med(key, "gen_ms"), med(key, "second_gen_ms"), med(key, "slow_calls"), med(key, "slow_calls_ms"),
          med(key, "slow_gaps"), med(key, "slow_gaps_ms"), med(key, "criu_s"), med(key, "gpu_in_s"), med(key, "cpu_restore_s"), med(key, "driver_ms"), tokens,
          med(key, "image_criu_gib"), med(key, "image_phos_gib"), med(key, "dump_s"), med(key, "driver_ckpt_ms"), med(key, "driver_state_mib"), ok[key], n[key]
      }
    }' "$CSV"
  awk -F, 'NR == 1 {for (i = 1; i <= NF; i++) c[$i] = i; next}
    $(c["status"]) == "skip" || $(c["status"]) == "failed" {
      note = $0; for (i = 1; i < c["note"]; i++) note = substr(note, index(note, ",") + 1)
      printf "%s %s rep %s: %s: %s\n", $(c["shape"]), $(c["path"]), $(c["rep"]), toupper($(c["status"])), note }' "$CSV"
} | tee "$table"
[ -n "${OUT:-}" ] && cp "$table" "$OUT/bench_coldstart.md" 2>/dev/null
publish
if [ ${#deferred[@]} -gt 0 ]; then
  echo "bench_coldstart: ${#deferred[@]} cases DEFERRED for the budget: ${deferred[*]}; run the same command again with --resume"
fi
exit 0
