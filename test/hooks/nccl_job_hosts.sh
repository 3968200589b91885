#!/usr/bin/env bash
# A job across two "hosts" on one machine, against the fake libnccl: two
# network namespaces joined by a veth pair (10.77.0.1, 10.77.0.2), each with
# a tree of its own (its own cwd, its own PHOS_NCCL_RENDEZVOUS_DIR, so that
# /dev/shm cannot join them by accident), dumped and restored by its own
# criu (the real criu and plugin) through `phosctl job`, run from host 0
# outside both trees:
#   host 0: phos-tcpstore (the job's TCPStore, where torchrun's agent would
#           be) -> launcher -> rank 0
#   host 1: launcher -> rank 1
# Both ranks keep an idle connection to the store (as torch's do), so the
# dumps take established TCP connections (--tcp-established) and the store
# is frozen and restored with host 0's tree. Cases:
#   1. a leave-running job dump: both ranks made again from one new id
#      through the store, counters going on, the store's keys cleaned;
#   2. a stopped job dump, a job restore, and a second restore of the same
#      images (another resume run, again one new id);
#   3. a plain criu restore of one host's images: refused, saying why;
#      hosts' records of two different dumps: the job restore refused;
#   4. host 1's CHECKPOINT_DEVICES failing in a stopped dump: both hosts'
#      dumps fail, neither image is marked whole, both ranks go on (made
#      again under the dump run);
#   4b. the same in a leave-running dump (voted in the plugin's fini, no
#      action script): host 0's criu fails at its exit, and the job record
#      an earlier dump left in its directory is gone;
#   5. a refusal on host 1 (a buffer registration), a rank without an
#      agent, and host 1's step exiting at once: the dump given up before
#      any release, both ranks go on;
#   6. host 1's step SIGKILLed after its ranks are held, before `go`
#      (driven through the SDK, phos.job.dump, which names host 1): host 0
#      lifts its stops, host 1's rank stays held until its stop's lease
#      (job_lease_ms, 10 s) runs out, then both go on with their first
#      communicator, as in an uninterrupted run;
#   7. a leave-running dump (through the SDK) whose host 1 takes 4 s in
#      CHECKPOINT_DEVICES under a 1.5 s lease: criu's quiesce took each stop
#      over, no agent lifted one, the job committed and went on;
#   8. the same whose host 1 takes 3 s in PAUSE_DEVICES, before its quiesce,
#      under a 1 s lease (criu's pauses of a large job outlasting a lease):
#      the steps' last renewal leased the stops for the job's timeout, so
#      none ran out before criu's quiesce took it over; the job committed.
export PHOS_WORKLOAD=${PHOS_BUILD:?}/test/hooks/nccl_host_client
source "$(dirname "$0")/../e2e/lib.sh"
TCPSTORE=$BUILD/test/tools/phos-tcpstore
export NS_BASE=phos-h$$-  # namespaces phos-h<pid>-0 and -1: another run of this test may share the machine
STORE_HOST=10.77.0.1 STORE_PORT=29500
NET_ARGS=(--tcp-established --network-lock nftables)
declare -a ROOT

for tool in ip nsenter unshare; do
  command -v $tool >/dev/null || { say "SKIP: no $tool"; exit 77; }
done

in_host() { local i=$1; shift; nsenter --net=/run/netns/${NS_BASE}$i "$@"; }
host_pids() { ip netns pids "${NS_BASE}$1" 2>/dev/null || true; }
# kill_host I: every process of host I ended, and gone (its sockets free
# for the next restore), within 10 s.
kill_host() {
  local p
  for _ in $(seq 200); do
    p=$(host_pids "$1")
    [ -z "$p" ] && return 0
    kill -9 $p 2>/dev/null || true
    sleep 0.05
  done
  say "host $1 still has processes: $(host_pids "$1")"
}

setup_hosts() {
  ip netns add ${NS_BASE}0 && ip netns add ${NS_BASE}1 || fail "cannot make network namespaces"
  ip link add pv$$a type veth peer name pv$$b || fail "cannot make a veth pair"
  ip link set pv$$a netns ${NS_BASE}0 && ip link set pv$$b netns ${NS_BASE}1
  ip -n ${NS_BASE}0 addr add 10.77.0.1/24 dev pv$$a && ip -n ${NS_BASE}1 addr add 10.77.0.2/24 dev pv$$b
  for i in 0 1; do ip -n ${NS_BASE}$i link set lo up; done
  ip -n ${NS_BASE}0 link set pv$$a up && ip -n ${NS_BASE}1 link set pv$$b up
  # How the driver runs a host's step: in that host's namespace, with a
  # fault injected on FAULT_HOST only.
  cat > "$WORK/via.sh" <<'EOF'
#!/bin/sh
i=$1; shift
if [ "$i" = "${FAULT_HOST:-}" ]; then export PHOS_FAULT="$FAULT"; fi
if [ "$i" = "${DEAD_HOST:-}" ]; then exit 3; fi  # a host whose step never starts
exec nsenter --net=/run/netns/${NS_BASE}$i "$@"
EOF
  chmod +x "$WORK/via.sh"
}
teardown_hosts() {
  for i in 0 1; do kill_host $i; done
  sleep 0.2
  for i in 0 1; do ip netns del ${NS_BASE}$i 2>/dev/null || true; done
}
trap 'teardown_hosts; cleanup' EXIT

# state of host I: TOKEN COUNTER MADE ID
host_field() { cut -d' ' -f"$2" "$WORK/h$1/state" 2>/dev/null || echo 0; }
made() { echo "$(host_field 0 3) $(host_field 1 3)"; }
ids() { echo "$(host_field 0 4) $(host_field 1 4)"; }
counters() { echo "$(host_field 0 2) $(host_field 1 2)"; }
# both_count_past A B [S]: host 0's counter passes A and host 1's B within S s (10).
both_count_past() {
  for _ in $(seq $((${3:-10} * 20))); do
    [ "$(host_field 0 2)" -gt "$1" ] && [ "$(host_field 1 2)" -gt "$2" ] && return 0
    sleep 0.05
  done
  fail "the ranks did not go on: counters $(counters) (wanted past $1 $2), made $(made)"
}
going_on() { local a b; read -r a b <<< "$(counters)"; both_count_past $((a + 20)) $((b + 20)) "${1:-15}"; }
one_new_id() {  # one_new_id OLD: both ranks on one id, not OLD
  local a b
  read -r a b <<< "$(ids)"
  [ "$a" = "$b" ] && [ "$a" != "$1" ] && [ "$a" != 0000000000000000 ]
}
# The root of host I's tree, once it runs.
root_of() {
  local pattern="^$COUNTER $WORK/h$1/state --rank"
  [ "$1" = 0 ] && pattern="^$TCPSTORE serve $STORE_HOST:$STORE_PORT -- "
  for _ in $(seq 200); do
    local p
    p=$(pgrep -o -f "$pattern" || true)
    [ -n "$p" ] && { echo "$p"; return 0; }
    sleep 0.05
  done
  return 1
}
# start_host I [CLIENT ARGS...]: host I's tree (HOST1_ENV: more environment for host 1's).
start_host() {
  local i=$1; shift
  local dir=$WORK/h$i
  mkdir -p "$dir/cwd"
  rm -f "$dir"/state*
  local env=(LD_PRELOAD="$LIBPHOS" MASTER_ADDR=$STORE_HOST MASTER_PORT=$STORE_PORT
             PHOS_NCCL_RENDEZVOUS_DIR="$dir/rendezvous" FAKE_NCCL_STRICT=1 FAKE_NCCL_RANDOM_IDS=1)
  [ "$i" = 1 ] && env+=(${HOST1_ENV:-})
  local cmd=("$COUNTER" "$dir/state" --rank "$i" --nranks 2 --id "$JOB_ID" "$@")
  [ "$i" = 0 ] && cmd=("$TCPSTORE" serve $STORE_HOST:$STORE_PORT -- "${cmd[@]}")
  # Its own cwd: criu's parasite makes a directory there (proc.crtools)
  # while it dumps, and two hosts' criu runs at once must not meet.
  # HOST_OUT=1: the tree's output (libphos's lines) kept in h<i>/out; not
  # for trees restored later (criu checks the size of a file it restores).
  local out=/dev/null
  [ -n "${HOST_OUT:-}" ] && out=$dir/out
  (cd "$dir/cwd" && exec nsenter --net=/run/netns/${NS_BASE}$i unshare --pid --fork setsid \
     env "${env[@]}" "${cmd[@]}" </dev/null >"$out" 2>&1 &)
  ROOT[$i]=$(root_of "$i") || fail "host $i's tree did not start"
}
new_job() {  # new_job [HOST 1'S CLIENT ARGS...]: both trees afresh
  for i in 0 1; do kill_host $i; done
  sleep 0.3
  rm -rf "$WORK"/img* "$WORK"/h*/rendezvous
  JOB_ID=$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')
  start_host 0
  start_host 1 "$@"
  both_count_past 5 5 15
}
job_dump() {  # job_dump [--leave-running]: both hosts dumped through phosctl job, from host 0
  mkdir -p "$WORK/img0" "$WORK/img1"
  in_host 0 "$PHOSCTL" job dump --hosts 2 --via "$WORK/via.sh {i} {cmd}" --pid 0:"${ROOT[0]}" --pid 1:"${ROOT[1]}" \
    --dir "$WORK/img{i}" --lib "$PLUGIN_DIR" --listen 10.77.0.1 --criu "$CRIU" --timeout 60 "$@" \
    -- "${NET_ARGS[@]}" >"$WORK/driver.log" 2>&1
}
job_restore() {
  in_host 0 "$PHOSCTL" job restore --hosts 2 --via "$WORK/via.sh {i} {cmd}" --dir "$WORK/img{i}" \
    --lib "$PLUGIN_DIR" --listen 10.77.0.1 --criu "$CRIU" --timeout 60 -- "${NET_ARGS[@]}" >"$WORK/driver.log" 2>&1
}
# Why a restore failed: the driver's last lines and each host's criu errors.
restore_errors() {
  echo "$(tail -n 4 "$WORK/driver.log" | tr '\n' ' ') host 0: $(criu_errors "$WORK/img0/restore.log" 2>/dev/null) host 1: $(criu_errors "$WORK/img1/restore.log" 2>/dev/null)"
}
driver_says() { grep -q -- "$1" "$WORK/driver.log" || fail "the driver's log does not say '$1': $(tail -n 5 "$WORK/driver.log")"; }
store_keys() { in_host 0 "$TCPSTORE" keys $STORE_HOST:$STORE_PORT; }

setup_hosts

# 1. A leave-running dump of the job.
new_job
first_id=$(host_field 0 4)
[ "$(made)" = "1 1" ] || fail "the ranks made $(made) communicators, not 1 each"
job_dump --leave-running || fail "phosctl job dump --leave-running failed: $(tail -n 8 "$WORK/driver.log")"
held=$(grep -o "all 2 ranks of NCCL communicator [0-9a-f]* held before call [0-9]* on 2 hosts in [0-9.]* ms" "$WORK/driver.log") ||
  fail "the driver does not say every rank was held: $(cat "$WORK/driver.log")"
driver_says "the job's dump committed: 2 hosts, 2 ranks held"
# A leave-running dump votes in the plugin's fini (no action script: criu
# resumes the tree once its pages are copied).
for i in 0 1; do
  grep -q "host $i dumped (its vote given here: a leave-running dump runs no action script)" "$WORK/img$i/dump.log" ||
    fail "host $i's plugin did not vote: $(criu_errors "$WORK/img$i/dump.log")"
  if grep -q "Post dump script passed" "$WORK/img$i/dump.log"; then fail "host $i's criu ran the vote as an action script"; fi
  grep -q "every host dumped; the job's dump commits" "$WORK/img$i/dump.log" || fail "host $i's criu did not hear the job committed"
  grep -q "1 NCCL communicator(s) released in" "$WORK/img$i/dump.log" || fail "host $i's rank did not release its communicator"
  [ -s "$WORK/img$i/phos-job" ] || fail "host $i's image has no phos-job record"
done
going_on
[ "$(made)" = "2 2" ] || fail "after the job's leave-running dump the ranks made $(made) communicators, not 2 each"
one_new_id "$first_id" || fail "the ranks did not meet on one new id: $(ids) (first $first_id)"
[ -z "$(ls -A "$WORK/h0/rendezvous" "$WORK/h1/rendezvous" 2>/dev/null)" ] || fail "a rank met at /dev/shm, not the store"
[ "$(store_keys)" = 0 ] || fail "the store keeps $(store_keys) keys after the ranks met"
say "leave-running: $held; both hosts' criu dumped, the job committed, both ranks made again through the store from one new id ($(host_field 0 4)), its keys cleaned, the job went on"

# 2. A stopped dump, a restore, and a second restore of the same images.
rm -rf "$WORK"/img*
second_id=$(host_field 0 4) token0=$(host_field 0 1) token1=$(host_field 1 1)
job_dump || fail "phosctl job dump failed: $(tail -n 8 "$WORK/driver.log")"
driver_says "the job's dump committed"
sleep 0.3
[ -z "$(pgrep -f "^$COUNTER $WORK/h")" ] || fail "a rank still runs after the stopped dump"
cp -a "$WORK/img0" "$WORK/saved0" && cp -a "$WORK/img1" "$WORK/saved1"
# The ranks' state files as the images hold them open: criu checks a file's
# size at restore, and the first restored job's writes change it.
for i in 0 1; do mkdir -p "$WORK/saved-state$i" && cp -a "$WORK/h$i"/state* "$WORK/saved-state$i/"; done
job_restore || fail "phosctl job restore failed: $(restore_errors)"
driver_says "the job is restored on 2 hosts"
both_count_past 0 0 15
going_on
[ "$(host_field 0 1) $(host_field 1 1)" = "$token0 $token1" ] || fail "the restored launchers are not the dumped ones"
[ "$(made)" = "3 3" ] || fail "after the restore the ranks made $(made) communicators, not 3 each"
one_new_id "$second_id" || fail "the restored ranks did not meet on one new id: $(ids)"
third_id=$(host_field 0 4)
for i in 0 1; do kill_host $i; done
sleep 0.5
rm -rf "$WORK"/img* && cp -a "$WORK/saved0" "$WORK/img0" && cp -a "$WORK/saved1" "$WORK/img1"
for i in 0 1; do cp -a "$WORK/saved-state$i"/state* "$WORK/h$i/"; done
job_restore || fail "the second phosctl job restore of the same images failed: $(restore_errors)"
going_on
[ "$(made)" = "3 3" ] || fail "after the second restore the ranks made $(made) communicators, not 3 each"
one_new_id "$third_id" || fail "the second restore's ranks did not meet on an id of their own: $(ids) (first restore's $third_id)"
say "stopped dump and restore: both trees ended, both restored by their own criu, the ranks made again through the restored store from one new id; a second restore of the same images met on another ($(host_field 0 4))"

# 3. Restores that must be refused.
for i in 0 1; do kill_host $i; done
sleep 0.5
rm -rf "$WORK"/img* && cp -a "$WORK/saved0" "$WORK/img0" && cp -a "$WORK/saved1" "$WORK/img1"
for i in 0 1; do cp -a "$WORK/saved-state$i"/state* "$WORK/h$i/"; done
if in_host 1 "$CRIU" restore -D "$WORK/img1" --lib "$PLUGIN_DIR" -d -v4 -o restore.log "${NET_ARGS[@]}" 2>/dev/null; then
  fail "a plain criu restore of host 1's images went through"
fi
grep -q "restore it with phosctl job restore" "$WORK/img1/restore.log" || fail "the refused restore does not say why: $(criu_errors "$WORK/img1/restore.log")"
[ -z "$(host_pids 1)" ] || fail "a process runs after the refused restore"
sed -i 's/^run = .*/run = 00000000000000ab/' "$WORK/img1/phos-job"
if job_restore; then fail "a restore of two dumps' images went through"; fi
driver_says "the restore is refused before any host restores: host 1's phos-job is of dump run"
[ -z "$(host_pids 0)$(host_pids 1)" ] || fail "a process runs after the refused job restore"
say "refused: a plain criu restore of one host's images ('restore it with phosctl job restore'), and hosts' records of two dumps ('not one checkpoint'); nothing ran"

# 4. Host 1's CHECKPOINT_DEVICES fails in a stopped dump.
new_job
first_id=$(host_field 0 4)
if FAULT_HOST=1 FAULT=fail-checkpoint-devices job_dump; then fail "the job's dump went through with host 1's failing"; fi
driver_says "the job's dump is aborted on every host: host 1: criu's dump failed"
grep -q "the job's dump is aborted" "$WORK/img0/dump.log" || fail "host 0's criu did not hear of the abort"
# Host 0's criu fails by its vote, or earlier: rank 1, given back at once,
# may reach the store while host 0's criu still dumps it (an in-flight
# connection, which criu refuses).
grep -q "Dumping FAILED" "$WORK/img0/dump.log" || fail "host 0's criu did not fail: $(criu_errors "$WORK/img0/dump.log")"
how=$(grep -q "Post dump script passed with [1-9]" "$WORK/img0/dump.log" && echo "by its vote" || echo "before its vote: $(criu_errors "$WORK/img0/dump.log" | cut -c1-120)")
for i in 0 1; do [ ! -e "$WORK/img$i/phos-job" ] || fail "host $i's image is marked whole after the abort"; done
going_on
[ "$(made)" = "2 2" ] || fail "after the aborted dump the ranks made $(made) communicators, not 2 each"
one_new_id "$first_id" || fail "after the aborted dump the ranks did not meet on one new id: $(ids)"
say "host 1's CHECKPOINT_DEVICES failing (a stopped dump): both hosts' criu failed (host 0's $how), its tree left running, no image marked whole, both ranks made again from one new id and went on"

# 4b. The same in a leave-running dump, which votes in the plugin (no
# action script): host 0's criu dumped, then heard the abort, and exits 1.
new_job
first_id=$(host_field 0 4)
# A record an earlier dump left in host 0's directory must not stay.
mkdir -p "$WORK/img0" && cp "$WORK/saved0/phos-job" "$WORK/img0/phos-job"
if FAULT_HOST=1 FAULT=fail-checkpoint-devices job_dump --leave-running; then
  fail "the job's leave-running dump went through with host 1's failing"
fi
driver_says "the job's dump is aborted on every host: host 1: criu's dump failed"
grep -q "Dumping FAILED\|the job's dump was aborted: this host's images are not the job's; criu exits with status 1" \
  "$WORK/img0/dump.log" || fail "host 0's criu did not fail: $(criu_errors "$WORK/img0/dump.log")"
grep -q "host 0: criu exited with status [1-9]" "$WORK/driver.log" ||
  fail "host 0's criu exited 0 in an aborted job: $(grep "host 0" "$WORK/driver.log" | tail -n 3)"
how=$(grep -q "criu exits with status 1" "$WORK/img0/dump.log" && echo "after its plugin heard the abort" ||
  echo "before its vote: $(criu_errors "$WORK/img0/dump.log" | cut -c1-120)")
for i in 0 1; do [ ! -e "$WORK/img$i/phos-job" ] || fail "host $i's image is marked whole after the abort"; done
going_on
[ "$(made)" = "2 2" ] || fail "after the aborted leave-running dump the ranks made $(made) communicators, not 2 each"
one_new_id "$first_id" || fail "after the aborted leave-running dump the ranks did not meet on one new id: $(ids)"
say "host 1's CHECKPOINT_DEVICES failing (a leave-running dump, voted in the plugin): host 0's criu failed ($how), no image marked whole, both ranks made again from one new id and went on"

# 5. Refusals before any release.
new_job --register
if job_dump --leave-running; then fail "a job with a buffer registration on host 1 was dumped"; fi
driver_says "host 1: rank 1 (process [0-9]*) used NCCL communicator (rank 1 of 2): 1 buffer registration"
[ ! -e "$WORK/img0/dump.log" ] && [ ! -e "$WORK/img1/dump.log" ] || fail "a criu ran for the refused job"
going_on
[ "$(made)" = "1 1" ] || fail "after the refusal the ranks made $(made) communicators, not 1 each"
HOST1_ENV=PHOS_DISABLE=1 new_job
if job_dump --leave-running; then fail "a job with a rank without an agent was dumped"; fi
driver_says "host 1: no rank of an NCCL job"
going_on
[ "$(made)" = "1 1" ] || fail "after the refusal the ranks made $(made) communicators, not 1 each"
HOST1_ENV= new_job
if DEAD_HOST=1 job_dump --leave-running; then fail "a job dump went through without host 1's step"; fi
driver_says "host 1's step exited with status 3 before finding its ranks"
going_on
[ "$(made)" = "1 1" ] || fail "after host 1's step died the ranks made $(made) communicators, not 1 each"
say "refused before any rank let go: a buffer registration on host 1, a rank without phos's agent on host 1, host 1's step exiting at once; both ranks went on"

# sdk_job_dump OUT [KEY=JSON...]: the job dumped through the SDK
# (phos.job.dump) from host 0, as job_dump does it through phosctl; OUT gets
# "ok" and the result's figures, or "error HOST: REASON".
SDK=$(cd "$(dirname "$0")/../../sdk/python" && pwd)
sdk_job_dump() {
  local out=$1; shift
  local args
  args=$(python3 -c 'import json, sys
a = dict(hosts=2, via=sys.argv[1], pids={0: int(sys.argv[2]), 1: int(sys.argv[3])}, dirs=sys.argv[4], lib=sys.argv[5],
         listen="10.77.0.1", criu=sys.argv[6], timeout=60, phosctl=sys.argv[7], criu_args=sys.argv[8].split())
for kv in sys.argv[9:]:
    k, v = kv.split("=", 1)
    a[k] = json.loads(v)
print(json.dumps(a))' "$WORK/via.sh {i} {cmd}" "${ROOT[0]}" "${ROOT[1]}" "$WORK/img{i}" "$PLUGIN_DIR" "$CRIU" "$PHOSCTL" \
    "${NET_ARGS[*]}" "$@")
  in_host 0 env PYTHONPATH="$SDK" python3 "$(dirname "$0")/job_sdk_dump.py" "$out" "$args" >"$WORK/driver.log" 2>&1
}
counter_of() { host_field "$1" 2; }

# 6. Host 1's step killed after its ranks are held, before go.
HOST_OUT=1 new_job
first_id=$(host_field 0 4)
mkdir -p "$WORK/img0" "$WORK/img1"
FAULT_HOST=1 FAULT=stall-step-before-ready sdk_job_dump "$WORK/sdk6" &
sdk=$!
for _ in $(seq 400); do
  grep -q "host 1: fault injection (PHOS_FAULT): stalling" "$WORK/driver.log" 2>/dev/null && break
  sleep 0.05
done
grep -q "host 1: its ranks held before call [0-9]*, their release pending; their stops leased for 10000 ms" "$WORK/driver.log" ||
  fail "host 1's step did not hold its ranks under a lease: $(tail -n 5 "$WORK/driver.log")"
step=$(pgrep -f "^$PHOSCTL job host-dump --run [0-9a-f]* --host 1 ") || fail "host 1's step is not running"
held1=$(counter_of 1)
kill -9 "$step"
killed=$(date +%s%N)
wait "$sdk" || true
read -r outcome < "$WORK/sdk6"
[[ "$outcome" == "error 1: host 1's step exited with status 137 before holding the ranks" ]] ||
  fail "phos.job.dump did not name host 1's killed step: '$outcome'"
driver_says "every host lifted its stops; every rank goes on"
sleep 3
[ "$(counter_of 1)" = "$held1" ] || fail "host 1's rank went on before its stop's lease ran out ($held1 -> $(counter_of 1))"
for _ in $(seq 300); do [ "$(counter_of 1)" != "$held1" ] && break; sleep 0.05; done
went=$(( ($(date +%s%N) - killed) / 1000000 ))
[ "$(counter_of 1)" != "$held1" ] || fail "host 1's rank still held $went ms after its step was killed"
# The step renews every 2.5 s: the last renewal came at most that long
# before the kill, and the agent lifts at the lease's end.
{ [ "$went" -ge 7000 ] && [ "$went" -le 12500 ]; } ||
  fail "host 1's rank went on $went ms after its step was killed, not at its 10 s lease's end"
grep -q "was not renewed in 10000 ms (its holder is gone): lifted" "$WORK/h1/out" ||
  fail "host 1's agent does not say it lifted the stop: $(grep phos: "$WORK/h1/out" | tail -n 3)"
if grep -q "not renewed" "$WORK/h0/out"; then fail "host 0's stop ran out of its lease, though its step lifted it"; fi
going_on
[ "$(made)" = "1 1" ] || fail "after the lease the ranks made $(made) communicators, not 1 each (as uninterrupted)"
[ "$(ids)" = "$first_id $first_id" ] || fail "after the lease the ranks are on $(ids), not on their first id $first_id"
say "host 1's step killed after its ranks were held, before go: phos.job.dump said '${outcome#error }'; host 0 lifted at once, host 1's rank held until its lease ran out ($went ms after the kill), then both went on with their first communicator, as uninterrupted"

# leased_dump N LEASE_MS FAULT: a leave-running dump through the SDK under a
# lease of LEASE_MS, host 1's criu with FAULT; its outcome in $outcome. Each
# step says its renewals ended before criu ran, the last one leased for the
# job's timeout.
leased_dump() {
  HOST_OUT=1 new_job
  first_id=$(host_field 0 4)
  mkdir -p "$WORK/img0" "$WORK/img1"
  PHOS_JOB_LEASE_MS=$2 FAULT_HOST=1 FAULT=$3 sdk_job_dump "$WORK/sdk$1" leave_running=true ||
    fail "phos.job.dump failed: $(cat "$WORK/sdk$1" 2>/dev/null) $(tail -n 8 "$WORK/driver.log")"
  read -r outcome < "$WORK/sdk$1"
  for i in 0 1; do
    grep -q "host $i: its ranks' stops renewed [0-9]* time(s); no more renewals, the last one leased for 60000 ms (the job's timeout)" "$WORK/driver.log" ||
      fail "host $i's step does not say its renewals ended before criu ran, the last for the job's timeout: $(grep 'renewed' "$WORK/driver.log")"
  done
}
# stops_taken_over: the job went on, each rank's stop taken over by criu's
# quiesce and none lifted by its agent, both ranks made again on one new id.
stops_taken_over() {
  going_on
  for i in 0 1; do
    grep -q "taken over by a quiesce" "$WORK/h$i/out" || fail "host $i's agent does not say a quiesce took its stop over"
    if grep -q "not renewed" "$WORK/h$i/out"; then fail "host $i's agent lifted its stop mid-dump: $(grep 'not renewed' "$WORK/h$i/out")"; fi
  done
  [ "$(made)" = "2 2" ] || fail "after the dump the ranks made $(made) communicators, not 2 each"
  one_new_id "$first_id" || fail "after the dump the ranks did not meet on one new id: $(ids)"
}

# 7. A dump that outlasts the stops' lease.
leased_dump 7 1500 slow-checkpoint-devices
grep -q "host 1: its ranks held before call [0-9]*, their release pending; their stops leased for 1500 ms" "$WORK/driver.log" ||
  fail "the steps did not lease the stops for 1500 ms: $(grep 'held before' "$WORK/driver.log")"
criu1=$(awk '{print $NF}' <<< "$outcome")
[ "${criu1%.*}" -ge 4000 ] || fail "host 1's criu took $criu1 ms, not longer than twice the lease"
stops_taken_over
say "a leave-running dump outlasting a 1.5 s lease (host 1's criu $criu1 ms; phos.job.dump: $outcome): each stop taken over by criu's quiesce, none lifted, the job committed and went on"

# 8. criu's pause comes after the lease.
leased_dump 8 1000 slow-pause-devices
grep -q "PAUSE_DEVICES of [0-9]* holds for 3 s" "$WORK/img1/dump.log" || fail "host 1's pause did not hold"
stops_taken_over
say "a leave-running dump whose host 1 paused its rank 3 s after the last renewal, under a 1 s lease (phos.job.dump: $outcome): the last renewal leased for the job's timeout, no stop lifted, the job committed and went on"
say "PASS"
