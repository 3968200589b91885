#!/usr/bin/env bash
# The GPU suite, on a GPU host, from bundle/ (test/gpu/make-bundle.sh): every
# case runs natively and with libphos.so and prints one line
#   gpu: CASE: PASS|FAIL|SKIP  details
# Results must be identical with and without phos; phos's counters must match
# the program's own counts and CUPTI's / the PyTorch profiler's; the agent's
# round trip (gate closed, device memory unmapped and mapped back, gate open)
# in the middle of a run must not change any result.
# usage: suite.sh [CASE...]  (default: all but multi_gpu; logs in $OUT or /tmp)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/run-on-host.sh" >/dev/null
bin=$PHOS_BUNDLE/gpu
log=${OUT:-/tmp}/gpu-suite
mkdir -p "$log"
libphos=$PHOS_BUILD/cuda_hooks/libphos.so
tool=$PHOS_BUILD/test/hooks/phos-agent-tool
export PHOS_PHOSCTL_BIN=$PHOS_BUILD/plugin/phosctl
passed=0 failed=0
line() {  # line CASE STATUS DETAILS
  echo "gpu: $1: $2  $3"
  case $2 in PASS) passed=$((passed + 1)) ;; FAIL) failed=$((failed + 1)) ;; esac
}
stat_of() { awk -v k="$2" '$1 == k {print $2}' "$1"; }
field() { grep -o "$2=[^ ]*" <<<"$1" | head -n1 | cut -d= -f2; }

# run NAME CMD...: natively, then with libphos.so (stats in $log/NAME.stats)
run_pair() {
  local name=$1; shift
  "$@" > "$log/$name.native" 2>&1; native_rc=$?
  PHOS_STATS_FILE=$log/$name.stats LD_PRELOAD=$libphos "$@" > "$log/$name.phos" 2>&1; phos_rc=$?
  native_out=$(cat "$log/$name.native"); phos_out=$(cat "$log/$name.phos")
}

# roundtrip NAME [--release-handles] CMD...: with libphos.so; once the program
# says it is ready, the agent round trip runs while it works.
roundtrip() {
  local name=$1 mode=$2; shift 2
  local ready=$log/$name.ready
  rm -f "$ready"
  LD_PRELOAD=$libphos "$@" --ready "$ready" > "$log/$name.phos" 2>&1 &
  local pid=$!
  for _ in $(seq 600); do [ -e "$ready" ] && break; sleep 0.1; done
  if [ "$name" = "${name#driver_roundtrip}" ]; then "$tool" roundtrip "$pid" $mode > "$log/$name.tool" 2>&1
  else "$tool" driver-roundtrip "$pid" > "$log/$name.tool" 2>&1; fi
  tool_rc=$?
  wait "$pid"; phos_rc=$?
  phos_out=$(cat "$log/$name.phos")
}

case_cuda_basic() {
  run_pair cuda_basic "$bin/cuda_basic" 40
  local s=$log/cuda_basic.stats counts; counts=$(grep '^counts' <<<"$native_out")
  local own_l own_a own_f cupti
  own_l=$(field "$counts" launches); own_a=$(field "$counts" allocations); own_f=$(field "$counts" frees)
  cupti=$(field "$counts" cupti_kernels)
  local mem_native mem_phos
  mem_native=$(field "$(grep '^memory' <<<"$native_out")" used_after_setup)
  mem_phos=$(field "$(grep '^memory' <<<"$phos_out")" used_after_setup)
  local detail="launches own=$own_l phos=$(stat_of "$s" launches) cupti=$cupti; allocations own=$own_a phos=$(stat_of "$s" allocations); frees own=$own_f phos=$(stat_of "$s" frees); device memory in use native $((mem_native >> 20)) MiB, phos $((mem_phos >> 20)) MiB ($(awk -v a="$mem_native" -v b="$mem_phos" 'BEGIN {printf "%+.1f%%", (b / a - 1) * 100}'))"
  if [ $native_rc -eq 0 ] && [ $phos_rc -eq 0 ] && [ "$(grep checksum <<<"$native_out")" = "$(grep checksum <<<"$phos_out")" ] &&
     [ "$own_l" = "$(stat_of "$s" launches)" ] && [ "$own_l" = "$cupti" ] && [ "$own_a" = "$(stat_of "$s" allocations)" ] &&
     [ "$own_f" = "$(stat_of "$s" frees)" ]; then
    line cuda_basic PASS "same checksum; $detail"
  else line cuda_basic FAIL "rc $native_rc/$phos_rc; $detail; native: $(tail -n2 <<<"$native_out" | tr '\n' ' '); phos: $(tail -n2 <<<"$phos_out" | tr '\n' ' ')"; fi
  reference_cuda=$(grep checksum <<<"$native_out")
}

case_cuda_roundtrip() {
  local mode
  for mode in "" --release-handles; do
    local name=cuda_roundtrip${mode:+_release}
    roundtrip "$name" "$mode" "$bin/cuda_basic" 40 --pace-ms 25
    if [ $tool_rc -eq 0 ] && [ $phos_rc -eq 0 ] && [ "$(grep checksum <<<"$phos_out")" = "$reference_cuda" ]; then
      line "$name" PASS "checksum unchanged; $(grep '^roundtrip' "$log/$name.tool"); $(tail -n1 "$log/$name.tool")"
    else line "$name" FAIL "tool rc $tool_rc: $(tr '\n' ' ' < "$log/$name.tool"); program rc $phos_rc: $(tail -n3 <<<"$phos_out" | tr '\n' ' ')"; fi
  done
}

# The launch record: every launch recorded, each kernel with its name and the
# parameter layout the driver reports (fill(uint32_t*, size_t, uint32_t) is
# 0:8,8:8,16:4).
case_launch_record() {
  PHOS_RECORD_LAUNCHES=1 PHOS_STATS_FILE=$log/record.stats LD_PRELOAD=$libphos "$bin/cuda_basic" 10 > "$log/record.phos" 2>&1
  local rc=$? s=$log/record.stats
  local recorded launches summed fill copies sets example
  # The ring's records ("record SEQ KIND NAME ... ACCESS:0xADDR+BYTES") and
  # the per-kernel lines ("kernel NAME COUNT module=N params=...").
  recorded=$(awk '$1 == "record" && $3 == "kernel"' "$s" | wc -l); launches=$(stat_of "$s" launches)
  copies=$(awk '$1 == "record" && $3 == "copy"' "$s" | wc -l); sets=$(awk '$1 == "record" && $3 == "set"' "$s" | wc -l)
  example=$(awk '$1 == "record" && $3 == "copy" {print; exit}' "$s" | cut -d' ' -f3-)
  summed=$(awk '$1 == "kernel" {n += $3} END {print n + 0}' "$s")
  fill=$(awk '$1 == "kernel" && $2 ~ /fill/ {print $5}' "$s")
  local kernels; kernels=$(awk '$1 == "kernel" {printf "%s x%s %s %s; ", $2, $3, $4, $5}' "$s")
  if [ $rc -eq 0 ] && [ -n "$launches" ] && [ "$recorded" = "$launches" ] && [ "$summed" = "$launches" ] &&
     [ "$fill" = "params=0:8,8:8,16:4" ] && [ "$copies" -gt 0 ] && [ "$sets" -gt 0 ]; then
    line launch_record PASS "$recorded of $launches launches recorded, and $copies copies and $sets memsets with their ranges (e.g. '$example'); $kernels"
  else line launch_record FAIL "rc $rc; recorded=$recorded launches=$launches per-kernel sum=$summed copies=$copies sets=$sets; $kernels"; fi
}

case_cuda_graph() {
  run_pair cuda_graph "$bin/cuda_graph" 200
  local s=$log/cuda_graph.stats counts own cupti phos
  counts=$(grep '^counts' <<<"$native_out"); own=$(field "$counts" own_kernels); cupti=$(field "$counts" cupti_kernels)
  phos=$(( $(stat_of "$s" launches) + $(stat_of "$s" graph_kernels) ))
  local detail="kernels own=$own cupti=$cupti phos=$phos (graph launches $(stat_of "$s" graph_launches))"
  if [ $native_rc -eq 0 ] && [ $phos_rc -eq 0 ] && [ "$(grep checksum <<<"$native_out")" = "$(grep checksum <<<"$phos_out")" ] &&
     [ "$own" = "$cupti" ] && [ "$phos" = "$cupti" ]; then
    line cuda_graph PASS "same checksum; $detail"
  else line cuda_graph FAIL "rc $native_rc/$phos_rc; $detail; native: $(tr '\n' ' ' <<<"$native_out"); phos: $(tr '\n' ' ' <<<"$phos_out")"; fi
  local reference; reference=$(grep checksum <<<"$native_out")
  roundtrip cuda_graph_roundtrip --release-handles "$bin/cuda_graph" 200 --pace-ms 2
  if [ $tool_rc -eq 0 ] && [ $phos_rc -eq 0 ] && [ "$(grep checksum <<<"$phos_out")" = "$reference" ]; then
    line cuda_graph_roundtrip PASS "graphs replayed across the round trip, checksum unchanged; $(grep '^roundtrip' "$log/cuda_graph_roundtrip.tool")"
  else line cuda_graph_roundtrip FAIL "tool rc $tool_rc: $(grep -v '^allocation' "$log/cuda_graph_roundtrip.tool" | tr '\n' ' '); rc $phos_rc: $(tr '\n' ' ' <<<"$phos_out")"; fi
}

# The plugin's dump/restore sequence without CRIU or data copies: gate
# closed, device memory dropped (held as fds), the driver's checkpoint and
# restore of the process, memory re-imported at the same addresses.
case_driver_roundtrip() {
  export GPU_CHECK_NO_CUPTI=1
  local cref; cref=$("$bin/cuda_basic" 40 | grep checksum)
  roundtrip driver_roundtrip_cuda "" "$bin/cuda_basic" 40 --pace-ms 25
  if [ $tool_rc -eq 0 ] && [ $phos_rc -eq 0 ] && [ "$(grep checksum <<<"$phos_out")" = "$cref" ]; then
    line driver_roundtrip_cuda PASS "checksum unchanged; $(grep '^roundtrip' "$log/driver_roundtrip_cuda.tool")"
  else line driver_roundtrip_cuda FAIL "tool rc $tool_rc: $(grep -v '^allocation' "$log/driver_roundtrip_cuda.tool" | tr '\n' ' '); rc $phos_rc: $(tr '\n' ' ' <<<"$phos_out")"; fi
  local ref; ref=$(python3 "$here/torch_workloads.py" mlp --steps 80 2>/dev/null | grep '^result')
  roundtrip driver_roundtrip_torch "" python3 "$here/torch_workloads.py" mlp --steps 80 --pace-ms 20
  if [ $tool_rc -eq 0 ] && [ $phos_rc -eq 0 ] && [ -n "$ref" ] && [ "$(grep '^result' <<<"$phos_out")" = "$ref" ]; then
    line driver_roundtrip_torch PASS "loss curve identical; $(grep '^roundtrip' "$log/driver_roundtrip_torch.tool")"
  else line driver_roundtrip_torch FAIL "tool rc $tool_rc: $(grep -v '^allocation' "$log/driver_roundtrip_torch.tool" | tr '\n' ' '); rc $phos_rc; ref $ref; got $(grep -E '^result|Error' <<<"$phos_out" | head -n2 | tr '\n' ' ')"; fi
  unset GPU_CHECK_NO_CUPTI
}

case_cublas() {
  run_pair cublas "$bin/cublas_gemm"
  local cupti phos; cupti=$(field "$(grep '^counts' <<<"$native_out")" cupti_kernels); phos=$(stat_of "$log/cublas.stats" launches)
  if [ $native_rc -eq 0 ] && [ $phos_rc -eq 0 ] && [ "$(grep checksum <<<"$native_out")" = "$(grep checksum <<<"$phos_out")" ] && [ "$cupti" = "$phos" ]; then
    line cublas PASS "same checksum; kernels cupti=$cupti phos=$phos; allocations phos=$(stat_of "$log/cublas.stats" allocations)"
  else line cublas FAIL "rc $native_rc/$phos_rc; kernels cupti=$cupti phos=$phos; native: $(tail -n2 <<<"$native_out" | tr '\n' ' '); phos: $(tail -n2 <<<"$phos_out" | tr '\n' ' ')"; fi
}

case_multi_gpu() {
  run_pair multi_gpu "$bin/multi_gpu"
  if [ $native_rc -eq 77 ]; then line multi_gpu SKIP "$native_out"; return; fi
  if [ $native_rc -eq 0 ] && [ $phos_rc -eq 0 ] && [ "$native_out" = "$phos_out" ]; then
    line multi_gpu PASS "$phos_out; allocations phos=$(stat_of "$log/multi_gpu.stats" allocations)"
  else line multi_gpu FAIL "rc $native_rc/$phos_rc; native: $native_out; phos: $phos_out"; fi
  local reference=$native_out
  roundtrip multi_gpu_roundtrip --release-handles "$bin/multi_gpu"
  if [ $tool_rc -eq 0 ] && [ $phos_rc -eq 0 ] && [ "$phos_out" = "$reference" ]; then
    line multi_gpu_roundtrip PASS "all devices' memory dropped and mapped back, checksum unchanged; $(grep '^roundtrip' "$log/multi_gpu_roundtrip.tool")"
  else line multi_gpu_roundtrip FAIL "tool rc $tool_rc: $(grep -v '^allocation' "$log/multi_gpu_roundtrip.tool" | tr '\n' ' '); rc $phos_rc: $phos_out"; fi
}

torch_case() {  # torch_case NAME MODE [ENV=VALUE]
  local name=$1 mode=$2; shift 2
  run_pair "$name" env "$@" PHOS_PHOSCTL=$PHOS_PHOSCTL_BIN python3 "$here/torch_workloads.py" "$mode"
  local nres pres counts; nres=$(grep '^result' <<<"$native_out"); pres=$(grep '^result' <<<"$phos_out")
  counts=$(grep '^counts' <<<"$phos_out")
  local pl pk; pl=$(field "$counts" phos_launches); pk=$(field "$counts" profiler_kernels)
  local detail="kernels profiler=$pk phos=$pl; allocations phos=$(stat_of "$log/$name.stats" allocations); step native $(field "$(grep '^time' <<<"$native_out")" step_ms) ms, phos $(field "$(grep '^time' <<<"$phos_out")" step_ms) ms"
  if [ $native_rc -eq 0 ] && [ $phos_rc -eq 0 ] && [ -n "$nres" ] && [ "$nres" = "$pres" ] && [ -n "$pl" ] && [ "$pl" = "$pk" ]; then
    line "$name" PASS "identical: $pres; $detail"
  else line "$name" FAIL "rc $native_rc/$phos_rc; native: $nres; phos: $pres; $detail; $(grep -iE 'error|Traceback' "$log/$name.phos" | head -n3 | tr '\n' ' ')"; fi
  eval "reference_$mode=\$nres"
}
case_torch_mlp() { torch_case torch_mlp mlp; }
case_torch_expandable() {
  torch_case torch_mlp_expandable mlp PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  local creates; creates=$(stat_of "$log/torch_mlp_expandable.stats" user_vmm_creates)
  if [ "${creates:-0}" -gt 0 ]; then line torch_expandable_owned PASS "PyTorch's own cuMemCreate calls seen and tracked: $creates"
  else line torch_expandable_owned FAIL "no cuMemCreate of PyTorch was seen (user_vmm_creates=${creates:-none})"; fi
}
case_torch_compile() { torch_case torch_compile compile; }
case_torch_conv() { torch_case torch_conv conv; }

# torch_roundtrip_case NAME [ENV=VALUE]: the round trip in the middle of
# training, memory dropped and re-imported from fds; the loss curve must be
# the one of an uninterrupted native run.
torch_roundtrip_case() {
  local name=$1; shift
  roundtrip "$name" --release-handles env "$@" python3 "$here/torch_workloads.py" mlp --steps 80 --pace-ms 20
  local ref; ref=$(env "$@" python3 "$here/torch_workloads.py" mlp --steps 80 2>/dev/null | grep '^result')
  if [ $tool_rc -eq 0 ] && [ $phos_rc -eq 0 ] && [ -n "$ref" ] && [ "$(grep '^result' <<<"$phos_out")" = "$ref" ]; then
    line "$name" PASS "loss curve identical to an uninterrupted run; $(grep '^roundtrip' "$log/$name.tool")"
  else line "$name" FAIL "tool rc $tool_rc: $(tr '\n' ' ' < "$log/$name.tool"); rc $phos_rc; ref: $ref; got: $(grep -E '^result|Error' <<<"$phos_out" | head -n2 | tr '\n' ' ')"; fi
}
case_torch_roundtrip() { torch_roundtrip_case torch_roundtrip; }
case_torch_roundtrip_expandable() {
  torch_roundtrip_case torch_roundtrip_expandable PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
}

# Speculation on every workload: with PHOS_SPECULATE=1
# the results must not change; the line says how many kernels and launches
# there were, the share of launches whose read/write sets were exact (copies,
# memsets, cuBLAS/NCCL calls and the kernels they issue), speculated or
# unknown, where kernels' parameter types came from, and the buffer index's
# lookup rate over the process's live buffers at exit.
spec_line() {  # spec_line NAME RC REFERENCE-RESULT RESULT STATS
  local name=$1 rc=$2 ref=$3 got=$4 stats=$5 t
  t=$(grep '^speculation ' "$stats" 2>/dev/null)
  local types; types=$(grep -o ' types=[a-z]*' "$stats" 2>/dev/null | sort | uniq -c |
    awk '{sep = (NR > 1) ? ", " : ""; printf "%s%s %d", sep, substr($2, 7), $1}')
  local unknown_kernels; unknown_kernels=$(awk '/^speculated / {for (i = 3; i <= NF; i++) if ($i ~ /^unknown=/) {split($i, a, "="); if (a[2] > 0) print a[2], $2}}' "$stats" 2>/dev/null |
    sort -rn | head -n3 | awk '{sep = (NR > 1) ? " " : ""; printf "%s%s(%s)", sep, substr($2, 1, 60), $1}')
  # Kernels whose layout sources disagreed (driver, cubin, name, database).
  local notes; notes=$(grep -c ' note=' "$stats" 2>/dev/null)
  local first_note; first_note=$(grep -m1 -o ' note=.*' "$stats" 2>/dev/null | cut -c7-100)
  local detail
  detail=$(awk -v t="$t" -v types="$types" -v unk="$unknown_kernels" 'BEGIN {
    n = split(t, f, " "); for (i = 2; i <= n; i++) {split(f[i], kv, "="); v[kv[1]] = kv[2]}
    all = v["launches"] + v["calls"]; if (all == 0) all = 1
    printf "kernels %d, launches %d + calls %d: exact %.1f%%, speculated %.1f%%, unknown %.1f%%; buffers per speculated launch %.2f; types: %s; index %d buffers, %.1f M lookups/s%s",
      v["kernels"], v["launches"], v["calls"], (v["exact"] + v["calls_exact"]) * 100 / all, v["speculated"] * 100 / all,
      (v["unknown"] + v["calls_unknown"]) * 100 / all, v["speculated"] ? v["buffers"] / (v["speculated"] + v["calls_exact"]) : 0,
      types, v["indexed"], v["lookup_rate"] / 1e6, (unk != "") ? "; unknown most: " unk : "" }')
  local checked; checked=$(grep -o ' cubin_checked=[0-9]*' <<<"$t" | cut -d= -f2)
  local analysis; analysis=$(awk '{for (i = 1; i <= NF; i++) {split($i, kv, "="); v[kv[1]] = kv[2]}} END {printf "%s ms, at most %s ms for one kernel", v["analysis_ms"], v["analysis_max_ms"]}' <<<"$t")
  detail="$detail; layouts checked against the cubin: ${checked:-0}, disagreements: ${notes:-0}${first_note:+ (e.g. $first_note)}; analysis $analysis"
  if [ "$rc" -eq 0 ] && [ -n "$t" ] && [ -n "$ref" ] && [ "$ref" = "$got" ]; then line "speculation_$name" PASS "same result; $detail"
  else line "speculation_$name" FAIL "rc $rc; reference: $ref; got: $got; $detail"; fi
}
spec_run() {  # spec_run NAME RESULT-PATTERN CMD...
  local name=$1 pattern=$2; shift 2
  local ref; ref=$("$@" 2>/dev/null | grep -E "$pattern")
  PHOS_SPECULATE=1 PHOS_SIGDB=$bin/suite.sigdb PHOS_STATS_FILE=$log/speculation_$name.stats LD_PRELOAD=$libphos "$@" \
    > "$log/speculation_$name.out" 2>&1
  local rc=$?
  spec_line "$name" $rc "$ref" "$(grep -E "$pattern" "$log/speculation_$name.out")" "$log/speculation_$name.stats"
}
case_speculation() {
  spec_run cuda_basic checksum "$bin/cuda_basic" 40
  spec_run cublas checksum "$bin/cublas_gemm"
  spec_run cuda_graph checksum "$bin/cuda_graph" 200
  spec_run torch_mlp '^result' python3 "$here/torch_workloads.py" mlp
  spec_run torch_compile '^result' python3 "$here/torch_workloads.py" compile
  spec_run torch_conv '^result' python3 "$here/torch_workloads.py" conv
  # The fatbin reader on the host's real libraries: PyTorch's and cuBLAS's.
  local torch_lib lib
  torch_lib=$(python3 -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib"))' 2>/dev/null)
  for lib in "$torch_lib/libtorch_cuda.so" $(find /usr/local/lib/python3* /usr/lib/python3* -name 'libcublasLt.so.*' 2>/dev/null | head -n1); do
    [ -f "$lib" ] || continue
    "$PHOS_BUILD/speculation/tools/phos-fatbin-info" "$lib" --arch 90 > "$log/fatbin_$(basename "$lib").txt" 2>&1
    local rc=$?
    if [ $rc -eq 0 ]; then line "fatbins_$(basename "$lib")" PASS "$(head -n1 "$log/fatbin_$(basename "$lib").txt" | sed 's/^[^:]*: //'); $(tail -n1 "$log/fatbin_$(basename "$lib").txt")"
    else line "fatbins_$(basename "$lib")" FAIL "rc $rc: $(tail -n2 "$log/fatbin_$(basename "$lib").txt" | tr '\n' ' ')"; fi
  done
  if [ -x "$PHOS_BUILD/test/bench/phos-speculation-bench" ]; then
    "$PHOS_BUILD/test/bench/phos-speculation-bench" | sed 's/^/gpu: bench: /'
  fi
}

# PTX twins (validated speculation): planted mis-speculations must be caught.
case_ptx_twins() {
  "$bin/ptx_twin_check" "$bin" > "$log/ptx_twins.out" 2>&1
  local rc=$? ok; ok=$(grep -c '^ok' "$log/ptx_twins.out")
  if [ $rc -eq 0 ] && grep -qx 'ALL OK' "$log/ptx_twins.out"; then
    line ptx_twins PASS "$ok checks: $(grep -E '^  ' "$log/ptx_twins.out" | tr -s ' ' | tr '\n' ';')"
  else line ptx_twins FAIL "rc $rc: $(grep -E 'FAIL' "$log/ptx_twins.out" | head -n4 | tr '\n' ' ')"; fi
}

# Validation (PHOS_VALIDATE): the planted mis-speculations are caught with
# the right buffer by the PTX twins (=ptx) and by the SASS-level validator
# (=sass), and the suite's workloads, validated by both (=1: twins where
# there is PTX, patched modules for the rest), give the same results and no
# violation (no false alarm).
val_stats() {  # val_stats STATS: the totals, briefly
  awk '/^validation / || /^speculation / {for (i = 2; i <= NF; i++) {split($i, kv, "="); v[kv[1]] = kv[2]}}
       /^validated / {for (i = 3; i <= NF; i++) {split($i, kv, "="); f[kv[1]] = kv[2]}
                      if (f["via"] == "sass") {sass += f["launches"]; sk++} else if (f["via"] == "ptx") {ptx += f["launches"]; pk++}
                      delete f}
       END {printf "validated launches %d (twins %d of %d kernels, SASS %d of %d kernels), violations %d; twins %d (incomplete %d) built in %s ms (at most %s; %s modules in the background, a first launch waited at most %s ms for twins); SASS %s, %d modules patched in %s ms (at most %s); first-launch analysis at most %s ms (%s)",
              v["validated"], ptx, pk, sass, sk, v["violations"], v["twins"], v["incomplete"], v["twin_build_ms"],
              v["twin_build_max_ms"], v["twin_background_builds"], v["first_launch_wait_max_ms"], v["sass"], v["sass_modules"], v["sass_patch_ms"], v["sass_patch_max_ms"],
              v["analysis_max_ms"], v["analysis_max_parts"]}' "$1"
}
case_sanitizer_abi() {
  local san=${CUDA_HOME:-/usr/local/cuda}/compute-sanitizer src=$here/../..
  if g++ -std=c++20 -fsyntax-only -I"$san/include" -I"${CUDA_HOME:-/usr/local/cuda}/include" -I"$src/cuda_hooks/include" -I"$src/support/include" \
       -I"$src/images/include" "$here/sanitizer_abi_check.cc" > "$log/sanitizer_abi.out" 2>&1; then
    line sanitizer_abi PASS "phos's Sanitizer API declarations and patch signatures agree with $san/include/sanitizer.h"
  else line sanitizer_abi FAIL "$(head -c 600 "$log/sanitizer_abi.out")"; fi
}
planted_case() {  # planted_case VALIDATE KERNEL...: each KERNEL caught, first write in the victim
  local mode=$1; shift
  local s=$log/validation_planted_$mode.stats out=$log/validation_planted_$mode.out
  PHOS_VALIDATE=$mode PHOS_STATS_FILE=$s LD_PRELOAD=$libphos "$bin/planted" > "$out" 2>&1
  local rc=$? victim size ok=1 k caught=()
  read -r _ victim size < <(grep '^victim' "$out")
  for k in "$@"; do
    local l first; l=$(grep "^validated _Z[0-9]*${k}" "$s")
    first=$(grep -o 'first=0x[0-9a-f]*' <<<"$l" | cut -d= -f2)
    if ! grep -q 'violations=64 ' <<<"$l" || [ -z "$first" ] || [ $((first)) -lt $((victim)) ] || [ $((first)) -ge $((victim + size)) ]; then
      ok=0; echo "gpu: validation: $mode: $k: $l (victim $victim)"
    else caught+=("$k ($(grep -o 'via=[a-z]*' <<<"$l"))"); fi
  done
  grep -q "^validated _Z6honestPKfPf launches=1 violations=0 " "$s" || { ok=0; echo "gpu: validation: honest: $(grep honest "$s")"; }
  if [ $rc -eq 0 ] && [ $ok = 1 ] && grep -qx 'checksum 2240.0' "$out"; then
    line "validation_planted_$mode" PASS "64 violations each, first in the victim buffer: ${caught[*]}; honest kernel: none; results unchanged; $(val_stats "$s")$(grep -o '^validated _Z14through_globalf.*skipped=.*' "$s" | sed 's/^validated /; not validated: /')"
  else line "validation_planted_$mode" FAIL "rc $rc; $(tr '\n' ' ' < "$out"); $(grep '^validat' "$s" | tr '\n' '|')"; fi
}
case_validation() {
  planted_case ptx through_device_pointer through_struct_in_memory
  planted_case sass through_device_pointer through_struct_in_memory through_global
  planted_case 1 through_device_pointer through_struct_in_memory through_global
  local name
  for name in cuda_basic cublas torch_mlp torch_compile torch_conv; do
    local ref got vrc
    case $name in
      cuda_basic) set -- checksum "$bin/cuda_basic" 40 ;;
      cublas) set -- checksum "$bin/cublas_gemm" ;;
      *) set -- '^result' python3 "$here/torch_workloads.py" "${name#torch_}" ;;
    esac
    local pattern=$1; shift
    # CUPTI and the Sanitizer API cannot both attach to a process (CUPTI
    # error 39): the programs' own CUPTI count is off in both runs.
    ref=$(GPU_CHECK_NO_CUPTI=1 "$@" 2>/dev/null | grep -E "$pattern")
    GPU_CHECK_NO_CUPTI=1 PHOS_VALIDATE=1 PHOS_STATS_FILE=$log/validation_$name.stats LD_PRELOAD=$libphos "$@" > "$log/validation_$name.out" 2>&1
    vrc=$?
    got=$(grep -E "$pattern" "$log/validation_$name.out")
    local violations; violations=$(grep -o '^validation .* violations=[0-9]*' "$log/validation_$name.stats" | grep -o '[0-9]*$')
    if [ $vrc -eq 0 ] && [ -n "$ref" ] && [ "$ref" = "$got" ] && [ "${violations:-x}" = 0 ]; then
      line "validation_$name" PASS "same result, no violation; $(val_stats "$log/validation_$name.stats")"
    else line "validation_$name" FAIL "rc $vrc; ref $ref; got $got; $(val_stats "$log/validation_$name.stats"); $(grep '^validated' "$log/validation_$name.stats" | grep -v 'violations=0 ' | head -n5 | tr '\n' '|'); $(grep -i 'error\|phos:' "$log/validation_$name.out" | head -n3 | tr '\n' ' ')"; fi
  done
}

# Validation switched off and on in a running PyTorch training run
# (phosctl validate): off unpatches the patched modules, on patches them
# again at their next validated launch; the result must not change.
case_validation_switch() {
  local s=$log/validation_switch.stats ready=$log/validation_switch.ready ref
  rm -f "$ready"
  ref=$(python3 "$here/torch_workloads.py" mlp --steps 80 2>/dev/null | grep '^result')
  PHOS_VALIDATE=1 PHOS_STATS_FILE=$s LD_PRELOAD=$libphos python3 "$here/torch_workloads.py" mlp --steps 80 --pace-ms 20 \
    --ready "$ready" > "$log/validation_switch.out" 2>&1 &
  local pid=$! ctl_rc=0
  for _ in $(seq 600); do [ -e "$ready" ] && break; sleep 0.1; done
  sleep 0.3
  { "$PHOS_PHOSCTL_BIN" validate "$pid" off && sleep 0.4 && "$PHOS_PHOSCTL_BIN" validate "$pid" on; } > "$log/validation_switch.ctl" 2>&1 || ctl_rc=$?
  wait "$pid"; local rc=$?
  local violations; violations=$(grep -o '^validation .* violations=[0-9]*' "$s" | grep -o '[0-9]*$')
  if [ $rc -eq 0 ] && [ $ctl_rc -eq 0 ] && [ "$(grep '^result' "$log/validation_switch.out")" = "$ref" ] && [ "${violations:-x}" = 0 ]; then
    line validation_switch PASS "$(tr '\n' ';' < "$log/validation_switch.ctl") same result, no violation; $(val_stats "$s") (modules patched counts each patching: once before off, again after on)"
  else line validation_switch FAIL "rc $rc ctl $ctl_rc: $(tr '\n' ' ' < "$log/validation_switch.ctl"); $(grep -E '^result|Error' "$log/validation_switch.out" | head -n3 | tr '\n' ' '); $(val_stats "$s")"; fi
}

# What validation costs while on: the PyTorch
# MLP and torch.compile steps and cuda_basic's run time, native, with
# libphos.so speculating, validating with twins only, and with twins and
# the SASS-level validator; median of PHOS_BENCH_RUNS (5) alternating runs.
case_bench_validation() {
  local r runs=${PHOS_BENCH_RUNS:-5} mode
  local modes="native speculate ptx sass"
  for mode in $modes; do : > "$log/bench_val.$mode"; done
  for r in $(seq "$runs"); do
    for mode in $modes; do
      local envs=()
      case $mode in
        speculate) envs=(LD_PRELOAD=$libphos PHOS_SPECULATE=1) ;;
        ptx) envs=(LD_PRELOAD=$libphos PHOS_VALIDATE=ptx) ;;
        sass) envs=(LD_PRELOAD=$libphos PHOS_VALIDATE=1) ;;
      esac
      env "${envs[@]}" python3 "$here/torch_workloads.py" mlp --steps 300 | awk '/^time/ {split($2, a, "="); print "bench mlp_step_ms", a[2]}' >> "$log/bench_val.$mode"
      env "${envs[@]}" python3 "$here/torch_workloads.py" compile --steps 300 | awk '/^time/ {split($2, a, "="); print "bench compile_step_ms", a[2]}' >> "$log/bench_val.$mode"
      local t0; t0=$(date +%s.%N)
      env "${envs[@]}" GPU_CHECK_NO_CUPTI=1 "$bin/cuda_basic" 40 > /dev/null
      awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "bench cuda_basic_s %.4f\n", b - a}' >> "$log/bench_val.$mode"
    done
  done
  echo "gpu: bench: validation cost, median [min-max] of $runs alternating runs: native | speculating | validating with twins | with twins and SASS"
  join <(spread "$log/bench_val.native") <(spread "$log/bench_val.speculate") | join - <(spread "$log/bench_val.ptx") |
    join - <(spread "$log/bench_val.sass") |
    awk '{printf "gpu: bench:   %-18s %9.4f [%s] | %9.4f [%s] %+6.1f%% | %9.4f [%s] %+6.1f%% | %9.4f [%s] %+7.1f%%\n", $1, $2, $3, $4, $5, ($4 / $2 - 1) * 100, $6, $7, ($6 / $2 - 1) * 100, $8, $9, ($8 / $2 - 1) * 100}'
}

# Alternating runs, median of each figure (one run is within noise), with
# each feature on: recording, speculating, validating with PTX twins (built
# in the background, and with PHOS_TWIN_BUILD=launch at the first launch),
# with twins and the SASS patch (PHOS_VALIDATE=1); the validating runs with
# the driver's JIT cache off, so every twin module is compiled as on a
# fresh host. The first launches and the
# worst single launch show the hidden stalls a feature adds once per kernel;
# the last validating run's statistics say where a first launch's analysis
# went (lock, cubin metadata, layout). With PHOS_BENCH_BASELINE_LIB=another
# libphos.so (the build before a change), that one too, with nothing on.
# "cycles": libphos.so with the call counter on (PHOS_CALL_CYCLES=on), the
# counter's own cost per call being its difference to "phos".
case_bench() {
  local r cfg cfgs="native phos record speculate ptx ptx_at_launch sass cycles"
  [ -n "${PHOS_BENCH_BASELINE_LIB:-}" ] && cfgs="$cfgs before"
  for cfg in $cfgs; do : > "$log/bench.$cfg"; done
  for r in 1 2 3 4 5; do
    for cfg in $cfgs; do
      local envs=()
      case $cfg in
        phos) envs=(LD_PRELOAD=$libphos) ;;
        record) envs=(LD_PRELOAD=$libphos PHOS_RECORD_LAUNCHES=1) ;;
        speculate) envs=(LD_PRELOAD=$libphos PHOS_SPECULATE=1) ;;
        ptx) envs=(LD_PRELOAD=$libphos PHOS_VALIDATE=ptx CUDA_CACHE_DISABLE=1 PHOS_STATS_FILE=$log/bench_stats.ptx) ;;
        ptx_at_launch) envs=(LD_PRELOAD=$libphos PHOS_VALIDATE=ptx PHOS_TWIN_BUILD=launch CUDA_CACHE_DISABLE=1
                             PHOS_STATS_FILE=$log/bench_stats.ptx_at_launch) ;;
        sass) envs=(LD_PRELOAD=$libphos PHOS_VALIDATE=1 CUDA_CACHE_DISABLE=1 PHOS_STATS_FILE=$log/bench_stats.sass) ;;
        before) envs=(LD_PRELOAD=$PHOS_BENCH_BASELINE_LIB) ;;
        cycles) envs=(LD_PRELOAD=$libphos PHOS_CALL_CYCLES=on) ;;
      esac
      env "${envs[@]}" "$bin/bench_hooks" >> "$log/bench.$cfg" 2>&1
    done
  done
  echo "gpu: bench: hooks cost in microseconds, median [min-max] of 5 alternating runs, difference to native:"
  echo "gpu: bench:   $(sed 's/ / | /g' <<<"$cfgs")"
  local joined; joined=$(spread "$log/bench.native")
  for cfg in $cfgs; do
    [ "$cfg" = native ] && continue
    joined=$(join -a 1 <(echo "$joined") <(spread "$log/bench.$cfg"))
  done
  awk '{printf "gpu: bench:   %-26s %10.4f [%s]", $1, $2, $3
        for (i = 4; i + 1 <= NF; i += 2) printf " | %10.4f [%s] %+9.4f", $i, $(i + 1), $i - $2
        printf "\n"}' <<<"$joined"
  local mode
  for mode in ptx ptx_at_launch sass; do
    grep -h '^speculation \|^validation ' "$log/bench_stats.$mode" 2>/dev/null | tr ' ' '\n' |
      grep -E '^(analysis_max_ms|analysis_max_parts|twin_build_max_ms|twin_background_builds|first_launch_wait_max_ms|sass_patch_max_ms|sass)=' | paste -sd ' ' |
      sed "s/^/gpu: bench:   first launch's parts, validating ($mode): /"
  done
}

# spread FILE: "name median min-max" for every "bench name value" line.
spread() {
  grep '^bench' "$1" | awk '{v[$2] = v[$2] " " $3} END {for (k in v) print k, v[k]}' | while read -r k vals; do
    echo "$k $(tr ' ' '\n' <<<"$vals" | sort -g | awk '{a[NR]=$1} END {printf "%s %s-%s", a[int((NR+1)/2)], a[1], a[NR]}')"
  done | sort
}

# PyTorch MLP training step, alternating native and libphos.so runs.
# PHOS_BENCH_TORCH_RUNS (5) alternating runs of PHOS_BENCH_TORCH_STEPS (300)
# steps each; the first 15 steps of a run are warm-up.
case_bench_torch() {
  local r runs=${PHOS_BENCH_TORCH_RUNS:-5} steps=${PHOS_BENCH_TORCH_STEPS:-300}
  : > "$log/bench_torch.native"; : > "$log/bench_torch.phos"
  for r in $(seq "$runs"); do
    python3 "$here/torch_workloads.py" mlp --steps "$steps" | awk '/^time/ {split($2, a, "="); print "bench step_ms", a[2]}' >> "$log/bench_torch.native"
    LD_PRELOAD=$libphos python3 "$here/torch_workloads.py" mlp --steps "$steps" | awk '/^time/ {split($2, a, "="); print "bench step_ms", a[2]}' >> "$log/bench_torch.phos"
  done
  echo "gpu: bench: PyTorch MLP training step in ms, median [min-max] of $runs alternating runs of $((steps - 15)) steps:"
  join <(spread "$log/bench_torch.native") <(spread "$log/bench_torch.phos") |
    awk '{printf "gpu: bench:   %-26s native %9.4f [%s]  phos %9.4f [%s]  slower by %+.2f%%\n", $1, $2, $3, $4, $5, ($4 / $2 - 1) * 100}'
}

# The launch-bound PyTorch step (torch_launch_bound.py): what the hooks cost
# on every CUDA call of a real training loop. PHOS_BENCH_LAUNCH_RUNS (9)
# rounds, each running native, libphos.so, and libphos.so speculating in
# turn (and, with PHOS_BENCH_BASELINE_LIB=another libphos.so, that one, the
# build before a change, plain and speculating). Per configuration: the
# median over rounds of each run's 10th-percentile step time, its range, and
# the median of the paired per-round differences to native. Every run is
# pinned to the same two cores (PHOS_BENCH_CPUS, default 2,3): unpinned, the
# same program's runs differed by 15% on the H100 host, more than any hook.
case_bench_launch() {
  local r runs=${PHOS_BENCH_LAUNCH_RUNS:-9} cfg raw=$log/bench_launch.raw pin=()
  command -v taskset > /dev/null && pin=(taskset -c "${PHOS_BENCH_CPUS:-2,3}")
  local cfgs="native phos speculate"
  [ -n "${PHOS_BENCH_BASELINE_LIB:-}" ] && cfgs="$cfgs before before_speculate"
  : > "$raw"
  for r in $(seq "$runs"); do
    for cfg in $cfgs; do
      local envs=()
      case $cfg in
        phos) envs=(LD_PRELOAD=$libphos) ;;
        speculate) envs=(LD_PRELOAD=$libphos PHOS_SPECULATE=1) ;;
        before) envs=(LD_PRELOAD=$PHOS_BENCH_BASELINE_LIB) ;;
        before_speculate) envs=(LD_PRELOAD=$PHOS_BENCH_BASELINE_LIB PHOS_SPECULATE=1) ;;
      esac
      env "${envs[@]}" "${pin[@]}" python3 "$here/torch_launch_bound.py" --steps 300 2>&1 |
        awk -v r="$r" -v c="$cfg" '/^time/ {split($2, a, "="); split($3, b, "="); print r, c, a[2], b[2]}' >> "$raw"
    done
  done
  echo "gpu: bench: launch-bound PyTorch step (transformer encoder, AdamW) in ms, $runs rounds of 300 steps:"
  echo "gpu: bench:   config  p10 median [min-max]  vs native  paired difference (median)  step median"
  python3 - "$raw" <<'PY' | sed 's/^/gpu: bench:   /'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    r, c, p10, med = line.split()
    runs.setdefault(c, {})[r] = (float(p10), float(med))
native = runs.get("native", {})
for c, by_round in runs.items():
    p10s = [v[0] for v in by_round.values()]
    m = statistics.median(p10s)
    pairs = [by_round[r][0] - native[r][0] for r in by_round if r in native]
    base = statistics.median([v[0] for v in native.values()]) if native else m
    diff = statistics.median(pairs) if pairs else 0.0
    print(f"{c:17s} {m:8.4f} [{min(p10s):.4f}-{max(p10s):.4f}]  {(m / base - 1) * 100:+6.2f}%  "
          f"{diff:+.4f} ms ({diff / base * 100:+.2f}%)  {statistics.median(v[1] for v in by_round.values()):8.4f}")
PY
}

# How many driver calls of which functions the launch-bound step makes
# (probes/driver_census.c, without libphos.so): per step, from the
# difference of a 40- and a 240-step run; the 12 most called.
case_census() {
  local census=$PHOS_BUNDLE/lib-all/phos_driver_census.so
  [ -e "$census" ] || { line census SKIP "no census probe in the bundle"; return; }
  local n
  for n in 40 240; do
    PHOS_CENSUS_FILE=$log/census.$n LD_PRELOAD=$census python3 "$here/torch_launch_bound.py" --steps "$n" --warmup 5 > /dev/null 2>&1
  done
  # A name can come twice (two versions of one function): summed.
  per_step() { join <(awk '{n[$2] += $3} END {for (k in n) print k, n[k]}' "$log/census.40" | sort) \
                    <(awk '{n[$2] += $3} END {for (k in n) print k, n[k]}' "$log/census.240" | sort) |
               awk '{d = ($3 - $2) / 200; if (d > 0) printf "%s %.1f\n", $1, d}' | sort -k2 -gr; }
  echo "gpu: census: driver calls per launch-bound step (function calls/step), the 12 most called:"
  per_step | head -n 12 | sed 's/^/gpu: census:   /'
  per_step | awk '{t += $2} END {printf "gpu: census:   all %.1f\n", t}'
}

# phos's own CPU time per launch-bound PyTorch step, counted in the process
# (PHOS_CALL_CYCLES=on, torch_launch_bound.py --phos-cycles): step times
# vary +-20% between runs here, which hides a 1% cost, so the cost is not
# a difference of step times but the time the hooks' own code took, summed
# by the hooks themselves (the forwarded driver and library calls left
# out). PHOS_BENCH_CYCLES_RUNS (3) runs of PHOS_BENCH_CYCLES_STEPS (300)
# steps each, with nothing on ("phos") and speculating ("speculate"), pinned
# as bench_launch is. Per configuration, the run with the median share: the
# mean step time, phos's time per step and its share of the step as counted
# (an upper bound: it holds the counter's own bookkeeping, its floor of
# ~20 ns a call) and net of that floor (a lower bound), calls per step and
# ns a call; then that run's census (calls per step by kind, the
# PHOS_BENCH_CYCLES_KINDS (15) kinds with the most time). PASS where the
# counted shares (the upper bound) meet the targets: < 1% with nothing on,
# < 5% speculating.
case_call_cycles() {
  local runs=${PHOS_BENCH_CYCLES_RUNS:-3} steps=${PHOS_BENCH_CYCLES_STEPS:-300} kinds=${PHOS_BENCH_CYCLES_KINDS:-15}
  local r cfg pin=()
  command -v taskset > /dev/null && pin=(taskset -c "${PHOS_BENCH_CPUS:-2,3}")
  for cfg in phos speculate; do
    for r in $(seq "$runs"); do
      local envs=(LD_PRELOAD=$libphos PHOS_CALL_CYCLES=on PHOSCTL=$PHOS_PHOSCTL_BIN)
      [ "$cfg" = speculate ] && envs+=(PHOS_SPECULATE=1)
      env "${envs[@]}" "${pin[@]}" python3 "$here/torch_launch_bound.py" --steps "$steps" --phos-cycles \
        > "$log/call_cycles.$cfg.$r" 2>&1
    done
  done
  echo "gpu: call_cycles: phos's own CPU time per launch-bound PyTorch step, counted in the process" \
       "(PHOS_CALL_CYCLES=on), the median of $runs runs of $steps steps:"
  python3 - "$log" "$runs" "$kinds" <<'PY' | sed 's/^/gpu: call_cycles:   /'
import re, sys
log, runs, kinds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
targets = {"phos": 1.0, "speculate": 5.0}
print(f"{'config':10s} {'step_ms':>8s} {'phos_us':>8s} {'share':>7s} {'net_us':>8s} {'net':>7s} {'calls':>7s} "
      f"{'ns/call':>7s} {'floor':>5s}  target")
for cfg, target in targets.items():
    parsed = []
    for r in range(1, runs + 1):
        text = open(f"{log}/call_cycles.{cfg}.{r}").read()
        m = re.search(r"^phos_cycles (.*)$", text, re.M)
        if not m:
            print(f"{cfg:10s} run {r}: no phos_cycles line: " + " | ".join(text.strip().splitlines()[-3:]))
            continue
        f = {k: float(v.rstrip("%")) for k, v in (kv.split("=") for kv in m.group(1).split())}
        census = re.findall(r"^census (\S+) calls=(\S+) phos_us=(\S+) ns_per_call=(\S+)$", text, re.M)
        parsed.append((f, census))
    if not parsed:
        continue
    parsed.sort(key=lambda p: p[0]["share"])
    f, census = parsed[len(parsed) // 2]
    ok = f["share"] < target
    print(f"{cfg:10s} {f['step_ms']:8.3f} {f['phos_us']:8.1f} {f['share']:6.2f}% {f['net_us']:8.1f} "
          f"{f['net_share']:6.2f}% {f['calls']:7.1f} {f['ns_per_call']:7.1f} {f['floor_ns']:5.1f}  <{target:g}%: "
          f"{'met' if ok else 'MISSED'} (runs: " + ", ".join(f"{p[0]['share']:.2f}%" for p in parsed) + ")")
    print(f"  census ({cfg}): call, calls/step, us/step, ns/call, the {kinds} with the most time")
    for call, c, us, ns in census[:kinds]:
        print(f"    {call:36s} {float(c):8.2f} {float(us):8.2f} {float(ns):8.1f}")
    rest = census[kinds:]
    if rest:
        print(f"    {'(' + str(len(rest)) + ' more)':36s} {sum(float(c) for _, c, _, _ in rest):8.2f} "
              f"{sum(float(u) for _, _, u, _ in rest):8.2f}")
PY
  local summary; summary=$(python3 - "$log" "$runs" <<'PY'
import re, statistics, sys
log, runs = sys.argv[1], int(sys.argv[2])
out, ok = [], True
for cfg, target in (("phos", 1.0), ("speculate", 5.0)):
    shares = []
    for r in range(1, runs + 1):
        m = re.search(r"^phos_cycles .* share=([0-9.]+)%", open(f"{log}/call_cycles.{cfg}.{r}").read(), re.M)
        if m:
            shares.append(float(m.group(1)))
    if not shares:
        out.append(f"{cfg}: no result"); ok = False; continue
    s = statistics.median(shares)
    ok &= s < target
    out.append(f"{cfg} {s:.2f}% of the step (target <{target:g}%)")
print(("PASS" if ok else "FAIL") + " " + ", ".join(out))
PY
)
  line call_cycles "${summary%% *}" "${summary#* }"
}

cases=${*:-cuda_basic cuda_roundtrip launch_record cuda_graph cublas torch_mlp torch_expandable torch_compile torch_conv torch_roundtrip torch_roundtrip_expandable speculation sanitizer_abi validation validation_switch ptx_twins bench bench_torch bench_launch census call_cycles}
reference_cuda=
for c in $cases; do
  [ "$c" = cuda_roundtrip ] && [ -z "$reference_cuda" ] && case_cuda_basic
  "case_$c"
done
echo "gpu: $passed passed, $failed failed"
