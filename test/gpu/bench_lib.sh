# Helpers of the GPU benchmarks (bench_cow.sh, bench_recopy.sh) and the
# suite's recopy cases: functions only, sourced.

# bench_tmpfs NAME GIB: images on a tmpfs of huge pages of its own at
# /mnt/phos-NAME (/dev/shm holds half of the host's memory, too little for
# the largest images), unless PHOS_BENCH_SHM names a directory; warmed with
# GIB GiB (the host's memory grows on first use); TMPDIR set to it.
bench_tmpfs() {
  local shm=${PHOS_BENCH_SHM:-/mnt/phos-$1} opts=size=$(($2 + 16))G,huge=within_size
  if [ -z "${PHOS_BENCH_SHM:-}" ]; then
    if mountpoint -q "$shm"; then mount -o remount,"$opts" "$shm"
    else mkdir -p "$shm" && mount -t tmpfs -o "$opts" "phos-$1" "$shm"; fi ||
      { echo "$1: cannot mount a tmpfs on $shm" >&2; exit 1; }
  fi
  echo "[$1] warming $shm with $2 GiB"
  fallocate -l "${2}G" "$shm/warm" && rm -f "$shm/warm"
  export TMPDIR=$shm
}

# downtime_ms LOG: from the last "closing its gate" in criu's log to its
# "Dumping finished successfully" (after which the process is gone), in ms.
downtime_ms() {
  awk '/phos: process [0-9]+: closing its gate/ {g = substr($1, 2) + 0}
       /Dumping finished successfully/ {d = substr($1, 2) + 0}
       END {if (g && d) printf "%.0f", (d - g) * 1000}' "$1"
}

# step_times T0 STEPS: from a torch_loop.py STEPS file ("STEP END_UNIX_S MS"),
# "BEFORE HIT" in ms, from the intervals between step ends (a stop that
# lands between two steps counts too): the median of the 5 intervals that
# ended before T0, and the longest of the 3 that ended after it.
step_times() {
  awk -v t0="$1" '
    prev && $2 < t0 {b[++nb] = ($2 - prev) * 1000}
    prev && $2 >= t0 && na < 3 {na++; if (($2 - prev) * 1000 > h) h = ($2 - prev) * 1000}
    {prev = $2}
    END {for (i = 1; i <= 5 && nb - i + 1 > 0; i++) v[i] = b[nb - i + 1]; n = i - 1
         for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j-1] > v[j]; j--) {t = v[j]; v[j] = v[j-1]; v[j-1] = t}
         printf "%.0f %.0f\n", v[int((n + 1) / 2)], h}' "$2"
}

# step_times_between T0 FROM TO STEPS: from a torch_loop.py STEPS file
# ("STEP END_UNIX_S MS"; MS the step's own time, without its pace),
# "BEFORE DURING MOST N" in ms: the median of the steps that ended in the 5 s
# before T0, and the median and the longest of the N steps that ran wholly
# within [FROM, TO] (unix seconds); "-" where there are none.
step_times_between() {
  awk -v t0="$1" -v from="$2" -v to="$3" '
    function median(v, n,   i, j, t) {
      for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] > v[j]; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
      return n ? sprintf("%.1f", v[int((n + 1) / 2)]) : "-"
    }
    $2 < t0 && $2 >= t0 - 5 { b[++nb] = $3 + 0 }
    $2 - $3 / 1000 >= from && $2 <= to { d[++nd] = $3 + 0; if ($3 + 0 > most) most = $3 + 0 }
    END { printf "%s %s %s %d\n", median(b, nb), median(d, nd), nd ? sprintf("%.1f", most) : "-", nd }' "$4"
}

# criu_log_at LOG ERE [last]: the seconds (criu's "(SS.uuuuuu)" prefix:
# since criu started) of the first line of LOG matching ERE (of the last
# with "last"); nothing when none does.
criu_log_at() {
  awk -v last="${3:-}" -v re="$2" '$0 ~ re {t = substr($1, 2) + 0; found = 1; if (last == "") exit}
       END {if (found) printf "%.6f", t}' "$1" 2>/dev/null
}

# image_stats NAME...: the statistics of the image in $IMG (phosctl show
# --json), the named ones in order, comma-separated: bytes as MiB (names
# ending in _bytes), times as ms (_ns), gate_closed_unix_ns as unix seconds.
image_stats() {
  "$PHOSCTL" show --json "$IMG" | python3 -c '
import json, sys
s = json.load(sys.stdin)["images"][0]["statistics"]
out = []
for name in sys.argv[1:]:
    v = s.get(name, 0)
    out.append("%.6f" % (v / 1e9) if name == "gate_closed_unix_ns" else "%.0f" % (v / 2**20) if name.endswith("_bytes")
               else "%.0f" % (v / 1e6) if name.endswith("_ns") else str(v))
print(",".join(out))' "$@"
}

# Wall-clock time (s), and the seconds from one to another, for the tables.
now() { date +%s.%N; }
dt() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", b - a}'; }

# proc_alive PID: the process exists and is not a zombie (a killed process
# whose reaper, init or a subreaper, has not waited for it yet holds no
# memory any more).
proc_alive() {
  [ -e "/proc/$1" ] && [ "$(awk '/^State:/ {print $2}' "/proc/$1/status" 2>/dev/null)" != Z ]
}

# awk functions for the tables: gather(key, first, last) adds this row's
# columns first..last to vals[key, col] (space-separated; the keys in
# order[1..k], as first seen); median(key, col) of the values gathered.
# Prepend them to an awk program:
#   awk -F, "$awk_median"' NR > 1 { gather($1 "," $2, 3, 9) } END { ... median(order[i], c) ... }'
awk_median='
  function gather(key, first, last,   c) {
    if (!(key in seen)) { seen[key] = 1; order[++k] = key }
    for (c = first; c <= last; c++) vals[key, c] = vals[key, c] " " $c
  }
  function median(key, col,   n, i, j, v, t) {
    n = split(vals[key, col], v, " ")
    for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
    return v[int((n + 1) / 2)]
  }'
