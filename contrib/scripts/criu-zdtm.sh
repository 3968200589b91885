#!/usr/bin/env bash
# Runs a small set of CRIU's own zdtm tests about the restore of private
# memory on the patched criu 4.2.1 that install-criu.sh built, from the build
# tree it keeps (PHOS_CRIU_CACHE/src/<GitID>/criu-4.2.1, whose criu/criu is the
# installed binary): maps, copy-on-write with children, mprotect, growing
# stacks, threads, and the patch's own maps-threads (contrib/criu/0001-*),
# first with criu's defaults, then the multi-threaded ones again with
# --page-read-threads 4 for every restore (through CRIU_CONFIG_FILE), so that
# the pages of every multi-threaded test are read by several threads. Every
# dump with the defaults writes its pages with writer threads (0002-*, one
# per CPU); the tests with several processes and maps04 run again with
# --page-write-threads 4 (more writers than tasks or CPUs here), and a few
# with --page-write-threads 1 (the old path: chunks in criu's main thread).
# unlink_mmap03 (0004-*) maps a file whose path is gone while it is linked
# under another name: dumped and restored with a link remap as before, and
# with --norst (a --leave-running dump) dumped as a ghost file.
# A few run with zdtm's --norst: dumped with --leave-running and not
# restored, the test checks its memory as it runs on; there criu lets the
# tasks go once their pages are copied and writes the copies after (0005-*),
# which the dump log must say.
#
# Tests run in the host flavour (no namespaces) to fit CI's time. zdtm runs a
# test as uid 18943 unless its .desc says "suid", and criu then needs
# CAP_SYS_RESOURCE (prlimit of another user's task); where root lacks it (a
# container) the tests run as root instead: the tree's .desc files get "suid".
#
# Prints one "[criu_zdtm] TEST (OPTIONS): PASS|FAIL" line per run and
# "criu zdtm: N passed, N failed"; exits 1 if any failed, 77 (a skip for
# meson) with the reason where zdtm can't run here.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${PHOS_CRIU_CACHE:-/var/cache/phos-criu}
skip() { echo "[criu_zdtm] SKIP: $*"; exit 77; }

patches=()
for p in "$here"/../criu/*.patch; do [ -f "$p" ] && patches+=("$p"); done
[ ${#patches[@]} -gt 0 ] || skip "no patches in contrib/criu"
gitid=v4.2.1-phos-$(cat "${patches[@]}" | sha256sum | cut -c1-12)
tree=$cache/src/$gitid/criu-4.2.1
[ "$(id -u)" -eq 0 ] || skip "zdtm needs root"
[ -x "$tree/criu/criu" ] && [ -f "$tree/test/zdtm.py" ] \
  || skip "no patched criu build tree at $tree (contrib/scripts/install-criu.sh makes it)"
py=/usr/bin/python3
"$py" -c 'import yaml, google.protobuf' 2>/dev/null \
  || skip "zdtm needs $py with yaml and protobuf (python3-yaml, python3-protobuf)"
command -v make >/dev/null && command -v gcc >/dev/null || skip "zdtm needs make and gcc"

tests=(maps00 maps01 maps02 maps04 maps05 maps06 maps11 mprotect00 mem-touch cow00 cow01
       grow_map02 grow_map03 pthread00 pthread01 pthread_timers seccomp_filter_threads maps-threads
       unlink_mmap03)
threaded=(pthread00 pthread01 pthread_timers seccomp_filter_threads maps-threads)
writers=(cow00 cow01 maps04 maps-threads)
serial_writer=(maps00 cow01 mprotect00)
leave_running=(maps04 cow01 mem-touch maps-threads)

log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
make_args=(-j"$(nproc)")
if command -v ccache >/dev/null; then
  make_args+=(CC="ccache gcc")
  export CCACHE_BASEDIR=$tree CCACHE_NOHASHDIR=1
fi
# pycriu (lib/pycriu), zdtm's library and the tests' programs.
if ! { make -C "$tree" "${make_args[@]}" lib && make -C "$tree/test/zdtm/lib" "${make_args[@]}" \
       && make -C "$tree/test/zdtm/static" "${make_args[@]}" "${tests[@]}"; } > "$log/build.log" 2>&1; then
  tail -n 30 "$log/build.log"
  echo "[criu_zdtm] FAIL: building zdtm"
  echo "criu zdtm: 0 passed, 1 failed"
  exit 1
fi

# CAP_SYS_RESOURCE is bit 24 of the effective set.
if (( (16#$(sed -n 's/^CapEff:\t*//p' /proc/self/status) >> 24 & 1) == 0 )); then
  echo "[criu_zdtm] root lacks CAP_SYS_RESOURCE here: the tests run as root (suid)"
  "$py" - "$tree/test/zdtm/static" "${tests[@]}" <<'PY'
import ast, os, sys
d = sys.argv[1]
for t in sys.argv[2:]:
    path = os.path.join(d, t + ".desc")
    desc = ast.literal_eval(open(path).read()) if os.path.exists(path) else {}
    flags = desc.get("flags", "").split()
    if "suid" not in flags:
        desc["flags"] = " ".join(flags + ["suid"])
        open(path, "w").write(repr(desc) + "\n")
PY
fi

passed=0 failed=0
# ZDTM_ARGS: more options of zdtm.py run, e.g. --norst.
run() {  # run LABEL TEST [DUMP_LOG_PATTERN]: one zdtm run, environment as set by the caller
  local label=$1 t=$2 want=${3:-} out keep=() dumps=$tree/test/dump/zdtm/static/$2
  local extra=()
  read -ra extra <<< "${ZDTM_ARGS:-}"
  out=$log/$t.$passed.$failed.log
  # With a pattern the images (and criu's logs) are kept, to check the path the dump took.
  if [ -n "$want" ]; then keep=(--keep-img always); rm -rf "$dumps"; fi
  if (cd "$tree/test" && PATH=/usr/sbin:/usr/bin:/sbin:/bin timeout -k 10 300 \
        "$py" zdtm.py run -t "zdtm/static/$t" -f h --criu-bin ../criu/criu --pycriu-search-path ../lib "${keep[@]}" "${extra[@]}") \
        > "$out" 2>&1 && grep -q "Test zdtm/static/$t PASS" "$out"; then
    # (grep reads the logs itself: with a pipe, grep -q's early exit fails cat under pipefail)
    if [ -n "$want" ] && ! grep -qs -- "$want" "$dumps"/*/*/dump.log; then
      echo "[criu_zdtm] $t ($label): FAIL: no dump log says '$want'"
      failed=$((failed + 1))
    else
      echo "[criu_zdtm] $t ($label): PASS"
      passed=$((passed + 1))
    fi
  else
    echo "[criu_zdtm] $t ($label): FAIL"
    grep -E "FAIL|Error \(|fail" "$out" | grep -v RLIMIT_NOFILE | head -n 12 || tail -n 20 "$out"
    failed=$((failed + 1))
  fi
  if [ -n "$want" ]; then rm -rf "$dumps"; fi
}
echo "[criu_zdtm] $("$tree/criu/criu" --version | tr '\n' ' ')"
for t in "${tests[@]}"; do run defaults "$t"; done
echo "page-read-threads 4" > "$log/criu.conf"
for t in "${threaded[@]}"; do CRIU_CONFIG_FILE=$log/criu.conf run "--page-read-threads 4" "$t"; done
echo "page-write-threads 4" > "$log/writers.conf"
for t in "${writers[@]}"; do
  CRIU_CONFIG_FILE=$log/writers.conf run "--page-write-threads 4" "$t" "bytes of pages of .* tasks with 4 threads"
done
echo "page-write-threads 1" > "$log/serial.conf"
for t in "${serial_writer[@]}"; do
  CRIU_CONFIG_FILE=$log/serial.conf run "--page-write-threads 1" "$t" "Writing pages in the main thread (--page-write-threads 1)"
done
ZDTM_ARGS=--norst run "--norst: --leave-running" unlink_mmap03 "as a ghost file: its path is gone"
for t in "${leave_running[@]}"; do
  ZDTM_ARGS=--norst run "--norst: --leave-running" "$t" "Copied [0-9]* bytes of pages of [0-9]* tasks in .* tasks resumed; wrote them in"
done
echo "criu zdtm: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
