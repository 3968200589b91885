#!/usr/bin/env bash
# phos-sigdb over test sources holding every parameter form: the database must
# equal expected.sigdb, a source that does not parse must fail the run, and
# the database must agree with the cubins nvcc compiles from the same sources
# (kernel names, parameter offsets and sizes; check_cubin.py).
#   sigdb.sh PHOS_SIGDB NVCC     (either empty when there is none)
# Skipped when the tool was not built, unless PHOS_REQUIRE_E2E is set (CI),
# which also requires nvcc.
set -euo pipefail
tool=${1:-}
nvcc=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
say() { echo "[sigdb] $*"; }
fail() { say "FAIL: $*"; exit 1; }

if [ -z "$tool" ]; then
  [ -n "${PHOS_REQUIRE_E2E:-}" ] && fail "phos-sigdb was not built (Clang 14 libTooling) and PHOS_REQUIRE_E2E is set"
  say "SKIP: phos-sigdb was not built (Clang 14 libTooling)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$here"  # the file names in the database's comments are as given

"$tool" kernels.cu lambdas.cu >"$tmp/out.sigdb" 2>"$tmp/err" || { cat "$tmp/err"; fail "phos-sigdb failed"; }
sed 's/^/[sigdb] stderr: /' "$tmp/err"
diff -u expected.sigdb "$tmp/out.sigdb" || fail "the database differs from expected.sigdb (-expected +written)"
grep -q "_ZN12_GLOBAL__N_19anonymousEPi left out" "$tmp/err" || fail "no warning for the anonymous-namespace kernel"
say "the database equals expected.sigdb ($(grep -vc -e '^#' -e '^phos-sigdb ' "$tmp/out.sigdb") kernels)"

"$tool" -o "$tmp/o.sigdb" kernels.cu lambdas.cu 2>/dev/null || fail "phos-sigdb -o failed"
cmp -s "$tmp/out.sigdb" "$tmp/o.sigdb" || fail "-o wrote something else than stdout"

printf '__global__ void NAME(const int* p) {}\n' >"$tmp/macro.cu"
"$tool" "$tmp/macro.cu" -- -DNAME=renamed >"$tmp/macro.sigdb" 2>/dev/null || fail "phos-sigdb with clang arguments failed"
grep -qx "_Z7renamedPKi const_ptr:8@0" "$tmp/macro.sigdb" || fail "the arguments after -- did not reach clang"

printf '__global__ void broken(int* p) { p = }\n' >"$tmp/broken.cu"
if "$tool" -o "$tmp/broken.sigdb" "$tmp/broken.cu" 2>"$tmp/err"; then fail "a source that does not parse passed"; fi
[ ! -e "$tmp/broken.sigdb" ] || fail "a failed run wrote its output file"
grep -q "could not be parsed" "$tmp/err" || fail "no message for the source that does not parse"

if [ -z "$nvcc" ]; then
  [ -n "${PHOS_REQUIRE_E2E:-}" ] && fail "no nvcc and PHOS_REQUIRE_E2E is set"
  say "nvcc not found: the database is not checked against a cubin"
  exit 0
fi
for f in kernels lambdas; do
  "$nvcc" -cubin -arch=sm_90 --extended-lambda -o "$tmp/$f.cubin" "$f.cu" || fail "nvcc could not compile $f.cu"
done
python3 check_cubin.py "$tmp/out.sigdb" "$tmp/kernels.cubin" "$tmp/lambdas.cubin" || fail "the database disagrees with nvcc"
say "PASS"
