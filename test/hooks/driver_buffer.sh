#!/usr/bin/env bash
# The driver's checkpoint buffer in huge pages (memory/driver_buffer.h),
# against the fake libcuda: its MAP_POPULATE mapping of 64 MiB comes back
# populated (Rss = its size), advised MADV_HUGEPAGE, its contents intact,
# and libphos says so; the program's own mapping of the same kind is left
# as it asked; with PHOS_DRIVER_BUFFER_HUGE=0, without libphos, or for a
# buffer under 32 MiB, nothing changes. Where huge pages come slowly (the
# kernel compacting memory for them; PHOS_FAULT=slow-huge-pages), the
# buffer past its first 32 MiB is populated in small pages.
set -euo pipefail
BUILD=${PHOS_BUILD:?}
fail() { echo "[driver_buffer] FAIL: $*"; exit 1; }
client=$BUILD/test/hooks/driver_buffer_client
libphos=$BUILD/cuda_hooks/libphos.so
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export LD_LIBRARY_PATH=$BUILD/test/hooks${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

run() {  # run MIB [ENV=VALUE...]: the client's report in $work/out, its stderr in $work/err
  local mib=$1; shift
  env "$@" "$client" "$mib" > "$work/out" 2> "$work/err" || fail "client ($*) exited with $?: $(cat "$work/err")"
}
field() { grep "^$1 " "$work/out" | grep -o " $2=[^ ]*" | cut -d= -f2; }

# A kernel without transparent huge pages refuses the advice: nothing to
# see of it (the buffer is populated all the same).
thp=1
[ -d /sys/kernel/mm/transparent_hugepage ] || { thp=0; echo "[driver_buffer] no transparent huge pages here: the advice is not checked"; }
hg() { [ "$thp" = 0 ] || [ "$(field "$1" "$2")" = "$3" ]; }

run 64 LD_PRELOAD="$libphos"
# Past its first 32 MiB it stays huge where huge pages came fast: this
# machine's speed, not asserted (a VM backing memory at first touch).
hg driver hg 1 || fail "the driver's buffer is not advised huge: $(cat "$work/out")"
[ "$(field driver rss_kib)" = 65536 ] || fail "the driver's buffer is not populated: $(cat "$work/out")"
[ "$(field driver data)" = ok ] || fail "the driver's buffer lost what was written: $(cat "$work/out")"
[ "$(field own hg)" = 0 ] || fail "the program's own mapping was advised huge: $(cat "$work/out")"
[ "$(field own rss_kib)" = 65536 ] || fail "the program's own mapping is not populated: $(cat "$work/out")"
grep -qE "phos: the driver's 64.0 MiB buffer populated in [0-9.]+ ms, (advised huge pages|in small pages past its first 32 MiB \(those came at [0-9.]+ GB/s, under 1 GB/s, advised huge\))" "$work/err" ||
  fail "no log line: $(cat "$work/err")"
echo "[driver_buffer] the driver's 64 MiB buffer: $(grep '^driver' "$work/out"); the program's own: $(grep '^own' "$work/out")"

for off in "PHOS_DRIVER_BUFFER_HUGE=0" "PHOS_DRIVER_BUFFER_HUGE=off"; do
  run 64 LD_PRELOAD="$libphos" "$off"
  [ "$(field driver hg)" = 0 ] || fail "$off: the driver's buffer was advised huge"
  [ "$(field driver rss_kib)" = 65536 ] || fail "$off: the driver's buffer is not populated"
  grep -q "buffer populated in" "$work/err" && fail "$off: a log line all the same"
done
echo "[driver_buffer] PHOS_DRIVER_BUFFER_HUGE=0/off: left as the driver asked"

run 16 LD_PRELOAD="$libphos"
[ "$(field driver hg)" = 0 ] || fail "a 16 MiB buffer (under 32 MiB) was advised huge"
[ "$(field driver rss_kib)" = 16384 ] || fail "a 16 MiB buffer is not populated"
run 64
[ "$(field driver hg)" = 0 ] || fail "without libphos the buffer is advised huge"
echo "[driver_buffer] under 32 MiB, and without libphos: left as asked"

run 64 LD_PRELOAD="$libphos" PHOS_FAULT=slow-huge-pages
hg driver hg 1 || fail "slow huge pages: the first 32 MiB are not advised huge: $(cat "$work/out")"
hg driver tail_hg 0 || fail "slow huge pages: the rest is still advised huge: $(cat "$work/out")"
[ "$(field driver rss_kib)" = 65536 ] || fail "slow huge pages: the buffer is not populated: $(cat "$work/out")"
[ "$(field driver data)" = ok ] || fail "slow huge pages: the buffer lost what was written"
grep -q "phos: the driver's 64.0 MiB buffer populated in [0-9.]* ms, in small pages past its first 32 MiB (those came at [0-9.]* GB/s, under 1 GB/s, advised huge)" "$work/err" ||
  fail "slow huge pages: no log line: $(cat "$work/err")"
echo "[driver_buffer] huge pages slow to come: the rest in small pages ($(grep -o 'those came at [0-9.]* GB/s' "$work/err"))"
