#!/usr/bin/env bash
# Builds what the GPU suite runs on a GPU host into bundle/ (listed in
# .git/info/exclude; the device tool carries it): phos built for release, the
# criu 4.2.1 binary with the project's patches (contrib/criu/, installed by
# install-criu.sh, which this runs: it keeps an up-to-date install) and CRIU's
# cuda plugin, the unpatched criu 4.2.1 as criu-unpatched/ (the baseline of
# test/bench/criu_pages.sh), criu-dev/ (CRIU's development branch, where
# build-criu-dev.sh built it), probes, and every shared library
# they need beyond glibc, so the host need not have them (run-on-host.sh
# puts only the ones the host lacks on LD_LIBRARY_PATH).
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
out=$src/bundle
cuda=${CUDA_HOME:-/usr/local/cuda}
if [ -f "$src/build-gpu/build.ninja" ]; then meson configure "$src/build-gpu" >/dev/null
else meson setup "$src/build-gpu" "$src" -Dbuildtype=release -Dwerror=true >/dev/null; fi
ninja -C "$src/build-gpu" >/dev/null
# The patched criu in /usr/local, and the unpatched one in the cache (both
# idempotent: built only when missing or when the patches changed).
"$src/contrib/scripts/install-criu.sh" >/dev/null
PHOS_CRIU_UNPATCHED=1 "$src/contrib/scripts/install-criu.sh" >/dev/null
rm -rf "$out" && mkdir -p "$out/build" "$out/bin" "$out/lib-all" "$out/criu" "$out/criu-unpatched"
# Mirror the build tree's layout so scripts take PHOS_BUILD=bundle/build.
(cd "$src/build-gpu" && cp --parents cuda_hooks/libphos.so plugin/phos_plugin.so plugin/phos-keeper plugin/phosctl plugin/phos-job-vote \
   test/e2e/phos-test-counter test/e2e/phos-criu-rpc test/unit/phos-unit-tests test/hooks/phos-agent-tool test/bench/cuda-checkpoint \
   test/tools/phos-image-edit test/tools/phos-tcpstore test/bench/phos-speculation-bench test/bench/phos-storage-bench speculation/tools/phos-fatbin-info \
   test/bench/phos-criu-pages-hog "$out/build/")
# The suite's CUDA programs, for Hopper (sm_90), with the toolkit here.
mkdir -p "$out/gpu"
for p in cuda_basic cuda_graph cublas_gemm multi_gpu bench_hooks gpu_counter gpu_steps gpu_hog planted cow_random lazy_read gpu_ipc gpu_ipc_event; do
  "$cuda/bin/nvcc" -O2 -std=c++17 -arch=sm_90 -o "$out/gpu/$p" "$src/test/gpu/$p.cu" -lcupti -lcublas
done
# The driver API directly too (cuCtxGetFlags, cuMemGetAccess): peer_access.
"$cuda/bin/nvcc" -O2 -std=c++17 -arch=sm_90 -o "$out/gpu/peer_access" "$src/test/gpu/peer_access.cu" -lcupti -lcuda
# What the driver's checkpoint moves into a process (bench_driver_state.sh):
# the probe (driver API, cuBLAS, cuBLASLt) and the modules it loads beside it.
"$cuda/bin/nvcc" -O2 -std=c++17 -arch=sm_90 -o "$out/gpu/driver_state_probe" "$src/test/gpu/driver_state_probe.cu" \
  -L"$cuda/lib64/stubs" -lcuda -lcublas -lcublasLt
"$cuda/bin/nvcc" -cubin -arch=sm_90 -o "$out/gpu/driver_state_small.cubin" "$src/test/gpu/driver_state_module.cu"
"$cuda/bin/nvcc" -fatbin -gencode arch=compute_90,code=sm_90 -DBIG -o "$out/gpu/driver_state_big.fatbin" \
  "$src/test/gpu/driver_state_module.cu"
# cow_random without PTX (SASS for sm_90 only): no validator sees its planted
# writes; validation by checksum must refuse them (cow_planted_sass).
"$cuda/bin/nvcc" -O2 -std=c++17 -gencode arch=compute_90,code=sm_90 -o "$out/gpu/cow_random_sass" \
  "$src/test/gpu/cow_random.cu" -lcublas
# The engine's fingerprint kernels, timed and checked against the host's.
"$cuda/bin/nvcc" -O3 -std=c++17 -arch=sm_90 -I"$src/plugin/gpu" -I"$src/images/include" -o "$out/gpu/bench_checksum" \
  "$src/test/gpu/bench_checksum.cu"
# PTX twins to run on the GPU (ptx_twin_check.cc): nvcc's PTX of
# test/ptx/generic.cu and the Triton-shaped test/ptx/triton_like.ptx.
# Probes for facts the design rests on (test/gpu/probes/); the sanitizer
# probe needs the toolkit's sanitizer.h, so the GPU host builds it.
"$cuda/bin/nvcc" -O2 -std=c++17 -arch=sm_90 -o "$out/gpu/dma_file_probe" "$src/test/gpu/probes/dma_file_probe.cu"
"$cuda/bin/nvcc" -O2 -o "$out/gpu/ptx_twin_check" "$src/test/gpu/ptx_twin_check.cc" -lcuda
"$cuda/bin/nvcc" -ptx -arch=sm_90 -o "$out/gpu/generic.ptx" "$src/test/ptx/generic.cu"
twin=$src/build-gpu/ptx/tools/phos-ptx-twin
"$twin" "$out/gpu/generic.ptx" "$out/gpu/generic.twin.ptx" --stores --sites > "$out/gpu/generic.sites"
"$cuda/bin/nvcc" -ptx -arch=sm_90 -o "$out/gpu/globals.ptx" "$src/test/ptx/globals.cu"
"$twin" "$out/gpu/globals.ptx" "$out/gpu/globals.twin.ptx" --stores >/dev/null
"$twin" "$src/test/ptx/triton_like.ptx" "$out/gpu/triton.twin.ptx" --stores >/dev/null
"$twin" "$src/test/ptx/triton_like.ptx" "$out/gpu/triton.loads.ptx" --loads >/dev/null
# The suite programs' kernel signatures (phos-sigdb), for the speculation case.
if [ -x "$src/build-gpu/speculation/tools/phos-sigdb" ]; then
  "$src/build-gpu/speculation/tools/phos-sigdb" -o "$out/gpu/suite.sigdb" "$src"/test/gpu/*.cu -- -I"$src/test/gpu" \
    -I"$src/plugin/gpu" -I"$src/images/include" 2>/dev/null
fi
cp /usr/local/sbin/criu "$out/bin/"
cp /usr/local/lib/criu/cuda_plugin.so "$out/criu/"
# Stripped (1.6 MB instead of 6 MB): the device tool carries 64 MiB at most.
strip -o "$out/criu-unpatched/criu" "${PHOS_CRIU_CACHE:-/var/cache/phos-criu}/unpatched/sbin/criu"
# CRIU's development branch, where build-criu-dev.sh installed it, for
# measuring the CPU-side restore against 4.1.1 (CRIU=$CRIU_DEV on the host).
criu_dev=/var/cache/phos-criu-dev
if [ -x "$criu_dev/bin/criu" ]; then
  mkdir -p "$out/criu-dev/bin" && cp "$criu_dev/bin/criu" "$out/criu-dev/bin/"
  if [ -f "$criu_dev/lib/criu/cuda_plugin.so" ]; then
    mkdir -p "$out/criu-dev/criu" && cp "$criu_dev/lib/criu/cuda_plugin.so" "$out/criu-dev/criu/"
  fi
fi
# iproute2's ip, for the two-"host" cases' network namespaces (two_hosts.sh):
# the GPU hosts have none.
cp -L "$(command -v ip)" "$out/bin/ip"
gcc -O2 -I"$cuda/include" -o "$out/bin/probe_driver_entry" "$src/test/gpu/probe_driver_entry.c" -ldl
gcc -O2 -shared -fPIC -I"$cuda/include" -o "$out/lib-all/phos_dlsym_logger.so" "$src/test/gpu/dlsym_logger.c" -ldl
gcc -O2 -shared -fPIC -I"$cuda/include" -o "$out/lib-all/phos_driver_census.so" "$src/test/gpu/probes/driver_census.c" -ldl
for f in "$out/bin/criu" "$out/bin/ip" "$out/criu-unpatched/criu" "$out/criu-dev/bin/criu" "$out/build/plugin/phosctl" \
         "$out/build/test/unit/phos-unit-tests" "$out/build/test/hooks/phos-agent-tool" "$out/build/test/tools/phos-image-edit"; do
  [ -e "$f" ] || continue  # criu-dev only where it was built
  ldd "$f" | awk '/=> \// {print $3}' | grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so' || true
done | sort -u | while read -r lib; do cp -L "$lib" "$out/lib-all/"; done
# The device takes at most 64 MiB with the working tree: no symbols (65 MiB
# with them, 52 without, once the driver-state probe came in).
find "$out" -type f ! -name "*.cubin" ! -name "*.fatbin" -exec sh -c 'file -b "$1" | grep -q "^ELF" && strip --strip-unneeded "$1" 2>/dev/null || true' _ {} \;
du -sh "$out" | awk '{print "bundle: " $1}'
