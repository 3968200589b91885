"""phos's c10d TCPStore client and server against torch's own (issue 28,
part 2): the proof that the framing phos speaks (support/tcp_store_protocol.h,
written from torch's source) is the installed torch's. Needs torch, no GPU.

1. torch's server (TCPStore(is_master=True), libuv and USE_LIBUV=0's legacy
   one), phos's client: `phos-tcpstore exercise` runs every query of the
   protocol and prints one line each; torch then reads what phos wrote, and
   phos what torch wrote.
2. phos's server (`phos-tcpstore serve`), torch's client: set, get, add,
   check, wait (present, and timing out), compare_set, delete_key,
   num_keys, append.

One line each: "tcpstore-interop: DIRECTION: PASS" or "...: FAIL what".
usage: tcpstore_interop.py PHOS_TCPSTORE
"""
import datetime
import re
import subprocess
import sys

from torch.distributed import TCPStore

tool = sys.argv[1]
failed = 0


def report(direction, problems):
    global failed
    if problems:
        failed += 1
        print(f"tcpstore-interop: {direction}: FAIL {'; '.join(problems)}")
    else:
        print(f"tcpstore-interop: {direction}: PASS")


def torch_server(libuv):
    direction = f"phos client, torch server ({'libuv' if libuv else 'legacy'})"
    problems = []
    try:
        store = TCPStore("127.0.0.1", 0, is_master=True, use_libuv=libuv, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=30))
    except Exception as e:  # a torch built without libuv
        report(direction, [f"torch's server did not start: {e}"])
        return
    store.set("torch/interop", "from torch")
    run = subprocess.run([tool, "exercise", f"127.0.0.1:{store.port}"], capture_output=True, text=True, timeout=60)
    if run.returncode != 0:
        report(direction, [f"phos-tcpstore exercise exited {run.returncode}: {run.stderr.strip()}"])
        return
    got = {}
    for line in run.stdout.splitlines():
        q, _, rest = line.partition(" ")
        got.setdefault(q, []).append(rest.strip())
    expect = {"PING": ["echoed"], "GET": ["from phos"], "ADD": ["3"], "ADD-TEXT": ["3"], "CHECK": ["ready not-ready"],
              "WAIT": ["timed-out, cancelled", "present"], "COMPARE_SET": ["x a a"], "DELETE_KEY": ["1 0"],
              "TORCH-KEY": ["from torch"]}
    for q, want in expect.items():
        if got.get(q) != want:
            problems.append(f"{q}: phos read {got.get(q)}, expected {want}")
    if not re.fullmatch(r"\d+", (got.get("GETNUMKEYS") or [""])[0]):
        problems.append(f"GETNUMKEYS: {got.get('GETNUMKEYS')}")
    # torch reads what phos wrote.
    if store.get("phos/interop/set") != b"from phos":
        problems.append(f"torch read {store.get('phos/interop/set')!r} for phos's SET")
    if store.get("phos/interop/add") != b"3":
        problems.append(f"torch read {store.get('phos/interop/add')!r} for phos's ADD")
    if store.check(["phos/interop/cas"]):
        problems.append("phos's DELETE_KEY left the key in torch's store")
    report(direction, problems)


def phos_server():
    direction = "torch client, phos server"
    problems = []
    server = subprocess.Popen([tool, "serve", "127.0.0.1:0"], stdout=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        m = re.search(r":(\d+)$", line.strip())
        if not m:
            report(direction, [f"phos-tcpstore serve said {line!r}"])
            return
        store = TCPStore("127.0.0.1", int(m.group(1)), is_master=False, timeout=datetime.timedelta(seconds=30))
        store.set("k", "v")
        if store.get("k") != b"v":
            problems.append("get after set")
        if store.add("n", 5) != 5 or store.add("n", -2) != 3 or store.get("n") != b"3":
            problems.append("add")
        if not store.check(["k", "n"]) or store.check(["none"]):
            problems.append("check")
        store.wait(["k"], datetime.timedelta(seconds=5))
        try:
            store.wait(["none"], datetime.timedelta(milliseconds=300))
            problems.append("a wait for a missing key did not time out")
        except Exception:
            pass
        store.set("after-wait", "ok")  # the connection goes on after the cancelled wait
        if store.get("after-wait") != b"ok":
            problems.append("the connection after a cancelled wait")
        if store.compare_set("c", "", "a") != b"a" or store.compare_set("c", "", "b") != b"a":
            problems.append("compare_set")
        store.append("app", "x")
        store.append("app", "y")
        if store.get("app") != b"xy":
            problems.append("append")
        n = store.num_keys()
        if not store.delete_key("c") or store.delete_key("c"):
            problems.append("delete_key")
        if store.num_keys() != n - 1:
            problems.append(f"num_keys {n} then {store.num_keys()}")
    except Exception as e:
        problems.append(f"{type(e).__name__}: {e}")
    finally:
        server.terminate()
        server.wait(timeout=10)
    report(direction, problems)


torch_server(True)
torch_server(False)
phos_server()
print(f"tcpstore-interop: {3 - failed} passed, {failed} failed")
sys.exit(1 if failed else 0)
