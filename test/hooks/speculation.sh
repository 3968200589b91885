#!/usr/bin/env bash
# Read/write-set speculation in libphos.so against the fake libcuda
# (speculation_client.c says what it launches): with PHOS_SPECULATE=1 each
# kernel's sets follow from its parameter kinds (mangled name, signature
# database, or none: every word tried), a kernel without a layout is unknown
# unless its arguments come packed, a copy gets an exact set; the stats file
# and the agent (phosctl kernels) say so. Without PHOS_SPECULATE nothing is
# speculated; `phosctl speculate PID on` turns it on in a running process.
set -euo pipefail
BUILD=${PHOS_BUILD:?}
dir=$BUILD/test/hooks
libphos=$BUILD/cuda_hooks/libphos.so
phosctl=$BUILD/plugin/phosctl
fail() { echo "[speculation] FAIL: $*"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

run() {  # run STATS [ENV...]
  local stats=$1; shift
  env LD_PRELOAD="$libphos" PHOS_STATS_FILE="$stats" "$@" "$dir/speculation_client" ${CLIENT_ARGS:-} > "$stats.out"
  grep -qx "calls failed 0" "$stats.out" || fail "a call failed through libphos.so: $(tr '\n' ' ' < "$stats.out")"
}
expect() {  # expect STATS LINE-REGEX WHAT
  grep -Eq "$2" "$1" || fail "$3: no line like '$2' in: $(grep '^speculat' "$1" | tr '\n' '|')"
}

run "$work/plain" PHOS_SPECULATE=1
grep "^speculat" "$work/plain" | sed "s/^/[speculation] /"
expect "$work/plain" '^speculated _Z5saxpyPKfPffi launches=2 exact=0 speculated=2 unknown=0 buffers=4 reads=4 writes=2 types=name$' \
  "saxpy: x read, y read and written, twice, from the mangled name"
expect "$work/plain" '^speculated closure_kernel launches=1 exact=0 speculated=1 unknown=0 buffers=2 reads=2 writes=2 types=none$' \
  "closure_kernel without a signature database: both pointers in the struct may be written"
expect "$work/plain" '^speculated noinfo launches=2 exact=0 speculated=1 unknown=1 buffers=1 reads=1 writes=1 types=none$' \
  "noinfo: unknown with kernelParams, the packed buffer scanned"
expect "$work/plain" '^speculation kernels=3 launches=5 exact=0 speculated=4 unknown=1 calls=1 calls_exact=1 calls_unknown=0 buffers=9 .* indexed=4 lookup_rate=[1-9]' \
  "totals: 5 launches, one exact copy, 4 buffers indexed, a lookup rate"

printf 'phos-sigdb 1\n# the test closure\nclosure_kernel scalar:4 struct:24{8:const_ptr,16:ptr}\n' > "$work/test.sigdb"
run "$work/sigdb" PHOS_SPECULATE=1 PHOS_SIGDB="$work/test.sigdb"
expect "$work/sigdb" '^speculated closure_kernel launches=1 exact=0 speculated=1 unknown=0 buffers=2 reads=2 writes=1 types=sigdb$' \
  "closure_kernel with the signature database: only the struct's mutable pointer is written"

# With nvcc's fatbin as the module: saxpy's layout is checked against its
# cubin, and agrees.
if [ -n "${PHOS_TEST_SAXPY_FATBIN:-}" ]; then
  run "$work/cubin" PHOS_SPECULATE=1 PHOS_TEST_FATBIN="$PHOS_TEST_SAXPY_FATBIN"
  expect "$work/cubin" ' cubin_checked=1 ' "saxpy's layout was not checked against nvcc's cubin"
  ! grep -q ' note=' "$work/cubin" || fail "layout sources disagree: $(grep -o ' note=.*' "$work/cubin")"
  expect "$work/cubin" ' cubin_unreadable=0 index_refused=0 ' "a readable cubin counted as unreadable"
  # The same fatbin with its cubin's ELF header wiped: counted, not mistaken for PTX only.
  python3 -c 'import sys; b = bytearray(open(sys.argv[1], "rb").read()); b[0x50:0x90] = bytes(0x40); open(sys.argv[2], "wb").write(b)' \
    "$PHOS_TEST_SAXPY_FATBIN" "$work/broken.fatbin"
  run "$work/broken" PHOS_SPECULATE=1 PHOS_TEST_FATBIN="$work/broken.fatbin"
  expect "$work/broken" ' cubin_checked=0 cubin_unreadable=1 ' "a fatbin whose cubin cannot be read is not counted"
else
  echo "[speculation] no nvcc: the cubin cross-check is not tested here"
fi

# Validation with PTX twins (PHOS_VALIDATE=ptx): saxpy loaded as PTX runs
# as its twin with its speculated write set (y) as the range table; the
# fake twin writes y, and with the planted FAKE_SAXPY_WRITES_X=1 also x (a
# pointer to const): each such write outside the table counts, with the
# first address. Kernels the PTX does not define are not validated, and say
# why.
if [ -n "${PHOS_TEST_SAXPY_PTX:-}" ]; then
  run "$work/valid" PHOS_VALIDATE=ptx PHOS_TEST_PTX="$PHOS_TEST_SAXPY_PTX"
  grep '^validat' "$work/valid" | sed 's/^/[speculation] /'
  expect "$work/valid" '^validation modules=1 twins=1 incomplete=0 validated=2 pending=0 violations=0 .* sass=off ' \
    "saxpy's two launches ran as its twin, with no violation"
  expect "$work/valid" '^validated _Z5saxpyPKfPffi launches=2 violations=0 launches_with_violations=0 via=ptx$' "saxpy validated"
  expect "$work/valid" '^validated closure_kernel launches=0 .* skipped=not a kernel of the module.s PTX$' \
    "a function the PTX does not define is not validated by a twin"
  run "$work/planted" PHOS_VALIDATE=ptx PHOS_TEST_PTX="$PHOS_TEST_SAXPY_PTX" FAKE_SAXPY_WRITES_X=1
  x=$(awk '$1 == "x" {print $2}' "$work/planted.out")
  xs=$(printf '0x%x' $((x + 16)))
  expect "$work/planted" "^validated _Z5saxpyPKfPffi launches=2 violations=2 launches_with_violations=2 first=$xs site=0 via=ptx\$" \
    "the planted write to x (speculated read only) is caught, at x"
  # Twins are built off the launch path: while the program pauses after
  # loading the module, the builder thread builds them; the first launch
  # finds them built. PHOS_TWIN_BUILD=launch builds them at the first launch.
  { sleep 1; echo; echo; } | env LD_PRELOAD="$libphos" PHOS_STATS_FILE="$work/background" PHOS_VALIDATE=ptx \
    PHOS_TEST_PTX="$PHOS_TEST_SAXPY_PTX" "$dir/speculation_client" wait > "$work/background.out"
  grep -qx "calls failed 0" "$work/background.out" || fail "a call failed with twins built in the background"
  expect "$work/background" '^validation modules=1 twins=1 incomplete=0 validated=2 .* twin_background_builds=1 ' \
    "the builder thread built saxpy's twins while the program paused"
  expect "$work/background" '^validated _Z5saxpyPKfPffi launches=2 violations=0 launches_with_violations=0 via=ptx$' \
    "saxpy validated by the twin built in the background"
  run "$work/at_launch" PHOS_VALIDATE=ptx PHOS_TEST_PTX="$PHOS_TEST_SAXPY_PTX" PHOS_TWIN_BUILD=launch
  expect "$work/at_launch" '^validation modules=1 twins=1 incomplete=0 validated=2 .* twin_background_builds=0 ' \
    "PHOS_TWIN_BUILD=launch: twins built at the first launch"
  # The same kernel from nvcc's fatbin: its compute_90 PTX is taken.
  run "$work/fatbin_ptx" PHOS_VALIDATE=ptx PHOS_TEST_FATBIN="$PHOS_TEST_SAXPY_FATBIN"
  expect "$work/fatbin_ptx" '^validated _Z5saxpyPKfPffi launches=2 violations=0 launches_with_violations=0 via=ptx$' \
    "saxpy validated from the PTX inside its fatbin"
  # A bare cubin, as Triton loads it: its PTX comes from Triton's cache.
  mkdir -p "$work/triton/0123abcd"
  cp "$PHOS_TEST_SAXPY_CUBIN" "$work/triton/0123abcd/saxpy.cubin"
  cp "$PHOS_TEST_SAXPY_PTX" "$work/triton/0123abcd/saxpy.ptx"
  run "$work/triton_cubin" PHOS_VALIDATE=ptx PHOS_TEST_FATBIN="$PHOS_TEST_SAXPY_CUBIN" TRITON_CACHE_DIR="$work/triton"
  expect "$work/triton_cubin" '^validated _Z5saxpyPKfPffi launches=2 violations=0 launches_with_violations=0 via=ptx$' \
    "saxpy's cubin validated with the PTX from Triton's cache"
  run "$work/no_cache" PHOS_VALIDATE=ptx PHOS_TEST_FATBIN="$PHOS_TEST_SAXPY_CUBIN" TRITON_CACHE_DIR="$work/none"
  expect "$work/no_cache" '^validation modules=0 .* validated=0 ' "a cubin without PTX anywhere is not validated by a twin"

  # The SASS-level validator, with the fake Sanitizer API: attached before
  # the program's first CUDA call, it patches the cubin's module at the
  # first validated launch, sets the launch's range table for the kernel
  # and clears it after; the fake driver runs "the patch" on saxpy's
  # writes in a patched module.
  sanitizer="PHOS_SANITIZER_LIB=$PHOS_TEST_SANITIZER_LIB"
  run "$work/sass" PHOS_VALIDATE=sass "$sanitizer" PHOS_TEST_FATBIN="$PHOS_TEST_SAXPY_CUBIN"
  grep '^validat' "$work/sass" | sed 's/^/[speculation] /'
  expect "$work/sass" '^validation modules=0 twins=0 incomplete=0 validated=3 pending=0 violations=0 .* sass=attached sass_modules=1 ' \
    "saxpy's and closure_kernel's launches validated in their patched module"
  expect "$work/sass" '^validated _Z5saxpyPKfPffi launches=2 violations=0 launches_with_violations=0 via=sass$' "saxpy validated at the SASS level"
  expect "$work/sass" '^validated closure_kernel launches=1 violations=0 launches_with_violations=0 via=sass$' \
    "closure_kernel validated at the SASS level"
  run "$work/sass_planted" PHOS_VALIDATE=sass "$sanitizer" PHOS_TEST_FATBIN="$PHOS_TEST_SAXPY_CUBIN" FAKE_SAXPY_WRITES_X=1
  x=$(awk '$1 == "x" {print $2}' "$work/sass_planted.out")
  xs=$(printf '0x%x' $((x + 16)))
  expect "$work/sass_planted" "^validated _Z5saxpyPKfPffi launches=2 violations=2 launches_with_violations=2 first=$xs site=0 via=sass\$" \
    "the planted write to x is caught by the patch, at x"
  # Both (PHOS_VALIDATE=1): the twin where there is one, the patch for the rest.
  run "$work/both" PHOS_VALIDATE=1 "$sanitizer" PHOS_TEST_PTX="$PHOS_TEST_SAXPY_PTX"
  expect "$work/both" '^validated _Z5saxpyPKfPffi launches=2 .* via=ptx$' "saxpy runs as its twin"
  expect "$work/both" '^validated closure_kernel launches=1 .* via=sass$' "closure_kernel, not in the PTX, is patched"
  # Switched at run time (phosctl validate): off unpatches the module, on
  # patches it again at the next validated launch; each validated launch
  # sets its kernel's table and clears it after.
  mkfifo "$work/vin"
  env FAKE_SANITIZER_LOG="$work/sanitizer.log" PHOS_VALIDATE=sass "$sanitizer" PHOS_TEST_FATBIN="$PHOS_TEST_SAXPY_CUBIN" \
    PHOS_STATS_FILE="$work/switch" LD_PRELOAD="$libphos" "$dir/speculation_client" wait again < "$work/vin" > "$work/switch.out" &
  vpid=$!
  exec 4> "$work/vin"
  said() { for _ in $(seq 100); do grep -qx "$1" "$work/switch.out" && return 0; sleep 0.05; done; fail "the client never said '$1'"; }
  said ready; echo >&4; said launched
  "$phosctl" validate "$vpid" off > "$work/vctl.out" 2>&1 || fail "phosctl validate off: $(cat "$work/vctl.out")"
  "$phosctl" validate "$vpid" on >> "$work/vctl.out" 2>&1 || fail "phosctl validate on: $(cat "$work/vctl.out")"
  echo >&4; said again; echo >&4
  exec 4>&-
  wait "$vpid" || fail "the client failed: $(cat "$work/switch.out")"
  grep -qx "process $vpid: validation off" "$work/vctl.out" || fail "phosctl validate says: $(cat "$work/vctl.out")"
  sequence=$(grep -E '^(patch|unpatch)' "$work/sanitizer.log" | tr '\n' ' ')
  [ "$sequence" = "patch module unpatch module patch module " ] || fail "patched, unpatched, patched again: got '$sequence'"
  [ "$(grep -c '^data _Z5saxpyPKfPffi set$' "$work/sanitizer.log")" = 3 ] &&
    [ "$(grep -c '^data _Z5saxpyPKfPffi clear$' "$work/sanitizer.log")" = 3 ] ||
    fail "saxpy's table not set and cleared around each of its 3 validated launches: $(tr '\n' '|' < "$work/sanitizer.log")"
  expect "$work/switch" '^validation .* validated=4 .* sass=attached sass_modules=2 ' "4 launches validated, the module patched twice"
  # A library that is not the Sanitizer API: said, and validation goes on with the twins.
  run "$work/no_sanitizer" PHOS_VALIDATE=1 PHOS_SANITIZER_LIB=/nonexistent/libsanitizer-public.so \
    PHOS_TEST_PTX="$PHOS_TEST_SAXPY_PTX" 2> "$work/no_sanitizer.err"
  grep -q "SASS-level validation unavailable: cannot load the Sanitizer API" "$work/no_sanitizer.err" ||
    fail "a missing Sanitizer API library is not reported: $(cat "$work/no_sanitizer.err")"
  expect "$work/no_sanitizer" '^validated _Z5saxpyPKfPffi launches=2 .* via=ptx$' "twins run without the Sanitizer API"
else
  echo "[speculation] no nvcc: validation is not tested here"
fi

# Recording too: kernel records carry their sets (unit and first byte of each buffer).
run "$work/record" PHOS_SPECULATE=1 PHOS_RECORD_LAUNCHES=1
x=$(awk '$1 == "x" {print $2}' "$work/record.out"); y=$(awk '$1 == "y" {print $2}' "$work/record.out")
expect "$work/record" "^record 0 kernel _Z5saxpyPKfPffi module=1 set=speculated r:#[0-9]+@$x rw:#[0-9]+@$y\$" \
  "the launch record names saxpy's set"
expect "$work/record" '^record 3 kernel noinfo module=1 set=unknown$' "the launch record says noinfo's set is unknown"

# A module unloaded and a new kernel given its kernel's CUfunction: the new
# kernel gets its own layout, not the old one's (which would read four
# kernelParams of a two-parameter kernel).
CLIENT_ARGS=reuse run "$work/reuse" PHOS_SPECULATE=1
! grep -q "handle not reused" "$work/reuse.out" || fail "the fake driver did not reuse the handle"
expect "$work/reuse" '^speculated _Z5saxpyPKfPffi launches=1 .* types=name$' "saxpy before its module's unload"
expect "$work/reuse" '^speculated closure_kernel launches=1 exact=0 speculated=1 unknown=0 buffers=2 reads=2 writes=2 types=none$' \
  "closure_kernel under saxpy's old handle"
# The launch record's kernel table likewise.
CLIENT_ARGS=reuse run "$work/reuse_record" PHOS_RECORD_LAUNCHES=1
expect "$work/reuse_record" '^kernel closure_kernel 1 module=2 params=0:4,8:24$' \
  "the launch record kept saxpy's layout for closure_kernel under the reused handle"

run "$work/off"
! grep -q '^speculat' "$work/off" || fail "speculated without PHOS_SPECULATE: $(grep '^speculat' "$work/off" | head -n2)"

# Turned on through the agent in a running process, seen through it.
mkfifo "$work/in"
LD_PRELOAD="$libphos" "$dir/speculation_client" wait < "$work/in" > "$work/live.out" &
pid=$!
exec 3> "$work/in"
wait_for() { for _ in $(seq 100); do grep -qx "$1" "$work/live.out" && return 0; sleep 0.05; done; fail "the client never said '$1'"; }
wait_for ready
"$phosctl" speculate "$pid" on > "$work/ctl.out" 2>&1 || fail "phosctl speculate on: $(cat "$work/ctl.out")"
echo >&3
wait_for launched
"$phosctl" kernels "$pid" > "$work/kernels.out" 2>&1 || fail "phosctl kernels: $(cat "$work/kernels.out")"
"$phosctl" status "$pid" > "$work/status.out" 2>&1 || fail "phosctl status: $(cat "$work/status.out")"
echo >&3
exec 3>&-
wait "$pid"
sed 's/^/[speculation] phosctl: /' "$work/kernels.out"
grep -q "speculation: on, 4 buffers indexed" "$work/status.out" || fail "status does not say speculation is on: $(tr '\n' '|' < "$work/status.out")"
# The agent names each GPU of the process's memory by UUID (the fake's
# device 0), which the plugin maps into its own numbering.
grep -qx "  device 0: GPU-a0a1a2a3-a4a5-a6a7-a8a9-aaabacadae00" "$work/status.out" ||
  fail "status does not name device 0 by its UUID: $(tr '\n' '|' < "$work/status.out")"
grep -Eq '^ +2 +0 +2 +0 +2\.0 +4 +2 +name +saxpy\(float const\*, float\*, float, int\)' "$work/kernels.out" ||
  fail "phosctl kernels does not list saxpy with its sets and demangled name"

echo "[speculation] PASS"
