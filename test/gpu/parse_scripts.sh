#!/usr/bin/env bash
# CI has no GPU, but it can at least parse the GPU suite and benchmarks: a
# quote left open in one of them (an apostrophe inside ${var:+...}) made the
# whole suite fail on the GPU host, where a call costs device minutes.
# usage: parse_scripts.sh SCRIPT...
status=0
for f in "$@"; do
  if ! out=$(bash -n "$f" 2>&1); then
    echo "[gpu_scripts_parse] FAIL: $f: $out"
    status=1
  fi
done
[ "$status" = 0 ] && echo "[gpu_scripts_parse] PASS: $# scripts parse"
exit "$status"
