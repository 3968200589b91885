#!/usr/bin/env bash
# Peer access against the fake libcuda: phos maps device memory for its own
# device only, so when device 0 is granted access to device 1's memory
# (cuCtxEnablePeerAccess) every phos mapping on device 1 must get read-write
# access for device 0, later ones too, and again when the agent maps the
# memory back after a checkpoint; disabling takes it away.
set -euo pipefail
BUILD=${PHOS_BUILD:?}
dir=$BUILD/test/hooks
libphos=$BUILD/cuda_hooks/libphos.so
fail() { echo "[peer] FAIL: $*"; exit 1; }
log=$(mktemp)
out=$(mktemp)
pid=
trap '[ -n "$pid" ] && kill $pid 2>/dev/null; rm -f "$log" "$out"' EXIT

# The log with each address replaced by the allocation that holds it (the
# client prints "NAME ADDRESS"); slab blocks share their slab's address.
named() {
  local script=""
  while read -r name addr; do script+="s/access $addr /access $name /;"; done < <(grep -E '^[a-z0-9]+ 0x' "$out")
  sed -E "$script" "$log"
}

FAKE_CUDA_LOG=$log LD_PRELOAD=$libphos "$dir/peer_client" > "$out"
sed 's/^/[peer] /' "$out"
expected=$(cat <<'LINES'
access own1 4194304 1:3
access small1 2097152 1:3
access own0 4194304 0:3
mark enable
access own1 4194304 0:3
access small1 2097152 0:3
mark allocate
access later1 4194304 1:3 0:3
mark disable
access own1 4194304 0:0
access small1 2097152 0:0
access later1 4194304 0:0
mark allocate
access last1 4194304 1:3
LINES
)
diff <(echo "$expected") <(named) || fail "access on device 1 does not follow the peer grant (diff above)"

# Mapped back after a checkpoint-like round trip: the grant is applied again.
: > "$log"
exec 3< <(FAKE_CUDA_LOG=$log LD_PRELOAD=$libphos "$dir/peer_client" wait | tee "$out")
line=
until [ "${line%% *}" = ready ]; do read -r -t 10 line <&3 || fail "the client did not get ready"; done
pid=${line#ready }
"$dir/phos-agent-tool" roundtrip "$pid" | sed 's/^/[peer] /' || fail "round trip failed"
after_ready=$(named | sed -n '/^mark ready$/,$p' | tail -n +2 | sort)
expected=$(printf '%s\n' "access later1 4194304 1:3 0:3" "access own0 4194304 0:3" "access own1 4194304 1:3 0:3" \
                         "access small1 2097152 1:3 0:3")
diff <(echo "$expected") <(echo "$after_ready") || fail "the remap did not apply the peer grant again (diff above)"
echo "[peer] PASS"
