"""A DistributedDataParallel job of N processes, one GPU each (issue 17's
evidence): the launcher (as torchrun, but with a file store: no TCP between
the ranks but NCCL's own) starts N ranks of this script and waits for them.
Each rank trains the deterministic MLP of torch_workloads.py under DDP
(backend nccl) for STEPS steps; rank 0 appends "STEP LOSS" (the loss as a
float hex, exact) to LOSSES and writes "TOKEN STEP" to STATE (atomically),
rank R > 0 appends to LOSSES.rR. A dumped and restored job must write the
loss curves of an uninterrupted one. An exception ends a rank with its
traceback in STATE.error.R.

With PHOS_TEST_TORCHRUN=1 the launcher starts the job as users do, through
torchrun (`python -m torch.distributed.run --standalone`): torchrun's agent
holds the job's c10d TCPStore, the ranks meet through it (env://), and the
tree is launcher -> torchrun -> ranks. PHOS_TEST_TORCHRUN_ARGS replaces
"--standalone --nproc_per_node=N" (one node of a job across hosts:
"--nnodes=2 --node-rank=1 --nproc-per-node=1 --master-addr=... --master-port=...");
each rank then uses its node's GPU LOCAL_RANK.

usage: torch_ddp_job.py STATE LOSSES STEPS [PACE_MS] [--ranks N]
       torch_ddp_job.py STATE LOSSES STEPS PACE_MS --rank R --ranks N  (a rank)
       torch_ddp_job.py STATE LOSSES STEPS PACE_MS --torchrun  (a rank torchrun started)
"""
import os
import subprocess
import sys
import traceback


def launcher(argv, ranks):
    if os.environ.get("PHOS_TEST_TORCHRUN") == "1":
        nodes = os.environ.get("PHOS_TEST_TORCHRUN_ARGS", f"--standalone --nproc_per_node={ranks}").split()
        run = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *nodes, os.path.abspath(__file__), *argv,
                                "--torchrun"])
        sys.exit(run.wait())
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), *argv, "--rank", str(r), "--ranks", str(ranks)])
             for r in range(ranks)]
    sys.exit(max(p.wait() for p in procs))


def rank_main(state, losses, steps, pace, rank, ranks):
    import torch
    import torch.distributed as dist
    device = int(os.environ.get("LOCAL_RANK", rank))  # the node's GPU (torchrun), else the rank's
    torch.cuda.set_device(device)
    from torch_workloads import build  # also sets CUBLAS_WORKSPACE_CONFIG before CUDA starts
    from torch_train import deterministic, train
    deterministic()
    # torchrun's ranks meet through its TCPStore (MASTER_ADDR/PORT), the others through a file.
    init = "env://" if "TORCHELASTIC_RUN_ID" in os.environ else f"file://{state}.store"
    dist.init_process_group("nccl", init_method=init, rank=rank, world_size=ranks,
                            device_id=torch.device(f"cuda:{device}"))
    model, _, opt, (x, y) = build("mlp")
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device])
    if rank == 0:
        train(model, opt, x, y, steps, pace, losses, state)
    else:
        train(model, opt, x, y, steps, pace, f"{losses}.r{rank}")
    dist.destroy_process_group()


def main():
    args = sys.argv[1:]
    ranks = 2
    rank = None
    if "--ranks" in args:
        i = args.index("--ranks")
        ranks = int(args[i + 1])
        del args[i:i + 2]
    if "--rank" in args:
        i = args.index("--rank")
        rank = int(args[i + 1])
        del args[i:i + 2]
    if "--torchrun" in args:
        args.remove("--torchrun")
        rank, ranks = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if rank is None:
        launcher(args, ranks)
    state, losses, steps = args[0], args[1], int(args[2])
    pace = int(args[3]) / 1000 if len(args) > 3 else 0.02
    try:
        rank_main(state, losses, steps, pace, rank, ranks)
    except BaseException:
        with open(f"{state}.error.{rank}", "w") as f:
            f.write(traceback.format_exc())
        raise


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    main()
