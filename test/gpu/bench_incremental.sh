#!/usr/bin/env bash
# Incremental images on a GPU host (after `source test/gpu/run-on-host.sh`;
# issue 32); images on a tmpfs of huge pages (bench_lib.sh).
#
# For each workload (--workloads, in turn, one process each):
#   server  llama_server.py --shape S (--server-shape: 1b, 2.3 GiB of bf16
#           weights, by default; 8b, 15 GiB, the issue's inference row) with a KV
#           pool of --kv-gib GiB, all written, and --kv-keep: each request's
#           KV cache is kept in the pool (a ring), as a paged KV cache keeps
#           it; between two checkpoints it answers --requests requests
#           (prompts of 512 tokens, a new seed each, 16 new tokens)
#   lora    torch_loop.py lora --gib --lora-gib: fine-tuning with a frozen
#           bf16 base and rank-16 adapters, AdamW on the adapters alone;
#           --steps steps between two checkpoints
#   train   torch_loop.py train --gib --train-gib --width 2048: full
#           training (weights, gradients and AdamW's states all written);
#           --steps steps between two checkpoints
# --dumps (20) periodic leave-running checkpoints: img1 full, each next one
# against the one before (parent_image=../imgK; criu's own CPU pages are
# dumped whole: the GPU host has no soft-dirty tracking for criu's
# --prev-images-dir), and one full image, full10, right after img10. The
# sizes: the GPU data each stores (phosctl show: stored bytes; an
# incremental image references the parent's chunks that its size, CRC-32C
# and 64-bit fingerprint show unchanged) and criu's files beside it.
# Then the process is killed and restored from img10 (a chain of --chain,
# 10, images) and from full10, in turn, each timed (criu restore -d until it
# returns) and checked to carry on as the original did:
#   server  a request asked before the first checkpoint is answered again
#           with the same tokens (greedy decoding of the same weights)
#   lora, train  each of the next 5 steps' losses equals, bitwise, the
#           original's loss at that step (the same process continued)
# Only img10's and full10's criu files are kept (the chain needs phos's files
# alone). A failed check is reported in the table and makes the exit status
# 1; a failed dump or restore stops the benchmark.
# One CSV row per image (--csv), one per restore (CSV-restore.csv); the
# tables go to stdout. On an H200, about 5 minutes with the defaults.
# --protocol-only: the server without torch or a GPU (llama_server.py's
# plumbing mode: no pool, tokens a hash of the prompt), images in $TMPDIR:
# the benchmark's own plumbing, on a CPU host.
#
# usage: bench_incremental.sh [--workloads server,lora,train] [--dumps N]
#          [--chain N] [--kv-gib G] [--lora-gib G] [--train-gib G]
#          [--requests N] [--steps N] [--server-shape 1b|8b] [--csv FILE]
#          [--protocol-only]
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
workloads=server,lora,train dumps=20 chain=10 kv_gib=2 lora_gib=3 train_gib=2 requests=3 steps=5 protocol_only=
server_shape=1b
csv=${OUT:-/tmp}/bench_incremental.csv
usage="usage: bench_incremental.sh [--workloads server,lora,train] [--dumps N] [--chain N] [--kv-gib G] [--lora-gib G] [--train-gib G] [--requests N] [--steps N] [--server-shape 1b|8b] [--csv FILE] [--protocol-only]"
while [ $# -gt 0 ]; do
  case $1 in
    --workloads) workloads=$2; shift 2 ;;
    --dumps) dumps=$2; shift 2 ;;
    --chain) chain=$2; shift 2 ;;
    --kv-gib) kv_gib=$2; shift 2 ;;
    --lora-gib) lora_gib=$2; shift 2 ;;
    --train-gib) train_gib=$2; shift 2 ;;
    --requests) requests=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --server-shape) server_shape=$2; shift 2 ;;
    --csv) csv=$2; shift 2 ;;
    --protocol-only) protocol_only=--protocol-only workloads=server; shift ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
if [ "$chain" -lt 1 ] || [ "$chain" -gt "$dumps" ]; then echo "bench_incremental.sh: --chain must be in 1..--dumps" >&2; exit 2; fi
# The server's weights in GiB (bf16), for the tmpfs.
case $server_shape in
  1b) weights_gib=3 ;;
  8b) weights_gib=16 ;;
  *) echo "bench_incremental.sh: --server-shape must be 1b or 8b" >&2; exit 2 ;;
esac
for w in ${workloads//,/ }; do
  case $w in server|lora|train) ;; *) echo "bench_incremental.sh: unknown workload $w" >&2; exit 2 ;; esac
done
echo "command: source test/gpu/run-on-host.sh && test/gpu/bench_incremental.sh $*"
python=$(python3 -c 'import sys; print(sys.executable)')
export PHOS_NO_PIDNS=1 PHOS_WORKLOAD=$here/torch_loop.py PHOS_WORKLOAD_RUNNER=$python
# The tmpfs holds one workload's images at a time: at worst every image of
# full training stores all of it (its GPU data ~1.1 x --train-gib), plus
# the criu files kept and the full image.
need=$(awk -v d="$dumps" -v t="$train_gib" -v k="$kv_gib" -v l="$lora_gib" -v w="$weights_gib" \
  'BEGIN {m = (d + 1) * t * 1.1; s = 2 * (k + w) + 4; if (s > m) m = s; if (2 * l + 4 > m) m = 2 * l + 4; printf "%d", m + 6}')
source "$here/bench_lib.sh"
if [ -z "$protocol_only" ]; then bench_tmpfs bench-incremental "$need"; fi
export PHOS_CRIU_TIMEOUT=300 CUBLAS_WORKSPACE_CONFIG=:4096:8
source "$here/../e2e/lib.sh"
TEST_NAME=bench_incremental
restore_csv=${csv%.csv}-restore.csv
echo "workload,image,parent,gpu_stored_mib,stored_chunks,referenced_chunks,cpu_files_mib,dump_s,gpu_fingerprinted" > "$csv"
echo "workload,image,chain,restore_s,first_progress_s,continues" > "$restore_csv"
bad=0

# image_row NAME: the CSV fields of $WORK/NAME after its dump.
image_row() {
  "$PHOSCTL" show --json "$WORK/$1" | python3 -c '
import json, sys
m = json.load(sys.stdin)["images"][0]
c = m["chain"][0]
print("%s,%.1f,%d,%d" % ((m.get("parent") or {}).get("path", ""), m["size"]["stored_bytes"] / 2**20,
                         c["stored_chunks"], c["referenced_chunks"]))'
}
# criu's own files of image NAME, in MiB.
cpu_mib() { find "$WORK/$1" -maxdepth 1 -type f ! -name 'phos-*' -printf '%s\n' | awk '{s += $1} END {printf "%.1f", s / 2^20}'; }

# checkpoint WORKLOAD NAME [PARENT]: a leave-running dump into $WORK/NAME,
# against $WORK/PARENT where given; its row into the CSV.
checkpoint() {
  local w=$1 name=$2 parent=${3:-} t0 t1 row gpu
  rm -rf "${WORK:?}/$name" && mkdir -p "$WORK/$name"
  t0=$(now)
  IMG=$WORK/$name PHOS_PARENT_IMAGE=${parent:+../$parent} criu_dump --leave-running ||
    fail "$w, $name: criu dump failed: $(grep -o 'phos: Error: .*' "$WORK/dump.log" | head -n1 | cut -c1-300)"
  t1=$(now)
  # (--protocol-only: no device memory, nothing incremental.)
  if [ -n "$parent" ] && [ -z "$protocol_only" ]; then
    grep -q "incremental dump against parent image ../$parent" "$WORK/dump.log" ||
      fail "$w, $name: the dump was not incremental: $(grep -o 'phos: .*parent image.*' "$WORK/dump.log" | head -n1)"
  fi
  gpu=yes
  grep -q "every chunk's fingerprint taken on the GPU" "$WORK/dump.log" || gpu=no
  row=$(image_row "$name") || fail "$w, $name: phosctl show failed"
  echo "$w,$name,$row,$(cpu_mib "$name"),$(dt "$t0" "$t1"),$gpu" >> "$csv"
  cp "$WORK/dump.log" "${OUT:-/tmp}/bench_incremental.$w.$name.log" 2>/dev/null || true
}
# drop_cpu NAME: criu's files of image NAME removed (its phos files stay
# for the chain).
drop_cpu() { find "$WORK/$1" -maxdepth 1 -type f ! -name 'phos-*' -delete; }

# ---------------------------------------------------------------- server
reqdir=
# ask LINE: one request; its reply's tokens (or error) line on stdout.
ask() {
  rm -f "$reqdir/reply"
  echo "$1" > "$reqdir/request.tmp" && mv "$reqdir/request.tmp" "$reqdir/request"
  local i
  for i in $(seq 12000); do [ -e "$reqdir/reply" ] && break; sleep 0.005; done
  [ -e "$reqdir/reply" ] || return 1
  grep -E '^(tokens|error) ' "$reqdir/reply"
  rm -f "$reqdir/reply"
  # The server removes the request after its reply.
  for i in $(seq 2000); do [ -e "$reqdir/request" ] || break; sleep 0.005; done
}
server_start() {
  reqdir=$WORK/server && rm -rf "$reqdir" && mkdir -p "$reqdir"
  # No file stays open (criu checks the size of an open file at the restore).
  (setsid env LD_PRELOAD="$LIBPHOS" "$python" "$here/llama_server.py" --reqdir "$reqdir" --shape "$server_shape" \
     --kv-cache-gib "$kv_gib" --kv-written-mib -1 --kv-keep $protocol_only </dev/null >/dev/null 2>&1 &)
  for _ in $(seq 1800); do { [ -s "$reqdir/ready" ] || [ -e "$reqdir/error" ]; } && break; sleep 0.1; done
  [ -s "$reqdir/ready" ] || fail "server: did not start: $(tail -n 3 "$reqdir/error" "$reqdir/server.log" 2>/dev/null | tr '\n' ' ')"
  WORKLOAD_PID=$(awk '$1 == "pid" {print $2}' "$reqdir/ready")
  MATCH="^$python $here/llama_server.py --reqdir $reqdir "
}
server_reference=
server_work() {  # server_work K: the requests between checkpoints K-1 and K
  local i reply
  for i in $(seq "$requests"); do
    reply=$(ask "seed=$((1000 * $1 + i)) prompt_len=512 new_tokens=16") || fail "server: no reply before checkpoint $1"
    [[ $reply == tokens* ]] || fail "server: request before checkpoint $1: $reply"
  done
}
# server_continues: "yes", or what differs.
server_continues() {
  local reply
  reply=$(ask "seed=7 prompt_len=64 new_tokens=8") || { echo "no reply"; return; }
  [ "$reply" = "$server_reference" ] && echo yes || echo "reply differs: $reply"
}

# -------------------------------------------------------- lora and train
torch_start() {  # torch_start MODE ARGS...
  rm -f "$WORK/state" "$WORK/state.error" "$WORK/state.steps"
  start_workload --preload "$@"
  wait_counter_above 3 600 || fail "$1: the workload does not run: $(tail -n 2 "$WORK/state.error" 2>/dev/null)"
}
torch_work() {  # torch_work K: --steps steps before checkpoint K
  local at
  at=$(state_counter)
  wait_counter_above $((at + steps - 1)) 120
}
# torch_continues ORIGINAL LINES: after a restore, the 5 steps the restored
# process wrote after line LINES of STATE.steps have the losses the original
# had at those steps (ORIGINAL: its STATE.steps when it was killed): "yes",
# or the first that differs.
torch_continues() {
  local from=$1 lines=$2
  for _ in $(seq 1200); do [ "$(wc -l < "$WORK/state.steps")" -ge $((lines + 5)) ] && break; sleep 0.05; done
  tail -n +"$((lines + 1))" "$WORK/state.steps" | head -n 5 | awk -v orig="$from" '
    BEGIN { while ((getline l < orig) > 0) { split(l, f, " "); if (!(f[1] in loss)) loss[f[1]] = f[4] } }
    { n++
      if (!($1 in loss)) { print "step " $1 " beyond the original'"'"'s"; bad = 1; exit }
      if ($4 != loss[$1]) { print "step " $1 ": loss " $4 ", the original " loss[$1]; bad = 1; exit } }
    END { if (!bad) print n == 5 ? "yes" : "only " n " steps after the restore" }'
}

# ------------------------------------------------------------- each run
# restore_from WORKLOAD NAME CHAIN: the process killed, restored from NAME;
# its row in the restore CSV.
restore_from() {
  local w=$1 name=$2 length=$3 t0 t1 t2 verdict lines=0
  kill -9 "$WORKLOAD_PID" 2>/dev/null || true; wait_pid_free
  [ "$w" = server ] || lines=$(wc -l < "$WORK/state.steps")
  t0=$(now)
  IMG=$WORK/$name criu_restore || fail "$w: restore from $name failed: $(grep -o 'phos: Error: .*' "$WORK/restore.log" | head -n1 | cut -c1-300)"
  t1=$(now)
  cp "$WORK/restore.log" "${OUT:-/tmp}/bench_incremental.$w.restore-$name.log" 2>/dev/null || true
  [ -e "/proc/$WORKLOAD_PID" ] || fail "$w: no process $WORKLOAD_PID after the restore from $name"
  if [ "$w" = server ]; then
    verdict=$(server_continues)
    t2=$(now)
  else
    # Its first step: a line more in STATE.steps (its state file's counter
    # is below the original's last).
    for _ in $(seq 2400); do [ "$(wc -l < "$WORK/state.steps")" -gt "$lines" ] && break; sleep 0.005; done
    t2=$(now)
    verdict=$(torch_continues "$WORK/original.steps" "$lines")
  fi
  [ "$verdict" = yes ] || bad=1
  echo "$w,$name,$length,$(dt "$t0" "$t1"),$(dt "$t0" "$t2"),$verdict" >> "$restore_csv"
  say "$w: restored from $name (a chain of $length) in $(dt "$t0" "$t1") s; continues: $verdict"
}

for w in ${workloads//,/ }; do
  case $w in
    server) server_start
            server_reference=$(ask "seed=7 prompt_len=64 new_tokens=8") || fail "server: no first reply"
            [[ $server_reference == tokens* ]] || fail "server: first reply: $server_reference"
            work=server_work ;;
    lora) MATCH="^$python $here/torch_loop.py $WORK/state"; torch_start lora --gib "$lora_gib"; work=torch_work ;;
    train) MATCH="^$python $here/torch_loop.py $WORK/state"; torch_start train --gib "$train_gib" --width 2048; work=torch_work ;;
  esac
  gpu_gib=-
  [ -n "$protocol_only" ] || gpu_gib=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 | awk '{printf "%.1f", $1 / 1024}')
  echo "$w,gpu_used_gib,$gpu_gib,,,,,," >> "$csv"
  say "$w: $gpu_gib GiB of device memory in use"
  parent=
  for k in $(seq "$dumps"); do
    $work "$k"
    checkpoint "$w" "img$k" "$parent"
    [ -n "$parent" ] && [ "$parent" != "img$chain" ] && drop_cpu "$parent"
    parent=img$k
    if [ "$k" = "$chain" ]; then
      checkpoint "$w" full$chain
    fi
  done
  [ "img$dumps" != "img$chain" ] && drop_cpu "img$dumps"
  # The original's steps, to compare the restored process's with (it runs
  # on until restore_from kills it: later steps are never compared).
  [ "$w" = server ] || cp "$WORK/state.steps" "$WORK/original.steps"
  restore_from "$w" "img$chain" "$chain"
  restore_from "$w" "full$chain" 1
  kill -9 "$WORKLOAD_PID" 2>/dev/null || true; wait_pid_free
  for k in $(seq "$dumps"); do rm -rf "${WORK:?}/img$k"; done
  rm -rf "${WORK:?}/full$chain"
done

echo "## incremental images: $dumps leave-running checkpoints, each against the one before, against a full image"
echo "GPU data: what phos stores (an incremental image references its parent's unchanged chunks: size, CRC-32C and 64-bit fingerprint equal); criu's files: its CPU pages etc., dumped whole each time (no soft-dirty tracking on this host)"
echo "| workload | device memory | full image: GPU data | incremental images 2..$dumps: GPU data, median (min-max) | of the full image | the $((dumps - 1)) incremental images summed, against as many full | criu's files per image | dump, full / incremental (median) | fingerprints on the GPU |"
echo "|---|---|---|---|---|---|---|---|---|"
awk -F, -v chain="$chain" -v dumps="$dumps" '
  function sorted_median(list, n,   v, i, j, t) {
    n = split(list, v, " ")
    for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
    return v[int((n + 1) / 2)] " " v[1] " " v[n]
  }
  NR == 1 { next }
  $2 == "gpu_used_gib" { order[++k] = $1; mem[$1] = $3; next }
  $2 == ("full" chain) { full[$1] = $4; fulldump[$1] = $8; cpu[$1] = $7 }
  $2 != "img1" && $2 ~ /^img/ { inc[$1] = inc[$1] " " $4; sum[$1] += $4; n[$1]++; incdump[$1] = incdump[$1] " " $8 }
  $2 ~ /^img|^full/ && $9 != "yes" { gpu_no[$1]++ }
  $2 ~ /^img|^full/ { total[$1]++ }
  END {
    for (i = 1; i <= k; i++) {
      w = order[i]
      split(sorted_median(inc[w]), m, " "); split(sorted_median(incdump[w]), d, " ")
      printf "| %s | %s GiB | %s MiB | %s MiB (%s-%s) | %.1f%% | %.0f MiB against %.0f MiB (%.1f%%) | %s MiB | %s s / %s s | %d of %d dumps |\n",
        w, mem[w], full[w], m[1], m[2], m[3], full[w] ? 100 * m[1] / full[w] : 0, sum[w], n[w] * full[w],
        full[w] ? 100 * sum[w] / (n[w] * full[w]) : 0, cpu[w], fulldump[w], d[1], total[w] - gpu_no[w], total[w]
    }
  }' "$csv"
echo
echo "## restore: from img$chain (a chain of $chain images) against the full image taken right after it"
echo "restore: criu restore -d until it returns; first progress: until the restored process answered a request (server) or wrote a step"
echo "| workload | image | chain | restore | first progress | continues as the original did |"
echo "|---|---|---|---|---|---|"
awk -F, 'NR > 1 {printf "| %s | %s | %s | %s s | %s s | %s |\n", $1, $2, $3, $4, $5, $6}' "$restore_csv"
echo
echo "CSV: $csv, $restore_csv"
exit "$bad"
