"""One Llama-shaped model split over 2 GPUs in one process, for the GPU
suite's device_map_auto_2gpu cases (the e2e workload contract; issue 31's
evidence): transformers' LlamaForCausalLM with seeded random weights (no
download), saved once into WORKDIR and loaded with
from_pretrained(device_map="auto", max_memory={0: ..., 1: ...}) as users
load a model too large for one GPU; max_memory caps GPU 0 at about half the
model, so both GPUs get decoder layers. Where accelerate is missing (which
device_map="auto" needs), --split explicit (or the fallback) places the
first half of the layers on GPU 0 and the rest on GPU 1 with hooks that
move each layer's inputs to its GPU, as accelerate's do.

Every step generates --new-tokens tokens greedily from a prompt drawn from
the step's seed, appends "STEP ID ID ..." to TOKENS and "STEP TIME" to
TOKENS.times (time.time() at the step's end, for the stall a dump causes;
not compared), and writes "TOKEN STEP" to STATE. A process dumped and
restored must write the tokens of an uninterrupted run. WORKDIR/split
names the GPU of every module ("MODULE GPU" lines, and "how auto|explicit").
An exception ends it with its traceback in STATE.error.

usage: llama_split.py STATE TOKENS STEPS [PACE_MS] [--workdir DIR]
         [--split auto|explicit] [--layers N] [--hidden N]
"""
import argparse
import os
import sys
import time
import traceback


def parse_args(argv):
    p = argparse.ArgumentParser(description="a Llama-shaped model over 2 GPUs (device_map) generating greedily")
    p.add_argument("state", help="TOKEN STEP, rewritten every step")
    p.add_argument("tokens", help="STEP ID ID ... lines")
    p.add_argument("steps", type=int)
    p.add_argument("pace_ms", type=int, nargs="?", default=20, help="sleep between steps (default 20 ms)")
    p.add_argument("--workdir", help="where the random model is saved (default: STATE's directory)")
    p.add_argument("--split", choices=("auto", "explicit"), default="auto",
                   help="device_map=\"auto\" with max_memory (default), or layers halved by hand")
    p.add_argument("--layers", type=int, default=8, help="decoder layers (default 8)")
    p.add_argument("--hidden", type=int, default=1024, help="hidden size (default 1024)")
    p.add_argument("--new-tokens", type=int, default=16, help="tokens generated per step (default 16)")
    p.add_argument("--prompt-len", type=int, default=24, help="prompt length (default 24)")
    a = p.parse_args(argv)
    if a.steps < 1 or a.layers < 2 or a.hidden % 64:
        p.error("STEPS >= 1, --layers >= 2 and --hidden a multiple of 64 are needed")
    a.workdir = a.workdir or os.path.dirname(os.path.abspath(a.state))
    return a


VOCAB = 32000


def save_random_model(a, path):
    """The model with seeded random weights, saved in bf16 (CPU only)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(hidden_size=a.hidden, num_hidden_layers=a.layers, num_attention_heads=a.hidden // 64,
                         num_key_value_heads=max(1, a.hidden // 256), intermediate_size=a.hidden * 11 // 4,
                         vocab_size=VOCAB, max_position_embeddings=2048, rms_norm_eps=1e-5,
                         tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(config)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=g)
    model.to(torch.bfloat16).save_pretrained(path)
    return sum(p.numel() for p in model.parameters()) * 2


def load_auto(path, model_bytes):
    """device_map="auto": GPU 0 capped at about half the model."""
    from transformers import LlamaForCausalLM
    cap = {0: int(model_bytes * 0.55), 1: 64 << 30}
    return LlamaForCausalLM.from_pretrained(path, device_map="auto", max_memory=cap, **bf16())


def bf16():
    """from_pretrained's dtype keyword: dtype from transformers 4.56 on,
    torch_dtype before."""
    import torch
    import transformers
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return {"dtype" if (major, minor) >= (4, 56) else "torch_dtype": torch.bfloat16}


def to_device(v, device):
    import torch
    if isinstance(v, torch.Tensor):
        return v.to(device)
    if isinstance(v, tuple):
        return tuple(to_device(x, device) for x in v)
    if isinstance(v, dict):
        return {k: to_device(x, device) for k, x in v.items()}
    return v


def load_explicit(path, layers):
    """The first half of the layers (and the embeddings) on GPU 0, the rest
    (and the norm and the head) on GPU 1; each part moves its inputs to its
    GPU, and the logits come back to GPU 0 (where generate keeps its ids)."""
    import torch
    from transformers import LlamaForCausalLM
    model = LlamaForCausalLM.from_pretrained(path, **bf16())
    modules = dict(model.named_modules())
    placed = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.norm": 1, "lm_head": 1}
    for i in range(layers):
        placed[f"model.layers.{i}"] = 0 if i < layers // 2 else 1
    placed = {k: v for k, v in placed.items() if k in modules}  # rotary_emb: per layer before 4.45
    for name, gpu in placed.items():
        mod = modules[name]
        mod.to(f"cuda:{gpu}")
        dev = torch.device(f"cuda:{gpu}")
        mod.register_forward_pre_hook(
            lambda _m, args, kwargs, dev=dev: (to_device(args, dev), {k: to_device(v, dev) for k, v in kwargs.items()}),
            with_kwargs=True)
    model.register_forward_hook(lambda _m, _in, out: _logits_to(out, torch.device("cuda:0")))
    model.hf_device_map = placed
    return model


def _logits_to(out, device):
    out.logits = out.logits.to(device)
    return out


def main(a):
    import torch
    import transformers
    if torch.cuda.device_count() < 2:
        raise SystemExit(f"llama_split.py needs 2 GPUs, torch sees {torch.cuda.device_count()}")
    transformers.logging.set_verbosity_error()
    torch.backends.cudnn.deterministic = True
    # warn_only: generate's bookkeeping ops need no deterministic twin (the
    # same kernels on the same shapes give the same bits run after run).
    torch.use_deterministic_algorithms(True, warn_only=True)
    path = os.path.join(a.workdir, f"llama-{a.layers}x{a.hidden}")
    model_bytes = save_random_model(a, path) if not os.path.exists(os.path.join(path, "config.json")) else \
        sum(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path) if f.endswith(".safetensors"))
    how = a.split
    if how == "auto":
        try:
            model = load_auto(path, model_bytes)
        except Exception as e:  # e.g. no accelerate: say why in the split file, split by hand
            how = f"explicit (device_map=\"auto\" failed: {str(e).splitlines()[0][:160]})"
            model = load_explicit(path, a.layers)
    else:
        model = load_explicit(path, a.layers)
    model.eval()
    placed = dict(model.hf_device_map)
    layer_gpus = {str(v) for k, v in placed.items() if ".layers." in k}
    with open(os.path.join(a.workdir, "split"), "w") as f:
        f.write(f"how {how}\n")
        for name, gpu in placed.items():
            f.write(f"{name} {gpu}\n")
    if not {"0", "1"} <= layer_gpus:
        raise RuntimeError(f"the decoder layers were not split over GPUs 0 and 1: {placed}")
    first = torch.device("cuda:0")
    token = os.urandom(8).hex()
    for step in range(1, a.steps + 1):
        g = torch.Generator().manual_seed(1000 + step)
        ids = torch.randint(0, VOCAB, (1, a.prompt_len), generator=g).to(first)
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=a.new_tokens,
                                 min_new_tokens=a.new_tokens, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        new = out[0, a.prompt_len:].tolist()
        with open(a.tokens, "a") as f:
            f.write(f"{step} {' '.join(map(str, new))}\n")
        with open(a.tokens + ".times", "a") as f:
            f.write(f"{step} {time.time():.6f}\n")
        with open(a.state + ".tmp", "w") as f:
            f.write(f"{token} {step}\n")
        os.rename(a.state + ".tmp", a.state)
        time.sleep(a.pace_ms / 1000)


if __name__ == "__main__":
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    args = parse_args(sys.argv[1:])
    try:
        main(args)
    except BaseException:
        with open(args.state + ".error", "w") as f:
            f.write(traceback.format_exc())
        raise
