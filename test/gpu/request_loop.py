"""A client of llama_server.py that asks requests back to back through its
files and logs each one's latency, for bench_cow.sh's server section: the
longest latency while a leave-running dump runs, against the median before
it, is the stall the server's users saw.

usage: request_loop.py REQDIR LOG [REQUEST LINE...]
Writes REQDIR/request (atomically), waits for REQDIR/reply, removes it, and
appends "T_SENT T_REPLY TOKENS_OK" to LOG (time.time(); TOKENS_OK 1 when the
reply's tokens equal the first reply's), until REQDIR/client.stop exists.
"""
import os
import sys
import time


def main(argv):
    reqdir, log = argv[1], argv[2]
    line = " ".join(argv[3:]) or "seed=7 prompt_len=32 new_tokens=1"
    req, reply, stop = (os.path.join(reqdir, n) for n in ("request", "reply", "client.stop"))
    first = None
    with open(log, "a", buffering=1) as out:
        while not os.path.exists(stop):
            with open(req + ".tmp", "w") as f:
                f.write(line + "\n")
            sent = time.time()
            os.rename(req + ".tmp", req)
            while not os.path.exists(reply):
                if os.path.exists(stop):
                    return 0
                time.sleep(0.0005)
            got = time.time()
            with open(reply) as f:
                tokens = [l for l in f if l.startswith("tokens ") or l.startswith("error ")]
            os.unlink(reply)
            # The server removes the request after its reply: a new one
            # written before that would be removed unanswered.
            while os.path.exists(req) and not os.path.exists(stop):
                time.sleep(0.0005)
            if first is None:
                first = tokens
            out.write(f"{sent:.6f} {got:.6f} {int(tokens == first)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
