"""A Llama-shaped inference server for the cold-start benchmark
(bench_coldstart.sh): transformers' LlamaForCausalLM with seeded random
weights in bf16 on cuda:0, answering requests through files in REQDIR.

Shapes (LlamaConfig; the weights are random, the shapes real):
  tiny  hidden 256, 2 layers, 4 heads, 2 kv heads, intermediate 512,
        vocab 32000 (a smoke test)
  1b    ~Llama-3.2-1B: hidden 2048, 16 layers, 32 heads, 8 kv heads,
        intermediate 8192, vocab 128256, tied embeddings (2.3 GiB)
  8b    Llama-3-8B: hidden 4096, 32 layers, 32 heads, 8 kv heads,
        intermediate 14336, vocab 128256 (15.0 GiB)
  13b   Llama-2-13B: hidden 5120, 40 layers, 40 heads, 40 kv heads,
        intermediate 13824, vocab 32000 (24.2 GiB)
The model is built on the GPU in bf16 (no CPU initialization) and every
weight drawn again from a CUDA generator seeded with --seed (norms 1, the
rest N(0, 0.02)), in named_parameters order: the same seed gives the same
weights in every process, whatever transformers' own initialization does.

Start: imports, model, a warm-up generate of --warmup-tokens tokens, then
with --kv-cache-frac F a preallocated KV-cache pool of F x the GPU memory
left free (torch.zeros, so all zeros; only its first --kv-written-mib MiB
written with random values: a mostly empty pool, as a server that just
started holds), then REQDIR/ready is written (key value lines: pid, shape,
params, param_bytes, kv_cache_bytes, gpu_used_bytes (total - free, the CUDA
context included), torch_reserved_bytes, the times t_start, t_imported,
t_model, t_warm, t_ready as time.time(), and warmup_tokens: what the
warm-up generated, before any checkpoint).

Protocol, polled every --poll-ms (1 ms):
  REQDIR/request  one line of key=value words, written by the client
                  atomically (request.tmp, then renamed):
                    seed=S [prompt_len=L] [new_tokens=N]
                  (the prompt: L token ids drawn from torch.Generator seeded
                  with S, on the CPU), or
                    tokens=ID,ID,... [new_tokens=N]
                  The server generates N new tokens greedily
                  (do_sample=False, no end-of-sequence stop: always N), writes
                  REQDIR/reply.tmp and renames it to REQDIR/reply, then
                  deletes the request and polls on. The reply's lines:
                    time T       time.time() when the reply was written
                    seen T       time.time() when the request was seen
                    gen_ms MS    the generate call, synchronized
                    pid PID
                    request ...  the request line as read
                    tokens ID ID ...   the N generated ids (or: error MESSAGE)
  REQDIR/stop     the server exits.
A request already waiting at start is answered right after the warm-up
(the native cold start: process start to first reply). The server prints
nothing in its loop and keeps no file open (its log, REQDIR/server.log, is
opened for each line), so CRIU can dump it at any moment between polls;
run it with setsid and its stdio redirected (stdin /dev/null).

--kv-keep: each request's KV cache (the keys and values generate made)
is kept in the pool, as a server with a paged KV cache keeps it for the
conversation's next turn: copied to the pool's next free place, a ring
that wraps, so the pool changes with the requests answered (the
incremental-image benchmark, bench_incremental.sh). Needs a pool.

--http-port P (0: any free port): the server also listens on 127.0.0.1:P;
GET /generate?KEY=VALUE&... takes the request line's words as query
parameters (seed, prompt_len, new_tokens, tokens) and answers with the
reply's lines (without time and seen). The port goes into REQDIR/ready
("port P"). It is served in the same loop, between polls.

--protocol-only: no torch, no GPU: the tokens are a hash of the prompt; for
testing the benchmark's plumbing (criu, the files) on a host without a GPU.

usage: llama_server.py --reqdir DIR [--shape tiny|1b|8b|13b] [--seed S]
         [--kv-cache-frac F] [--kv-written-mib M] [--warmup-tokens N]
         [--kv-keep] [--poll-ms MS] [--http-port P] [--native-start] [--protocol-only]
"""
import argparse
import os
import sys
import time
import traceback

T_START = time.time()

SHAPES = {
    "tiny": dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=512, vocab_size=32000, tie_word_embeddings=False),
    "1b": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
               intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True),
    "8b": dict(hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
               intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False),
    "13b": dict(hidden_size=5120, num_hidden_layers=40, num_attention_heads=40, num_key_value_heads=40,
                intermediate_size=13824, vocab_size=32000, tie_word_embeddings=False),
}


def parse_args(argv):
    p = argparse.ArgumentParser(description="A Llama-shaped inference server answering requests through files "
                                "(see the module's docstring for the protocol).")
    p.add_argument("--reqdir", required=True, help="the request directory (request, reply, ready, stop, server.log)")
    p.add_argument("--shape", choices=sorted(SHAPES), default="1b", help="model shape (default 1b)")
    p.add_argument("--seed", type=int, default=1234, help="seed of the random weights (default 1234)")
    p.add_argument("--kv-cache-frac", type=float, default=0.0,
                   help="preallocate a zeroed KV-cache pool of this fraction of the free GPU memory (default 0)")
    p.add_argument("--kv-cache-gib", type=float, default=0.0,
                   help="preallocate a KV-cache pool of this many GiB instead (overrides --kv-cache-frac)")
    p.add_argument("--kv-written-mib", type=int, default=256,
                   help="MiB at the start of the pool written with random values (default 256; -1: all of it)")
    p.add_argument("--kv-keep", action="store_true",
                   help="keep each request's KV cache in the pool (a ring), as a paged KV cache does")
    p.add_argument("--warmup-tokens", type=int, default=4, help="tokens of the warm-up generate (default 4)")
    p.add_argument("--warmup-prompt-len", type=int, default=32, help="prompt length of the warm-up (default 32)")
    p.add_argument("--poll-ms", type=float, default=1.0, help="request polling interval, ms (default 1)")
    p.add_argument("--http-port", type=int, default=None,
                   help="also answer GET /generate?seed=S&... on 127.0.0.1:P (0: any free port)")
    p.add_argument("--native-start", action="store_true",
                   help="marks the run as a native cold start in the log (the protocol is the same)")
    p.add_argument("--protocol-only", action="store_true",
                   help="no torch, no GPU: tokens are a hash of the prompt (plumbing tests)")
    a = p.parse_args(argv)
    if not 0.0 <= a.kv_cache_frac < 1.0:
        p.error("--kv-cache-frac must be in [0, 1)")
    if a.kv_cache_gib < 0:
        p.error("--kv-cache-gib must be >= 0")
    if a.kv_keep and a.kv_cache_frac <= 0 and a.kv_cache_gib <= 0:
        p.error("--kv-keep needs a pool (--kv-cache-gib or --kv-cache-frac)")
    return a


class Server:
    def __init__(self, args):
        self.args = args
        self.dir = args.reqdir
        self.times = {"t_start": T_START}
        self.info = {"pid": os.getpid(), "shape": args.shape, "params": 0, "param_bytes": 0, "kv_cache_bytes": 0,
                     "gpu_used_bytes": 0, "torch_reserved_bytes": 0}

    def path(self, name):
        return os.path.join(self.dir, name)

    def log(self, msg):
        # Opened for each line: no file stays open for CRIU to check.
        with open(self.path("server.log"), "a") as f:
            f.write(f"{time.time():.6f} [{os.getpid()}] {msg}\n")

    def write_atomic(self, name, text):
        tmp = self.path(name + ".tmp")
        with open(tmp, "w") as f:
            f.write(text)
        os.rename(tmp, self.path(name))

    # ------------------------------------------------------------ the model
    def load(self):
        a = self.args
        if a.protocol_only:
            self.times["t_imported"] = self.times["t_model"] = time.time()
            self.vocab = SHAPES[a.shape]["vocab_size"]
            return
        global torch
        import torch
        import transformers
        from transformers import LlamaConfig, LlamaForCausalLM
        try:
            transformers.logging.set_verbosity_error()
        except AttributeError:
            pass
        self.times["t_imported"] = time.time()
        self.log(f"torch {torch.__version__}, transformers {transformers.__version__}, "
                 f"{torch.cuda.get_device_name(0)}")
        shape = SHAPES[a.shape]
        config = LlamaConfig(**shape, max_position_embeddings=8192, rms_norm_eps=1e-5,
                             bos_token_id=None, eos_token_id=None, pad_token_id=None)
        torch.manual_seed(a.seed)
        torch.cuda.set_device(0)
        # Built on the GPU in bf16 (transformers' own init runs there, fast);
        # the default dtype only while the modules are made. (RoPE's
        # parameters stay transformers' defaults: random weights.)
        try:
            torch.set_default_dtype(torch.bfloat16)
            bf16_default = True
        except (TypeError, RuntimeError):  # a torch that takes only float32/64
            bf16_default = False
        try:
            with torch.device("cuda:0"):
                model = LlamaForCausalLM(config)
        finally:
            torch.set_default_dtype(torch.float32)
        if not bf16_default:
            model = model.to(torch.bfloat16)
        gen = torch.Generator(device="cuda:0")
        gen.manual_seed(a.seed)
        n = 0
        with torch.no_grad():
            for _, p in model.named_parameters():  # tied weights once
                if p.dim() == 1:
                    p.fill_(1.0)
                else:
                    p.normal_(0.0, 0.02, generator=gen)
                n += p.numel()
        model.eval()
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
        torch.cuda.synchronize()
        self.model = model
        self.vocab = shape["vocab_size"]
        self.info["params"] = n
        self.info["param_bytes"] = n * 2
        self.times["t_model"] = time.time()
        self.log(f"model {a.shape}: {n} parameters, {n * 2 / 2**30:.2f} GiB in bf16")

    def prompt(self, req):
        if "tokens" in req:
            ids = [int(t) for t in req["tokens"].split(",") if t]
            if not ids or min(ids) < 0 or max(ids) >= self.vocab:
                raise ValueError(f"tokens must be ids in [0, {self.vocab})")
            return ids
        seed = int(req.get("seed", 0))
        n = int(req.get("prompt_len", 32))
        if not 1 <= n <= 4096:
            raise ValueError("prompt_len must be in [1, 4096]")
        if self.args.protocol_only:
            import random
            r = random.Random(seed)
            return [r.randrange(self.vocab) for _ in range(n)]
        g = torch.Generator().manual_seed(seed)
        return torch.randint(0, self.vocab, (n,), generator=g).tolist()

    def generate(self, ids, new_tokens):
        if self.args.protocol_only:
            import hashlib
            out, h = [], ",".join(map(str, ids)).encode()
            for _ in range(new_tokens):
                h = hashlib.sha256(h).digest()
                out.append(int.from_bytes(h[:4], "little") % self.vocab)
            return out
        x = torch.tensor([ids], device="cuda:0")
        keep = self.args.kv_keep and hasattr(self, "kv")
        with torch.inference_mode():
            out = self.model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens,
                                      min_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                                      return_dict_in_generate=keep)
            if keep:
                self.keep_kv(out.past_key_values)
                out = out.sequences
        torch.cuda.synchronize()
        return out[0, len(ids):].tolist()

    def keep_kv(self, cache):
        """The request's keys and values copied into the pool at its next
        free place (a ring), as a paged KV cache keeps a conversation's."""
        if hasattr(cache, "layers"):  # transformers' Cache of 4.56 and later
            tensors = [t for layer in cache.layers for t in (layer.keys, layer.values)]
        elif hasattr(cache, "key_cache"):
            tensors = list(cache.key_cache) + list(cache.value_cache)
        else:  # the legacy tuple of (key, value) per layer
            tensors = [t for kv in cache for t in kv]
        at = getattr(self, "kv_at", 0)
        for t in tensors:
            flat = t.reshape(-1).to(self.kv.dtype)
            n = min(flat.numel(), self.kv.numel())
            if at + n > self.kv.numel():
                at = 0
            self.kv[at:at + n].copy_(flat[:n])
            at += n
        self.kv_at = at

    def warm_up(self):
        a = self.args
        if a.warmup_tokens > 0:
            ids = self.prompt({"seed": str(a.seed + 1000), "prompt_len": str(a.warmup_prompt_len)})
            t = time.time()
            self.warmup_tokens = self.generate(ids, a.warmup_tokens)
            self.log(f"warm-up: {a.warmup_tokens} tokens in {(time.time() - t) * 1000:.1f} ms")
        self.times["t_warm"] = time.time()

    def kv_cache(self):
        a = self.args
        if a.protocol_only or (a.kv_cache_frac <= 0 and a.kv_cache_gib <= 0):
            return
        free, _ = torch.cuda.mem_get_info()
        elems = int(a.kv_cache_gib * 2**30 if a.kv_cache_gib > 0 else free * a.kv_cache_frac) // 2
        # torch.zeros: the pool is written once with zeros; only its start
        # then holds data.
        self.kv = torch.zeros(elems, dtype=torch.bfloat16, device="cuda:0")
        written = elems if a.kv_written_mib < 0 else min(elems, a.kv_written_mib * (1 << 20) // 2)
        if written:
            g = torch.Generator(device="cuda:0")
            g.manual_seed(a.seed + 1)
            self.kv[:written].normal_(0.0, 1.0, generator=g)
        torch.cuda.synchronize()
        self.info["kv_cache_bytes"] = elems * 2
        self.log(f"KV-cache pool: {elems * 2 / 2**30:.2f} GiB ({free / 2**30:.2f} GiB were free), "
                 f"first {written * 2 / 2**20:.0f} MiB written")

    def listen(self):
        """The HTTP front (--http-port): made before ready, so ready names its port."""
        import http.server
        import urllib.parse
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                url = urllib.parse.urlparse(self.path)
                if url.path != "/generate":
                    self.send_error(404)
                    return
                line = " ".join(f"{k}={v}" for k, v in urllib.parse.parse_qsl(url.query))
                body = server.answer_body(line)[1].encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.HTTPServer(("127.0.0.1", self.args.http_port), Handler)
        self.httpd.timeout = self.args.poll_ms / 1000
        self.info["port"] = self.httpd.server_address[1]

    def ready(self):
        if self.args.http_port is not None:
            self.listen()
        if not self.args.protocol_only:
            free, total = torch.cuda.mem_get_info()
            self.info["gpu_used_bytes"] = total - free
            self.info["torch_reserved_bytes"] = torch.cuda.memory_reserved()
        self.times["t_ready"] = time.time()
        lines = [f"{k} {v}" for k, v in self.info.items()]
        lines += [f"{k} {v:.6f}" for k, v in self.times.items()]
        lines.append("warmup_tokens " + " ".join(map(str, getattr(self, "warmup_tokens", []))))
        self.write_atomic("ready", "\n".join(lines) + "\n")
        self.log(f"ready{' (native start)' if self.args.native_start else ''}: "
                 f"{(self.times['t_ready'] - T_START):.3f} s after the start")

    # ------------------------------------------------------------- requests
    def answer_body(self, line):
        """(gen_ms, the reply's lines after time and seen) for one request line."""
        try:
            req = dict(w.split("=", 1) for w in line.split())
            ids = self.prompt(req)
            n = int(req.get("new_tokens", 16))
            if not 1 <= n <= 4096:
                raise ValueError("new_tokens must be in [1, 4096]")
            t = time.time()
            tokens = self.generate(ids, n)
            gen_ms = (time.time() - t) * 1000
            body = f"gen_ms {gen_ms:.3f}\npid {os.getpid()}\nrequest {line}\ntokens {' '.join(map(str, tokens))}\n"
        except Exception as e:  # a bad request is answered, the server goes on
            gen_ms = 0.0
            why = f"{type(e).__name__}: {e}".replace("\n", " ")
            body = f"gen_ms 0\npid {os.getpid()}\nrequest {line}\nerror {why}\n"
            self.log("request failed: " + traceback.format_exc().replace("\n", " | "))
        return gen_ms, body

    def answer(self, line, seen):
        gen_ms, body = self.answer_body(line)
        self.write_atomic("reply", f"time {time.time():.6f}\nseen {seen:.6f}\n" + body)
        self.log(f"answered '{line}' in {gen_ms:.1f} ms (seen {seen:.6f})")

    def serve(self):
        req, stop = self.path("request"), self.path("stop")
        poll = self.args.poll_ms / 1000
        while True:
            if os.path.exists(req):
                seen = time.time()
                try:
                    with open(req) as f:
                        line = f.read().strip()
                except FileNotFoundError:
                    continue
                self.answer(line, seen)
                try:
                    os.unlink(req)
                except FileNotFoundError:
                    pass
                continue
            if os.path.exists(stop):
                self.log("stop")
                return
            if getattr(self, "httpd", None):
                self.httpd.handle_request()  # waits up to one poll interval
            else:
                time.sleep(poll)


def main(argv):
    args = parse_args(argv)
    s = Server(args)
    try:
        s.log(f"start: shape {args.shape}, seed {args.seed}, kv-cache-frac {args.kv_cache_frac}"
              f"{', native start' if args.native_start else ''}{', protocol only' if args.protocol_only else ''}")
        s.load()
        s.warm_up()
        s.kv_cache()
        s.ready()
    except BaseException:
        s.log("failed: " + traceback.format_exc().replace("\n", " | "))
        with open(s.path("error"), "w") as f:
            f.write(traceback.format_exc())
        raise
    s.serve()


if __name__ == "__main__":
    main(sys.argv[1:])
