#!/usr/bin/env bash
# Runs the probes on a GPU host from bundle/ (make-bundle.sh); logs in $OUT.
# usage: run.sh [sanitizer] [dma DIR THREADS MIB]...
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../run-on-host.sh" >/dev/null
out=${OUT:-/tmp}/probes
mkdir -p "$out"
cuda=${CUDA_HOME:-/usr/local/cuda}
san=$cuda/compute-sanitizer
while [ $# -gt 0 ]; do
  case $1 in
    sanitizer)
      shift
      echo "== sanitizer probe (toolkit: $($cuda/bin/nvcc --version | tail -n1))"
      mkdir -p "$out/sanitizer-include" && cp "$san"/include/sanitizer{,_patching,_callbacks,_result,_memory}.h "$out/sanitizer-include/"
      work=$(mktemp -d)
      "$cuda/bin/nvcc" --fatbin --keep-device-functions -Xptxas --compile-as-tools-patch -I"$san/include" \
        -gencode arch=compute_90,code=sm_90 -o "$work/sanitizer_patch.fatbin" "$here/sanitizer_patch.cu" 2>&1 | tail -n 20
      "$cuda/bin/nvcc" -O2 -std=c++17 -arch=sm_90 -I"$san/include" -o "$work/sanitizer_probe" "$here/sanitizer_probe.cu" \
        -lcuda -ldl 2>&1 | tail -n 20
      lib=$(ls "$san"/libsanitizer-public.so* 2>/dev/null | head -n1)
      g++ -O2 -shared -fPIC -I"$san/include" -I"$cuda/include" -o "$work/sanitizer_inject.so" "$here/sanitizer_inject.cc" -ldl
      for mode in late early-none early-resource; do
        echo "-- $mode"; timeout 40 "$work/sanitizer_probe" "$lib" "$work/sanitizer_patch.fatbin" $mode 2>&1; echo "rc=$?"
      done
      echo "-- inject"
      CUDA_INJECTION64_PATH=$work/sanitizer_inject.so PROBE_SANITIZER_LIB=$lib timeout 40 \
        "$work/sanitizer_probe" "$lib" "$work/sanitizer_patch.fatbin" inject 2>&1; echo "rc=$?" ;;
    dma)
      echo "== dma_file_probe $2 $3 $4 ($(df -h "$2" | tail -n1))"
      timeout 200 "$PHOS_BUNDLE/gpu/dma_file_probe" "$2" "$3" "$4" 2>&1; echo "rc=$?"
      echo "== phos-storage-bench $2 $3 $4"
      timeout 100 "$PHOS_BUILD/test/bench/phos-storage-bench" "$2" "$3" "$4" 2>&1; echo "rc=$?"
      shift 4 ;;
    *) echo "unknown probe $1"; exit 2 ;;
  esac
done
