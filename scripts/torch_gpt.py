#!/usr/bin/env python3
"""The GPT of copse::ml ("gpt:L-D-H-C", ml/transformer.h) in PyTorch, for two uses:

  reference  writes tests/data/ml/gpt_reference.bin: a small GPT's parameters, a batch, its
             logits, loss and gradients, and its parameters after three AdamW steps with
             gradient clipping (read by tests/ml/gpt_reference_test.cc; torch is needed only
             to regenerate it)
  bench      trains the same architecture on the same text windows (fortunes, byte tokens) and
             prints one JSON line: tokens/s per run, their median, and the validation loss
             after the run's steps (bench/gpt_bench.cc runs it next to copse)

Needs PyTorch (Debian: apt-get install -y python3-torch; run with /usr/bin/python3). Exits 3
when torch is not importable, so callers can skip the comparison.

  /usr/bin/python3 scripts/torch_gpt.py reference
  OMP_WAIT_POLICY=passive /usr/bin/python3 scripts/torch_gpt.py bench --model gpt:4-128-4-64
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    print("torch unavailable", file=sys.stderr)
    sys.exit(3)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torch_reference import write  # noqa: E402  (the reference file format)
DEFAULT_OUT = os.path.join(HERE, "..", "tests", "data", "ml", "gpt_reference.bin")


def parse_spec(spec):
    body = spec[len("gpt:"):].split(",")[0]
    layers, dim, heads, context = (int(v) for v in body.split("-"))
    return layers, dim, heads, context


class Attention(nn.Module):
    def __init__(self, dim, heads, dropout):
        super().__init__()
        self.heads = heads
        self.ln = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln(x)).split(d, dim=2)
        shape = (b, t, self.heads, d // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        p = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        o = (p @ v).transpose(1, 2).reshape(b, t, d)
        return x + self.drop(self.proj(o))


class Mlp(nn.Module):
    def __init__(self, dim, dropout):
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.proj = nn.Linear(4 * dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        return x + self.drop(self.proj(F.gelu(self.fc(self.ln(x)))))


class Gpt(nn.Module):
    def __init__(self, layers, dim, heads, context, vocab=256, dropout=0.0):
        super().__init__()
        self.token = nn.Embedding(vocab, dim)
        self.position = nn.Embedding(context, dim)
        self.drop = nn.Dropout(dropout)
        blocks = []
        for _ in range(layers):
            blocks += [Attention(dim, heads, dropout), Mlp(dim, dropout)]
        self.blocks = nn.Sequential(*blocks)
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        for name, p in self.named_parameters():  # GPT-2's initialization, as copse's
            if name.endswith("proj.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers))
            elif name.endswith("qkv.weight") or name.endswith("fc.weight") or name in ("token.weight", "position.weight"):
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, ids):
        t = ids.shape[1]
        x = self.drop(self.token(ids) + self.position(torch.arange(t, device=ids.device)))
        return self.head(self.ln(self.blocks(x)))

    def copse_names(self):
        """torch parameter name -> copse's "<global layer index>.<name>"."""
        blocks = len(self.blocks)
        names = {"token.weight": "0.token", "position.weight": "0.position",
                 "ln.weight": f"{blocks + 2}.weight", "ln.bias": f"{blocks + 2}.bias",
                 "head.weight": f"{blocks + 3}.weight"}
        for name, _ in self.named_parameters():
            if name.startswith("blocks."):
                _, i, rest = name.split(".", 2)
                names[name] = f"{int(i) + 2}.{rest}"
        return names


def reference(args):
    torch.manual_seed(20261126)
    torch.set_num_threads(1)
    model = Gpt(2, 16, 2, 8)
    with torch.no_grad():  # non-trivial LayerNorm and bias values, so every path is exercised
        for name, p in model.named_parameters():
            if name.endswith("ln.weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                p.uniform_(-0.1, 0.1)
            elif name.endswith("proj.weight"):
                p.normal_(0.0, 0.2)
    names = model.copse_names()
    out = {}
    for tname, p in model.named_parameters():
        out[f"gpt.param.{names[tname]}"] = p.detach().clone()
    ids = torch.randint(0, 256, (3, 8))
    targets = torch.randint(0, 256, (3, 8))
    out["gpt.input"] = ids.float()
    out["gpt.labels"] = targets.reshape(-1).float()
    logits = model(ids)
    loss = F.cross_entropy(logits.reshape(-1, 256), targets.reshape(-1))
    model.zero_grad()
    loss.backward()
    out["gpt.logits"] = logits.detach()
    out["gpt.loss"] = loss.detach().reshape(1)
    for tname, p in model.named_parameters():
        out[f"gpt.grad.{names[tname]}"] = p.grad.detach().clone()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    norms = []
    for _ in range(3):
        opt.zero_grad()
        F.cross_entropy(model(ids).reshape(-1, 256), targets.reshape(-1)).backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)))
        opt.step()
    out["gpt.adamw.norms"] = torch.tensor(norms)
    for tname, p in model.named_parameters():
        out[f"gpt.adamw.{names[tname]}"] = p.detach().clone()
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    write(args.output, out)
    print(f"wrote {len(out)} tensors to {args.output} ({os.path.getsize(args.output)} bytes), torch {torch.__version__}")


def load_fortunes(directory):
    """The corpus split exactly as ml/text_corpus.cc does."""
    train, validation, entries = bytearray(), bytearray(), 0
    for name in sorted(n for n in os.listdir(directory) if "." not in n):
        path = os.path.join(directory, name)
        if not os.path.isfile(path) or os.path.islink(path):
            continue
        current = bytearray()
        with open(path, "rb") as f:
            lines = f.read().split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        for line in lines + [b"%"]:
            if line == b"%":
                if current:
                    (validation if entries % 10 == 9 else train).extend(current + b"%\n")
                    entries += 1
                current = bytearray()
            else:
                current.extend(line + b"\n")
    return bytes(train), bytes(validation)


def windows(text, context, limit=-1):
    n = (len(text) - 1) // context
    if limit >= 0:
        n = min(n, limit)
    data = torch.frombuffer(bytearray(text[:n * context + 1]), dtype=torch.uint8).long()
    return data[:n * context].view(n, context), data[1:n * context + 1].view(n, context)


def bench(args):
    layers, dim, heads, context = parse_spec(args.model)
    train, validation = load_fortunes(args.text_dir)
    x, y = windows(train, context)
    vx, vy = windows(validation, context, args.validation_windows)
    rates, losses = [], []
    for run in range(args.runs):
        torch.manual_seed(args.seed + run)
        model = Gpt(layers, dim, heads, context)
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
        perm = torch.randperm(x.shape[0])
        def step(k):
            lr = args.lr * (k + 1) / (args.warmup + 1) if k < args.warmup else args.min_lr + 0.5 * (
                1 + math.cos(math.pi * (k - args.warmup) / max(1, args.steps - args.warmup))) * (args.lr - args.min_lr)
            for g in opt.param_groups:
                g["lr"] = lr
            idx = perm[(k * args.batch) % x.shape[0]:][:args.batch]
            opt.zero_grad()
            F.cross_entropy(model(x[idx]).reshape(-1, 256), y[idx].reshape(-1)).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_norm)
            opt.step()
        start = time.perf_counter()
        for k in range(args.steps):
            step(k)
        rates.append(args.steps * args.batch * context / (time.perf_counter() - start))
        with torch.no_grad():
            total = 0.0
            for b in range(0, vx.shape[0], 32):
                logits = model(vx[b:b + 32])
                total += float(F.cross_entropy(logits.reshape(-1, 256), vy[b:b + 32].reshape(-1), reduction="sum"))
            losses.append(total / vy.numel())
    print(json.dumps({"model": args.model, "threads": args.threads, "tokens_per_s": rates,
                      "median": statistics.median(rates), "validation_loss": losses,
                      "validation_loss_median": statistics.median(losses), "torch": torch.__version__}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("reference")
    r.add_argument("-o", "--output", default=DEFAULT_OUT)
    b = sub.add_parser("bench")
    b.add_argument("--model", default="gpt:4-128-4-64")
    b.add_argument("--threads", type=int, default=2)
    b.add_argument("--runs", type=int, default=3)
    b.add_argument("--seed", type=int, default=1, help="of the first run (initialization and batch order)")
    b.add_argument("--steps", type=int, default=200)
    b.add_argument("--batch", type=int, default=16)
    b.add_argument("--lr", type=float, default=3e-3)
    b.add_argument("--min-lr", type=float, default=3e-4)
    b.add_argument("--warmup", type=int, default=20)
    b.add_argument("--weight-decay", type=float, default=0.1)
    b.add_argument("--clip-norm", type=float, default=1.0)
    b.add_argument("--validation-windows", type=int, default=500)
    b.add_argument("--text-dir", default="/usr/share/games/fortunes")
    args = ap.parse_args()
    if args.cmd == "reference":
        reference(args)
    else:
        torch.set_num_threads(args.threads)
        bench(args)


if __name__ == "__main__":
    main()
