"""A plain PyTorch training loop under phos: each iteration starts with
phos.step() (a checkpoint asked for from outside lands there), and every
CKPT_EVERY steps the program checkpoints itself and trains on.

    LD_PRELOAD=/usr/local/lib/phos/libphos.so python3 train_loop.py /ckpt 1000

criu must find phos's plugin: name its directory in criu's configuration
(`lib /usr/local/lib/phos` in /etc/criu/default.conf) or pass
config_file=... to phos.checkpoint.
"""
import sys

import torch

import phos


def main():
    images_root = sys.argv[1] if len(sys.argv) > 1 else "/tmp/phos-ckpt"
    every = int(sys.argv[2]) if len(sys.argv) > 2 else 1000
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 3 * every
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(256, 512, device="cuda")
    y = torch.randint(0, 10, (256,), device="cuda")
    for step in range(1, steps + 1):
        phos.step()
        if step % every == 0:
            phos.checkpoint("%s/step-%d" % (images_root, step))
            print("checkpoint at step %d" % step, flush=True)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    print("final loss %.6f" % loss.item())


if __name__ == "__main__":
    main()
