"""A small HTTP inference server, standard library only, for the end-to-end
tests (lib.sh's contract: http_model_server.py STATE, writing
"TOKEN COUNTER PORT" to STATE).

The model: a token embedding, three tanh layers and an output projection
over a vocabulary of 64, weights drawn from random.Random(1234), so every
process holds the same model. GET /generate?seed=S&n=N draws a prompt of 8
tokens from random.Random(S) and generates N more greedily. The reply is one
JSON object: the process's token, how many requests it has served (this one
included) and the generated token ids. The server keeps that count as the
state a checkpoint must carry.

It listens on 127.0.0.1 (an ephemeral port); the loop handles one request at
a time with a short timeout and counts its turns in STATE, so CRIU may dump
it between any two.
"""
import http.server
import json
import math
import os
import random
import secrets
import sys
import urllib.parse

VOCAB, WIDTH, LAYERS, PROMPT = 64, 32, 3, 8

state = sys.argv[1]
token = secrets.token_hex(8)
rng = random.Random(1234)


def matrix(rows, cols):
    scale = 1.0 / math.sqrt(cols)
    return [[rng.gauss(0.0, scale) for _ in range(cols)] for _ in range(rows)]


embedding = matrix(VOCAB, WIDTH)
layers = [(matrix(WIDTH, WIDTH), [rng.gauss(0.0, 0.1) for _ in range(WIDTH)]) for _ in range(LAYERS)]
output = matrix(VOCAB, WIDTH)


def next_token(context):
    # The mean of the context's embeddings, weighted towards the last token.
    x = [0.0] * WIDTH
    for age, t in enumerate(reversed(context)):
        w = 0.5 ** age
        x = [xi + w * ei for xi, ei in zip(x, embedding[t])]
    for weights, bias in layers:
        x = [math.tanh(sum(wi * xi for wi, xi in zip(row, x)) + b) for row, b in zip(weights, bias)]
    logits = [sum(wi * xi for wi, xi in zip(row, x)) for row in output]
    return max(range(VOCAB), key=logits.__getitem__)


def generate(seed, n):
    prompt_rng = random.Random(seed)
    context = [prompt_rng.randrange(VOCAB) for _ in range(PROMPT)]
    out = []
    for _ in range(n):
        t = next_token(context)
        out.append(t)
        context.append(t)
    return out


served = 0


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        global served
        url = urllib.parse.urlparse(self.path)
        query = urllib.parse.parse_qs(url.query)
        if url.path != "/generate":
            self.send_error(404)
            return
        try:
            seed, n = int(query["seed"][0]), int(query.get("n", ["16"])[0])
        except (KeyError, ValueError):
            self.send_error(400, "want /generate?seed=S[&n=N]")
            return
        served += 1
        body = json.dumps({"token": token, "served": served, "tokens": generate(seed, min(n, 256))}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
server.timeout = 0.02
port = server.server_address[1]
turns = 0
while True:
    tmp = state + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{token} {turns} {port}\n")
    os.rename(tmp, state)
    server.handle_request()
    turns += 1
