#!/usr/bin/env bash
# Fuzzes the readers of untrusted bytes for a bounded time (default 60 s in
# all, split between the targets) with libFuzzer: the image readers, the
# fatbin/cubin readers, and the decoding of what an agent sends.
# usage: test/fuzz/run.sh [SECONDS]
set -euo pipefail
seconds=${1:-60}
src=$(cd "$(dirname "$0")/../.." && pwd)
build=${PHOS_FUZZ_BUILD:-$src/build-fuzz}
if [ ! -f "$build/build.ninja" ]; then
  CC=clang-14 CXX=clang++-14 meson setup "$build" "$src" -Dfuzz=true -Dtests=disabled -Dtools=disabled \
    -Db_sanitize=address,undefined -Db_lundef=false >/dev/null
fi
# Quiet unless the build fails: then its errors, which CI would otherwise hide.
if ! built=$(ninja -C "$build" test/fuzz/fuzz_image_reader test/fuzz/fuzz_fatbin test/fuzz/fuzz_agent_reply test/fuzz/make_corpus 2>&1); then
  grep -A8 -E "error|FAILED" <<<"$built" | head -n 40
  echo "fuzz: the fuzz targets did not build (clang-14, $build)"
  exit 1
fi
corpus=$(mktemp -d)
trap 'rm -rf "$corpus"' EXIT
mkdir "$corpus/image" "$corpus/fatbin" "$corpus/agent"
"$build/test/fuzz/make_corpus" "$corpus/image" "$corpus/fatbin" "$corpus/agent"

# fuzz TARGET CORPUS SECONDS
fuzz() {
  local target=$1 dir=$2 secs=$3 log="$corpus/$1.log" rc
  echo "fuzz: $target for ${secs}s, seeds: $(ls "$dir" | wc -l)"
  set +e
  "$build/test/fuzz/$target" -max_total_time="$secs" -max_len=65536 -timeout=10 \
    -print_final_stats=1 -artifact_prefix="$build/$target-" "$dir" >"$log" 2>&1
  rc=$?
  set -e
  grep -E "^(Done|stat::number_of_executed_units|stat::new_units_added)" "$log" || true
  if [ "$rc" -ne 0 ]; then
    tail -n 40 "$log"
    echo "fuzz: $target FAILED (exit $rc); the input is under $build/"
    return 1
  fi
}

third=$((seconds / 3))
[ "$third" -ge 1 ] || third=1
status=0
fuzz fuzz_image_reader "$corpus/image" "$((seconds - 2 * third > 0 ? seconds - 2 * third : 1))" || status=1
fuzz fuzz_fatbin "$corpus/fatbin" "$third" || status=1
fuzz fuzz_agent_reply "$corpus/agent" "$third" || status=1
[ "$status" -eq 0 ] && echo "fuzz: no crash"
exit "$status"
