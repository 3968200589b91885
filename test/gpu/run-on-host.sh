#!/usr/bin/env bash
# Sets up a GPU host from bundle/ (see make-bundle.sh): the shared libraries
# the host lacks go on LD_LIBRARY_PATH. Source it, then run the suite.
bundle=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../bundle" && pwd)
mkdir -p "$bundle/lib"
# The host's own CUDA libraries (cuBLAS, CUPTI) come from PyTorch's wheels.
for lib in libcublas.so.13 libcupti.so.13; do
  d=$(find /opt /usr/local /usr/lib -name "$lib" -not -path "$bundle/*" 2>/dev/null | head -n1)
  [ -n "$d" ] && cuda_libs=${cuda_libs:+$cuda_libs:}$(dirname "$d")
done
export LD_LIBRARY_PATH=$bundle/lib${cuda_libs:+:$cuda_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# Carry only what the host lacks; repeat until the closure is complete
# (a carried library's own needs show only once it is found).
for _ in 1 2 3 4 5; do
  missing=$(for f in "$bundle/bin/criu" "$bundle/bin/ip" "$bundle/criu-unpatched/criu" "$bundle/criu-dev/bin/criu" "$bundle/build/plugin/phosctl" \
                     "$bundle/build/test/unit/phos-unit-tests" "$bundle/build/test/tools/phos-image-edit" "$bundle"/gpu/*; do ldd "$f" 2>/dev/null | awk '/not found/ {print $1}'; done | sort -u)
  [ -z "$missing" ] && break
  for lib in $missing; do [ -e "$bundle/lib-all/$lib" ] && ln -sf "$bundle/lib-all/$lib" "$bundle/lib/$lib"; done
done
export PHOS_BUILD=$bundle/build CRIU=$bundle/bin/criu PHOS_BUNDLE=$bundle
# After the host's own tools: the carried ones it lacks (ip).
export PATH=$PATH:$bundle/bin
# Unpatched criu 4.2.1, the baseline of test/bench/criu_pages.sh.
if [ -x "$bundle/criu-unpatched/criu" ]; then export CRIU_UNPATCHED=$bundle/criu-unpatched/criu; fi
# CRIU's development branch, if make-bundle.sh carried it (build-criu-dev.sh).
if [ -x "$bundle/criu-dev/bin/criu" ]; then export CRIU_DEV=$bundle/criu-dev/bin/criu; fi
# criu keeps its probe of the kernel's features in /run/criu.kdat only
# where /run is a tmpfs (gone at reboot), as on systemd hosts. These hosts'
# /run is not one: every criu dump and restore probed again, 35 ms each.
# A tmpfs over /run, holding what was there, makes the host the usual kind.
if [ "$(stat -f -c %T /run 2>/dev/null)" != tmpfs ] && [ "$(id -u)" = 0 ]; then
  run_kept=$(mktemp -d)
  cp -a /run/. "$run_kept"/ 2>/dev/null
  mount -t tmpfs -o mode=755 tmpfs /run && cp -a "$run_kept"/. /run/ 2>/dev/null
  rm -rf "$run_kept"
  echo "host: /run was no tmpfs (criu could not keep its kdat cache): a tmpfs mounted over it"
fi
# The cache is made by criu's first run since boot, as `criu check` at
# install makes it: not by the first case measured.
[ -e /run/criu.kdat ] || "$CRIU" check > /dev/null 2>&1 || true
echo "host: $(uname -r), $(. /etc/os-release; echo "$PRETTY_NAME"), carried libs: $(ls "$bundle/lib" | tr '\n' ' ')"
