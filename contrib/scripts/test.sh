#!/usr/bin/env bash
# The test command (README, .ci/run): installs what is missing, then
#   1. builds with ASan+UBSan and runs the unit tests;
#   2. builds plainly (warnings as errors) and runs the unit tests and the
#      end-to-end tests with the real criu 4.2.1 and the real plugin;
#   3. fuzzes the image, fatbin and cubin readers for PHOS_FUZZ_SECONDS (default
#      60, in all);
# and ends with one line "tests: N passed, N failed".
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
cd "$src"

"$src/contrib/scripts/install-deps.sh"

setup() {  # setup DIR OPTIONS...
  local dir=$1; shift
  if [ -f "$dir/build.ninja" ]; then
    meson configure "$dir" "$@" >/dev/null
  else
    meson setup "$dir" "$@" >/dev/null
  fi
  ninja -C "$dir"
}

setup build-test-asan -Dwerror=true -Db_sanitize=address,undefined -Db_lundef=false -Dbuildtype=debug
setup build-test -Dwerror=true

status=0
echo "== unit tests, ASan+UBSan"
meson test -C build-test-asan --suite unit --print-errorlogs || status=1
echo "== unit and end-to-end tests (real criu $(/usr/local/sbin/criu --version | sed -n 's/^\(Version\|GitID\): //p' | paste -sd' '))"
PHOS_REQUIRE_E2E=1 meson test -C build-test --print-errorlogs || status=1
grep -E "^\[[a-z_]+\] " build-test/meson-logs/testlog.txt || true
echo "== fuzzing"
fuzz_ok=1
PHOS_FUZZ_BUILD="$src/build-test-fuzz" "$src/test/fuzz/run.sh" "${PHOS_FUZZ_SECONDS:-60}" || { fuzz_ok=0; status=1; }

# Count Catch2 cases and meson tests: one line a runner can read.
python3 - "$fuzz_ok" build-test-asan/meson-logs/testlog.json build-test/meson-logs/testlog.json <<'PY'
import json, re, sys
passed = failed = 0
fuzz_ok = sys.argv[1] == "1"
passed, failed = (1, 0) if fuzz_ok else (0, 1)
for path in sys.argv[2:]:
    for line in open(path):
        t = json.loads(line)
        out = t.get("stdout", "") or ""
        m = re.search(r"All tests passed \(\d+ assertions? in (\d+) test cases?\)", out)
        n = re.search(r"test cases: *(\d+) \| *(\d+) passed \| *(\d+) failed", out)
        name = t["name"].split(" / ")[-1]  # meson may prefix "project:suite / "
        if name == "unit" and m:
            passed += int(m.group(1))
        elif name == "unit" and n:
            passed += int(n.group(2)); failed += int(n.group(3))
        elif t["result"] in ("OK", "EXPECTEDFAIL"):
            passed += 1
        elif t["result"] != "SKIP":
            failed += 1
print(f"tests: {passed} passed, {failed} failed")
PY
exit $status
