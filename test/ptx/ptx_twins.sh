#!/bin/bash
# The ptx_twins test: PTX from the machine's nvcc (sm_90 and sm_100, debug
# and line-info builds, relocatable code), hand-written PTX (ISA 8.0, a
# Triton-shaped module) and, where the toolkit has it, PTX of a real library
# (cuBLAS's compute_120 entries) go through phos-ptx-twin in three modes
# (stores; loads; loads and stores next to the originals), and ptxas must
# assemble every output for the module's own target. Every original is
# assembled first, so a failure is always the rewriter's. Also checks, with
# phos-ptx-twin --verify, that each twin is a kernel with the original's
# parameters and the table pointer last, and that only the kernels that
# should be are incomplete.
#
# Environment: PHOS_PTX_TWIN, NVCC, PTXAS (paths), SRC (this folder);
# optional: PHOS_FATBIN_INFO and CUDA_LIB (the toolkit's lib64), for the
# library PTX; PHOS_PTX_KEEP, a folder where outputs ptxas rejects are kept.
set -euo pipefail
: "${PHOS_PTX_TWIN:?}" "${NVCC:?}" "${PTXAS:?}" "${SRC:?}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
jobs=$(nproc 2>/dev/null || echo 2)
mkdir -p "$work/ptx" "$work/out" "$work/res"

# 1. PTX from nvcc, for the architectures this nvcc knows (of sm_90, sm_100).
known=$("$NVCC" --list-gpu-arch)
archs=""
for a in 90 100; do
  if grep -qx "compute_$a" <<<"$known"; then archs="$archs $a"; fi
done
[ -n "$archs" ] || { echo "nvcc knows neither compute_90 nor compute_100"; exit 1; }
cmds="$work/nvcc.cmds"
: >"$cmds"
for cu in "$SRC"/*.cu; do
  name=$(basename "$cu" .cu)
  for a in $archs; do
    echo "$NVCC -arch=sm_$a -ptx $cu -o $work/ptx/$name.sm_$a.ptx" >>"$cmds"
  done
done
# Variants: debug (-G: debug sections naming labels), line info, relocatable
# code (visible functions), and PTX for a virtual architecture.
echo "$NVCC -arch=sm_90 -G -ptx $SRC/calls.cu -o $work/ptx/calls.G.sm_90.ptx" >>"$cmds"
echo "$NVCC -arch=sm_90 -lineinfo -ptx $SRC/generic.cu -o $work/ptx/generic.lineinfo.sm_90.ptx" >>"$cmds"
echo "$NVCC -arch=sm_90 -rdc=true -ptx $SRC/calls.cu -o $work/ptx/calls.rdc.sm_90.ptx" >>"$cmds"
echo "$NVCC -arch=compute_90 -ptx $SRC/vectors.cu -o $work/ptx/vectors.compute_90.ptx" >>"$cmds"
if ! xargs -P "$jobs" -I{} sh -c '{} || exit 255' <"$cmds"; then
  echo "nvcc failed"
  exit 1
fi
cp "$SRC"/*.ptx "$work/ptx/"

# 2. PTX of a real library, read from its fatbin by phos's own reader (as
# the runtime will), where there is some this ptxas can assemble.
libs=0
lib="${CUDA_LIB:-}/libcublas.so"
if [ -n "${PHOS_FATBIN_INFO:-}" ] && [ -f "$lib" ] && grep -q sm_120 <<<"$("$PTXAS" --help)"; then
  mkdir -p "$work/lib"
  "$PHOS_FATBIN_INFO" "$lib" --arch 120 --ptx "$work/lib" --ptx-count 4 --ptx-max-bytes 150000 >/dev/null
  for f in "$work"/lib/*.ptx; do
    [ -f "$f" ] || continue
    mv "$f" "$work/ptx/lib.cublas.$(basename "$f")"
    libs=$((libs + 1))
  done
fi
[ "$libs" -gt 0 ] || echo "note: no library PTX checked (needs $lib and ptxas for sm_120)"

# 3. Rewrite and assemble, one job per module.
export PHOS_PTX_TWIN PTXAS work
one() {
  local ptx=$1 name target arch mode flags out
  name=$(basename "$ptx" .ptx)
  target=$(awk '$1 == ".target" { sub(",", "", $2); print $2; exit }' "$ptx")
  arch=$target
  if ! "$PTXAS" -arch="$arch" "$ptx" -o /dev/null 2>"$work/res/$name.orig.err"; then
    echo "FAIL $name: ptxas rejects the original" >"$work/res/$name.orig"
    return 0
  fi
  for mode in stores loads both; do
    case $mode in
      stores) flags="" ;;
      loads) flags="--loads" ;;
      both) flags="--loads --stores --with-original" ;;
    esac
    out="$work/out/$name.$mode.ptx"
    # shellcheck disable=SC2086
    if ! "$PHOS_PTX_TWIN" "$ptx" "$out" --verify $flags >"$work/res/$name.$mode.log" 2>"$work/res/$name.$mode.err"; then
      echo "FAIL $name $mode: phos-ptx-twin: $(cat "$work/res/$name.$mode.err")" >"$work/res/$name.$mode"
      continue
    fi
    if ! "$PTXAS" -arch="$arch" "$out" -o /dev/null 2>"$work/res/$name.$mode.err"; then
      echo "FAIL $name $mode: ptxas -arch=$arch rejects the twins: $(head -5 "$work/res/$name.$mode.err")" \
        >"$work/res/$name.$mode"
      if [ -n "${PHOS_PTX_KEEP:-}" ]; then cp "$out" "$PHOS_PTX_KEEP/"; fi
      continue
    fi
    echo "OK $arch $(grep -c '^kernel ' "$work/res/$name.$mode.log")" >"$work/res/$name.$mode"
  done
}
export -f one
ls "$work"/ptx/*.ptx | xargs -P "$jobs" -I{} bash -c 'one {}'

# 4. Results.
failures=$(cat "$work"/res/*.orig "$work"/res/*.stores "$work"/res/*.loads "$work"/res/*.both 2>/dev/null |
  grep '^FAIL' || true)
modules=$(ls "$work"/ptx/*.ptx | wc -l)
for mode in stores loads both; do
  for a in $(cat "$work"/res/*."$mode" | awk '$1 == "OK" { print $2 }' | sort -u); do
    n=$(cat "$work"/res/*."$mode" | awk -v a="$a" '$1 == "OK" && $2 == a { m++; k += $3 } END { print m " modules, " k " twins" }')
    echo "$mode: ptxas -arch=$a assembled $n"
  done
done
checks=$(cat "$work"/res/*.stores.log | awk '$1 == "kernel" { for (i = 1; i < NF; i++) if ($i == "checks") c += $(i + 1) } END { print c + 0 }')
echo "stores: $checks checked instructions in all"
if [ -n "$failures" ]; then
  echo "$failures"
  exit 1
fi
[ "$(ls "$work"/res/*.stores | wc -l)" -eq "$modules" ] || { echo "not every module was rewritten"; exit 1; }

# Only the kernels that reach what no twin can check are incomplete: an
# indirect call (calls.cu) and a tensor-map copy to global memory (async.cu).
incomplete=$(cat "$work"/res/*.stores.log | grep -v ' complete' | awk '{ print $2 }' | sort -u | tr '\n' ' ')
want="_Z11tensor_copyPKvi _Z8indirectPfi "
if [ "$incomplete" != "$want" ]; then
  echo "incomplete store twins: '$incomplete', expected '$want'"
  cat "$work"/res/*.stores.log | grep -v ' complete' || true
  exit 1
fi
grep -q 'indirect call through' "$work/res/calls.sm_90.stores.log"
grep -q 'cp.async.bulk.tensor to global memory' "$work/res/async.sm_90.stores.log"
# Checks that must be there: the Triton-shaped module's two masked vector
# stores and two atomics, the ISA 8.0 module's nine accesses.
grep -q '^kernel add_kernel .* checks 4 complete' "$work/res/triton_like.stores.log"
grep -q '^kernel add_kernel .* checks 8 complete' "$work/res/triton_like.both.log"
grep -q '^kernel fill .* checks 9 complete' "$work/res/isa80.stores.log"
echo "ptx_twins: $modules modules, all twins assembled"
