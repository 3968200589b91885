# A torchrun DDP job across two "hosts" on one 2-GPU machine (issue 28,
# part 2), for criu_suite.sh's torchrun_2host_* cases; sourced by a case
# after setup(). Each GPU is a host: a network namespace of its own (a veth
# pair between them, 10.77.0.1 and 10.77.0.2), CUDA_VISIBLE_DEVICES=<i>,
# NCCL over sockets between them (no P2P, SHM, NVLS or IB; NCCL_HOSTID
# tells NCCL they are two nodes), its own cwd (criu's parasite makes a
# directory in the dumped tree's cwd) and its own phos rendezvous
# directory. In each, `torchrun --nnodes=2 --node-rank=<i>` starts one rank;
# host 0's agent serves the job's TCPStore (static rendezvous, or the c10d
# backend's store). Each host's tree is dumped and restored by its own criu
# through `phosctl job`, which runs from host 0 outside both trees.
# RANKS_PER_HOST (default 1): ranks, and GPUs, on each "host"; 2 makes a
# 4-rank job on a 4-GPU machine (GPUs 0,1 on host 0 and 2,3 on host 1).
RANKS_PER_HOST=${RANKS_PER_HOST:-1}
RANKS=$((2 * RANKS_PER_HOST))
NS_BASE=phos-g$$-
VETH=(pg$$a pg$$b)
HOST_ADDR=(10.77.0.1 10.77.0.2)
JOB_NET_ARGS=(--tcp-established --network-lock nftables)
PY=$(python3 -c 'import sys; print(sys.executable)')

in_host() { local i=$1; shift; nsenter --net=/run/netns/${NS_BASE}$i "$@"; }
host_pids() { ip netns pids "${NS_BASE}$1" 2>/dev/null || true; }
kill_host() { local p; for p in $(host_pids "$1"); do kill -9 "$p" 2>/dev/null || true; done; }

hosts_up() {
  ip netns add ${NS_BASE}0 && ip netns add ${NS_BASE}1 || fail "cannot make network namespaces"
  ip link add ${VETH[0]} type veth peer name ${VETH[1]} || fail "cannot make a veth pair"
  local i
  for i in 0 1; do
    ip link set ${VETH[$i]} netns ${NS_BASE}$i
    ip -n ${NS_BASE}$i addr add ${HOST_ADDR[$i]}/24 dev ${VETH[$i]}
    ip -n ${NS_BASE}$i link set lo up
    ip -n ${NS_BASE}$i link set ${VETH[$i]} up
    mkdir -p "$WORK/h$i"
  done
  cat > "$WORK/via.sh" <<EOF
#!/bin/sh
# How phosctl job runs host i's step: in its namespace (a fault on FAULT_HOST only).
i=\$1; shift
if [ "\$i" = "\${FAULT_HOST:-}" ]; then export PHOS_FAULT="\$FAULT"; fi
exec nsenter --net=/run/netns/${NS_BASE}\$i "\$@"
EOF
  chmod +x "$WORK/via.sh"
  AT_EXIT="keep_host_logs; hosts_down; $AT_EXIT"
}
# Each host's criu logs and job output, kept with the case's ($log/$CASE).
keep_host_logs() {
  local i f
  for i in 0 1; do
    for f in "$WORK/img$i"/*.log "$WORK/h$i"/*.out; do [ -f "$f" ] && cp "$f" "$log/$CASE/host$i-$(basename "$f")"; done
  done
  return 0
}
hosts_down() {
  local i
  for i in 0 1; do kill_host $i; done
  sleep 0.5
  for i in 0 1; do ip netns del ${NS_BASE}$i 2>/dev/null || true; done
}

# start_job NAME STEPS RDZV...: the job on both hosts, writing NAME.losses
# (rank 0), NAME.losses.rR (rank R > 0) and NAME.state in $WORK.
start_job() {
  local name=$1 steps=$2 i
  shift 2
  rm -f "$WORK/$name".*
  for i in 0 1; do
    # The c10d backend picks the host that serves its store by matching the
    # endpoint against the machine's hostname, which a namespace's address
    # never does: say which one it is. Its rank 0 then gives the workers its
    # own address as MASTER_ADDR, by default the machine's hostname, which
    # resolves to no address of the namespaces: --local-addr names it.
    local host_conf=
    case " $* " in *" --rdzv-backend=c10d "*) host_conf="--rdzv-conf=is_host=$((i == 0 ? 1 : 0)) --local-addr=${HOST_ADDR[$i]}" ;; esac
    local gpus=$((i * RANKS_PER_HOST)) g
    for ((g = 1; g < RANKS_PER_HOST; g++)); do gpus+=",$((i * RANKS_PER_HOST + g))"; done
    (cd "$WORK/h$i" && exec nsenter --net=/run/netns/${NS_BASE}$i setsid env LD_PRELOAD="$LIBPHOS" \
       CUDA_VISIBLE_DEVICES=$gpus CUBLAS_WORKSPACE_CONFIG=:4096:8 \
       NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NVLS_ENABLE=0 NCCL_IB_DISABLE=1 NCCL_SOCKET_IFNAME=${VETH[$i]} \
       NCCL_HOSTID=phos-host-$i PHOS_NCCL_RENDEZVOUS_DIR="$WORK/h$i/rendezvous" \
       PHOS_TEST_TORCHRUN=1 PHOS_TEST_TORCHRUN_ARGS="--nnodes=2 --node-rank=$i --nproc-per-node=$RANKS_PER_HOST $* $host_conf" \
       "$PY" "$here/torch_ddp_job.py" "$WORK/$name.state" "$WORK/$name.losses" "$steps" 20 \
       </dev/null >"$WORK/h$i/$name.out" 2>&1 &)
  done
}
# The root of host I's tree (the launcher: the oldest process of the
# namespace running the job's script on NAME).
host_root() {
  local i=$1 name=$2 p best= oldest=
  for _ in $(seq 200); do
    for p in $(host_pids "$i"); do
      tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -q "^$PY $here/torch_ddp_job.py $WORK/$name.state " || continue
      local t; t=$(awk '{print $22}' "/proc/$p/stat" 2>/dev/null) || continue
      if [ -z "$oldest" ] || [ "$t" -lt "$oldest" ]; then oldest=$t best=$p; fi
    done
    [ -n "$best" ] && { echo "$best"; return 0; }
    sleep 0.05
  done
  return 1
}
lines() { [ -f "$1" ] && wc -l < "$1" || echo 0; }
# rank_losses NAME R: rank R's loss curve (rank 0's file has no suffix).
rank_losses() { if [ "$2" = 0 ]; then echo "$WORK/$1.losses"; else echo "$WORK/$1.losses.r$2"; fi; }
# job_reach NAME STEP SECONDS: every rank's loss curve has STEP lines.
job_reach() {
  local r all at
  for _ in $(seq $(($3 * 10))); do
    all=1
    for ((r = 0; r < RANKS; r++)); do [ "$(lines "$(rank_losses "$1" $r)")" -ge "$2" ] || { all=0; break; }; done
    [ $all = 1 ] && return 0
    sleep 0.1
  done
  at=$(for ((r = 0; r < RANKS; r++)); do lines "$(rank_losses "$1" $r)"; done | paste -sd' ')
  fail "the job $1 did not reach step $2: ranks at $at; $(cat "$WORK/$1".state.error.* 2>/dev/null | tail -n 3 | tr '\n' ' ')$(tail -n 2 "$WORK"/h*/"$1".out 2>/dev/null | tr '\n' ' ')"
}
job_dump() {  # job_dump NAME [--leave-running]: phosctl job dump of both hosts' trees
  local name=$1 r0 r1
  shift
  r0=$(host_root 0 "$name") && r1=$(host_root 1 "$name") || fail "no tree of $name on both hosts"
  rm -rf "$WORK/img0" "$WORK/img1" && mkdir -p "$WORK/img0" "$WORK/img1"
  in_host 0 "$PHOSCTL" job dump --hosts 2 --via "$WORK/via.sh {i} {cmd}" --pid 0:"$r0" --pid 1:"$r1" \
    --dir "$WORK/img{i}" --lib "$PLUGIN_DIR" --listen ${HOST_ADDR[0]} --criu "$CRIU" --timeout 120 "$@" \
    -- "${JOB_NET_ARGS[@]}" >"$WORK/driver.log" 2>&1
}
job_restore() {
  in_host 0 "$PHOSCTL" job restore --hosts 2 --via "$WORK/via.sh {i} {cmd}" --dir "$WORK/img{i}" --lib "$PLUGIN_DIR" \
    --listen ${HOST_ADDR[0]} --criu "$CRIU" --timeout 120 -- "${JOB_NET_ARGS[@]}" >"$WORK/restore-driver.log" 2>&1
}
# same_curves NAME: every rank's loss curve equals the reference run's, bit for bit.
same_curves() {
  local r ref run
  for ((r = 0; r < RANKS; r++)); do
    ref=$(rank_losses ref $r) run=$(rank_losses "$1" $r)
    cmp -s "$ref" "$run" ||
      fail "rank $r's loss curve differs from the uninterrupted run's from step $(diff "$ref" "$run" | grep -m1 -o '^[<>] [0-9]*' | cut -c3-) on"
  done
}
held_line() { grep -o "all $RANKS ranks of NCCL communicator [0-9a-f]* held before call [0-9]* on 2 hosts in [0-9.]* ms" "$WORK/driver.log" | head -n1; }
