#!/usr/bin/env python3
"""PyTorch training throughput for the models of bench/ml_train_bench.cc (same layers,
SGD lr 0.05 momentum 0.9, batch 128), on the CPU or with --device cuda on a GPU (images stay in
host memory and each batch is copied to the GPU, as copse's trainer does); --precision bf16 (fp16) runs
the forward pass and loss under torch.autocast(dtype=bfloat16 (float16)), PyTorch's mixed precision, fp16 with its
GradScaler. Prints one JSON line
per model:
  {"model": "mlp", "threads": 2, "images_per_s": [run1, run2, ...], "median": M, "torch": "1.13"}
Exits 3 when torch is not importable, so callers can skip the comparison.

  OMP_WAIT_POLICY=passive /usr/bin/python3 scripts/torch_bench.py --model mlp --threads 2
"""
import argparse
import gzip
import json
import os
import statistics
import sys
import time

try:
    import torch
    import torch.nn as nn
except ImportError:
    print("torch unavailable", file=sys.stderr)
    sys.exit(3)


def build(model):
    if model == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 1024), nn.ReLU(), nn.Linear(1024, 1024),
                             nn.ReLU(), nn.Linear(1024, 10))
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def load(data_dir, limit):
    path = os.path.join(data_dir, "train-images-idx3-ubyte.gz")
    lpath = os.path.join(data_dir, "train-labels-idx1-ubyte.gz")
    if os.path.exists(path) and os.path.exists(lpath):
        with gzip.open(path) as f:
            raw = f.read()
        with gzip.open(lpath) as f:
            lab = f.read()
        n = min(limit, (len(raw) - 16) // 784)
        x = torch.frombuffer(bytearray(raw[16:16 + n * 784]), dtype=torch.uint8)
        x = x.float().div_(255).reshape(n, 1, 28, 28)
        y = torch.frombuffer(bytearray(lab[8:8 + n]), dtype=torch.uint8).long()
        return x, y
    g = torch.Generator().manual_seed(0)
    return torch.rand(limit, 1, 28, 28, generator=g), torch.randint(0, 10, (limit,), generator=g)


def run_once(model_name, x, y, batch, device, precision="fp32"):
    torch.manual_seed(1)
    model = build(model_name).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    perm = torch.randperm(x.shape[0])
    autocast = torch.autocast(device_type=device.split(":")[0],
                              dtype=torch.float16 if precision == "fp16" else torch.bfloat16,
                              enabled=precision != "fp32")
    # fp16: dynamic loss scaling, as copse's (initial scale 65536, halved on overflow).
    scaler = torch.amp.GradScaler(device.split(":")[0]) if precision == "fp16" else None  # not in torch 1.13
    def step(idx):
        opt.zero_grad()
        with autocast:
            loss = loss_fn(model(x[idx].to(device)), y[idx].to(device))
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    for b in range(0, min(4 * batch, x.shape[0]), batch):  # warm-up: allocations, thread pool
        step(perm[b:b + batch])
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    start = time.perf_counter()
    for b in range(0, x.shape[0], batch):
        step(perm[b:b + batch])
    sync()  # a GPU runs asynchronously: the clock stops when its last step has finished
    return x.shape[0] / (time.perf_counter() - start)


def accuracy(model_name, data_dir, epochs, seed, batch):
    """Test accuracy after each epoch, the reference for copse's accuracy figures."""
    torch.manual_seed(seed)
    x, y = load(data_dir, 60000)
    tpath = os.path.join(data_dir, "t10k-images-idx3-ubyte.gz")
    with gzip.open(tpath) as f:
        raw = f.read()
    with gzip.open(os.path.join(data_dir, "t10k-labels-idx1-ubyte.gz")) as f:
        lab = f.read()
    tx = torch.frombuffer(bytearray(raw[16:]), dtype=torch.uint8).float().div_(255)
    tx = tx.reshape(-1, 1, 28, 28)
    ty = torch.frombuffer(bytearray(lab[8:]), dtype=torch.uint8).long()
    model = build(model_name)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    out = []
    for _ in range(epochs):
        perm = torch.randperm(x.shape[0])
        for b in range(0, x.shape[0], batch):
            idx = perm[b:b + batch]
            opt.zero_grad()
            loss_fn(model(x[idx]), y[idx]).backward()
            opt.step()
        with torch.no_grad():
            out.append((model(tx).argmax(1) == ty).float().mean().item())
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--images", type=int, default=12800)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--accuracy-epochs", type=int, default=0,
                    help="instead of timing, train this many full epochs and print test accuracy")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (timing only)")
    ap.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32", help="timing only")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.accuracy_epochs:
        acc = accuracy(args.model, args.data_dir, args.accuracy_epochs, args.seed, args.batch)
        print(json.dumps({"model": args.model, "seed": args.seed, "test_accuracy": acc,
                          "torch": torch.__version__}))
        return
    x, y = load(args.data_dir, args.images)
    rates = [run_once(args.model, x, y, args.batch, args.device, args.precision) for _ in range(args.runs)]
    print(json.dumps({"model": args.model, "device": args.device, "precision": args.precision,
                      "threads": args.threads,
                      "images_per_s": rates,
                      "median": statistics.median(rates), "torch": torch.__version__,
                      "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "")}))


if __name__ == "__main__":
    main()
