"""phos.job.dump() run by nccl_job_hosts.sh with the real phosctl and criu.

usage: job_sdk_dump.py OUT ARGS_JSON
ARGS_JSON: phos.job.dump's keyword arguments. Writes one line to OUT:
"ok held CALL hold_ms MS criu_ms MS0 MS1 ..." (the result's figures, each
host's criu time by index), or "error HOST: REASON" (JobError's); prints
phosctl's lines as they come (the test watches them)."""
import json
import sys

import phos


def main(out, args_json):
    args = json.loads(args_json)
    args["pids"] = {int(k): v for k, v in args["pids"].items()}
    try:
        r = phos.job.dump(log=sys.stdout, **args)
        line = "ok held %s hold_ms %s criu_ms %s" % (r.held_call, r.hold_ms, " ".join(str(h.criu_ms) for h in r.hosts))
    except phos.job.JobError as e:
        line = "error %s: %s" % (e.host, e.reason)
    with open(out, "w") as f:
        f.write(line + "\n")
    return 0 if line.startswith("ok") else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
