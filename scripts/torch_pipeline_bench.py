#!/usr/bin/env python3
"""A PyTorch CPU pipeline, as a peer reference for copse's pipeline rows in bench/ml_graph_bench:
the default MLP (784-1024-1024-10) split where `copse graph pipeline --stages 2` splits it
(stage 0: the first linear layer and its ReLU; stage 1: the rest and the loss), one process per
stage with one thread each, activations and gradients sent over gloo on loopback, GPipe or 1F1B
over M micro-batches, SGD lr 0.05 momentum 0.9 on the summed micro-batch gradients (equal to the
whole batch's). torch 1.13 (Debian's python3-torch) has no torch.distributed.pipelining, so the
schedule is written out here the way DeepSpeed's pipeline engine runs it: blocking receives,
asynchronous sends.

The bubble is measured as copse measures it (ml/pipeline_bubble.h): per step after the first and
per stage, 1 - (the stage's time in forward and backward compute) / (first forward start to
last backward end over both stages), averaged. Prints one JSON line:
  {"schedule": "1f1b", "microbatches": 8, "images_per_s": [...], "median": M,
   "bubble": [...], "bubble_median": B, "theory": T, "last_step_loss": [...], "torch": "1.13"}
Exits 3 when torch is not importable.

  /usr/bin/python3 scripts/torch_pipeline_bench.py --schedule 1f1b --microbatches 8
"""
import argparse
import json
import os
import socket
import statistics
import sys
import time

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torch.nn as nn
except ImportError:
    print("torch unavailable", file=sys.stderr)
    sys.exit(3)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_bench import load  # noqa: E402  (same data as the single-process reference)


def stage_module(rank):
    torch.manual_seed(1 + rank)
    if rank == 0:
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 1024), nn.ReLU())
    return nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 10))


def order(schedule, rank, stages, m):
    """The (kind, micro-batch) sequence one stage runs in a step."""
    if schedule == "gpipe":
        return [("f", i) for i in range(m)] + [("b", i) for i in range(m)]
    warmup = min(stages - rank - 1, m)
    seq = [("f", i) for i in range(warmup)]
    for i in range(m - warmup):
        seq += [("f", warmup + i), ("b", i)]
    return seq + [("b", i) for i in range(m - warmup, m)]


def worker(rank, args, port, spans_out, rates_out, losses_out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    x, y = load(args.data_dir, args.images)
    model = stage_module(rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    m, mb = args.microbatches, args.batch // args.microbatches
    peer = 1 - rank
    clock = time.perf_counter  # CLOCK_MONOTONIC: one clock for both processes
    runs = []
    for run in range(args.runs):
        torch.manual_seed(2 + run)
        perm = torch.randperm(x.shape[0])
        steps = x.shape[0] // args.batch
        spans = []
        start = None
        for step in range(steps):
            if step == 1:  # the first step warms allocations and the connection
                dist.barrier()
                start = clock()
            opt.zero_grad()
            idx = perm[step * args.batch:(step + 1) * args.batch]
            acts, outs, sends = {}, {}, []
            step_loss = 0.0
            for kind, i in order(args.schedule, rank, 2, m):
                part = idx[i * mb:(i + 1) * mb]
                if kind == "f":
                    if rank == 0:
                        t0 = clock()
                        outs[i] = model(x[part])
                        t1 = clock()
                        sends.append(dist.isend(outs[i].detach(), peer))
                    else:
                        a = torch.empty(mb, 1024)
                        dist.recv(a, peer)
                        a.requires_grad_()
                        t0 = clock()
                        acts[i] = a
                        outs[i] = loss_fn(model(a), y[part]) / m
                        step_loss += outs[i].item()
                        t1 = clock()
                else:
                    if rank == 0:
                        g = torch.empty(mb, 1024)
                        dist.recv(g, peer)
                        t0 = clock()
                        outs[i].backward(g)
                        t1 = clock()
                    else:
                        t0 = clock()
                        outs[i].backward()
                        t1 = clock()
                        sends.append(dist.isend(acts[i].grad, peer))
                    del outs[i]
                spans.append((kind, step, i, t0, t1))
            for s in sends:
                s.wait()
            opt.step()
        dist.barrier()
        runs.append((steps - 1) * args.batch / (clock() - start))
        spans_out.put((rank, run, spans))
        if rank == 1:
            losses_out.put(step_loss)  # the last step's, to show it trains
    if rank == 0:
        rates_out.put(runs)
    dist.destroy_process_group()


def bubble(spans_by_rank, steps):
    """copse's measure: per step after the first, per stage, 1 - busy / window; the mean."""
    idle = []
    for step in range(1, steps):
        lo = min(t0 for sp in spans_by_rank for (_, st, _, t0, _) in sp if st == step)
        hi = max(t1 for sp in spans_by_rank for (_, st, _, _, t1) in sp if st == step)
        for sp in spans_by_rank:
            busy = sum(t1 - t0 for (_, st, _, t0, t1) in sp if st == step)
            idle.append(1 - busy / (hi - lo))
    return statistics.mean(idle)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--schedule", choices=["gpipe", "1f1b"], default="1f1b")
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--images", type=int, default=12800)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--port", type=int, default=0, help="the rendezvous port; 0: a free one")
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    args = ap.parse_args()
    if args.batch % args.microbatches:
        ap.error("--batch must be a multiple of --microbatches")
    if args.port == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            args.port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    spans_out, rates_out, losses_out = ctx.Queue(), ctx.Queue(), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, args, args.port, spans_out, rates_out, losses_out))
             for r in (0, 1)]
    for p in procs:
        p.start()
    got = {}
    for _ in range(2 * args.runs):
        rank, run, spans = spans_out.get()
        got[(rank, run)] = spans
    rates = rates_out.get()
    losses = [losses_out.get() for _ in range(args.runs)]
    for p in procs:
        p.join()
        if p.exitcode:
            sys.exit(f"stage process exited with {p.exitcode}")
    steps = args.images // args.batch
    bubbles = [bubble([got[(0, r)], got[(1, r)]], steps) for r in range(args.runs)]
    print(json.dumps({"schedule": args.schedule, "microbatches": args.microbatches, "batch": args.batch,
                      "images_per_s": rates, "median": statistics.median(rates),
                      "bubble": bubbles, "bubble_median": statistics.median(bubbles),
                      "theory": 1 / (args.microbatches + 1), "last_step_loss": losses,
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
