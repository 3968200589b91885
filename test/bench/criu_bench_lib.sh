# Shared by criu_pages.sh and criu_dump_tree.sh (sourced): the two criu
# binaries, the hog, where the images go, and the checks that they are there.
#   criu_bench_init NAME: sets src, CRIU, CRIU_UNPATCHED, hog, dir, runs; exits
#   with a message (prefixed NAME) if not root or a binary is missing.
# Environment: CRIU (default /usr/local/sbin/criu), CRIU_UNPATCHED (default
# the one `PHOS_CRIU_UNPATCHED=1 install-criu.sh` builds, or the bundle's),
# PHOS_BUILD, PHOS_CRIU_PAGES_HOG, PHOS_BENCH_DIR (default /dev/shm),
# PHOS_BENCH_RUNS (default 3).
criu_bench_init() {
  local name=$1 c
  src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  CRIU=${CRIU:-/usr/local/sbin/criu}
  if [ -z "${CRIU_UNPATCHED:-}" ]; then
    for c in /var/cache/phos-criu/unpatched/sbin/criu "${PHOS_BUNDLE:-$src/bundle}/criu-unpatched/criu"; do
      if [ -x "$c" ]; then CRIU_UNPATCHED=$c; break; fi
    done
  fi
  local build=${PHOS_BUILD:-$src/build}
  hog=${PHOS_CRIU_PAGES_HOG:-$build/test/bench/phos-criu-pages-hog}
  dir=${PHOS_BENCH_DIR:-/dev/shm}
  runs=${PHOS_BENCH_RUNS:-3}
  if [ "$(id -u)" -ne 0 ]; then echo "$name: needs root" >&2; exit 1; fi
  if [ ! -x "$hog" ]; then
    echo "$name: no $hog (build the tree, or set PHOS_BUILD / PHOS_CRIU_PAGES_HOG)" >&2; exit 1
  fi
  if [ -z "${CRIU_UNPATCHED:-}" ] || [ ! -x "$CRIU_UNPATCHED" ]; then
    echo "$name: no unpatched criu (PHOS_CRIU_UNPATCHED=1 contrib/scripts/install-criu.sh builds one, or set CRIU_UNPATCHED)" >&2
    exit 1
  fi
}

# criu_bench_ver CRIU: its version on one line
criu_bench_ver() { "$1" --version | tr '\n' ' ' | sed 's/ *$//'; }

# criu_bench_stamp LOG LINE: criu's timestamp (seconds) of the first line matching LINE
criu_bench_stamp() { sed -n "s/^(\([0-9.]*\)).*$2.*/\1/p" "$1" | head -n1; }
