#!/usr/bin/env bash
# Fuzzes the image readers for a bounded time (default 60 s) with libFuzzer.
# usage: test/fuzz/run.sh [SECONDS]
set -euo pipefail
seconds=${1:-60}
src=$(cd "$(dirname "$0")/../.." && pwd)
build=${PHOS_FUZZ_BUILD:-$src/build-fuzz}
if [ ! -f "$build/build.ninja" ]; then
  CC=clang-14 CXX=clang++-14 meson setup "$build" "$src" -Dfuzz=true -Dtests=disabled -Dtools=disabled \
    -Db_sanitize=address,undefined -Db_lundef=false >/dev/null
fi
ninja -C "$build" test/fuzz/fuzz_image_reader test/fuzz/make_corpus >/dev/null
corpus=$(mktemp -d)
trap 'rm -rf "$corpus"' EXIT
"$build/test/fuzz/make_corpus" "$corpus"
echo "fuzz: image readers for ${seconds}s, seeds: $(ls "$corpus" | wc -l)"
log="$corpus/fuzz.log"
set +e
"$build/test/fuzz/fuzz_image_reader" -max_total_time="$seconds" -max_len=65536 -timeout=10 \
  -print_final_stats=1 -artifact_prefix="$build/" "$corpus" >"$log" 2>&1
rc=$?
set -e
grep -E "^(Done|stat::number_of_executed_units|stat::new_units_added)" "$log" || true
if [ "$rc" -ne 0 ]; then
  tail -n 40 "$log"
  echo "fuzz: FAILED (exit $rc); the input is under $build/"
  exit 1
fi
echo "fuzz: no crash"
