"""Goodput of bounded staleness in data-parallel training (`copse graph data-parallel --staleness S`).

  /usr/bin/python3 bench/staleness_bench.py <build>/cli/copse [--steps N] [--rounds R] [--workers W]
                                              [--model SPEC] [--batch B] [--lr LR]

For S = 0, 1, 2, interleaved for R rounds (default 3) on one job manager and 2 daemons x 2 slots
on 127.0.0.1: a W-worker (default 2) parameter-server job training an MLP on Fashion-MNIST for N
steps (default 240). From the job's progress series (the update's report after each step: the
running mean training loss of the epoch, and the images trained on), it prints
  - images/s: images trained between the series' first and last points over the time between
    them (init and eval left out);
  - images to target: the images trained when the running loss first reached the target, the
    loss S = 0 reaches after two thirds of its steps (median over rounds);
  - statistical efficiency: S = 0's images to target over S's (1 for S = 0);
  - goodput: images/s x statistical efficiency, and its ratio to S = 0's.
Every round of one S must end with the same loss (staleness is deterministic); the bench stops
if one does not."""

import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "http"))
from cluster import Cluster  # noqa: E402


def flag(name, default, kind=int):
    return kind(sys.argv[sys.argv.index(name) + 1]) if name in sys.argv else default


copse = sys.argv[1]
steps = flag("--steps", 240)
rounds = flag("--rounds", 3)
workers = flag("--workers", 2)
model = flag("--model", "mlp:784-256-128-10", str)
batch = flag("--batch", 128)
lr = flag("--lr", 0.05, float)
stalenesses = (0, 1, 2)


def job_for(s):
    out = subprocess.run([copse, "graph", "data-parallel", "--workers", str(workers), "--reducer", "ps", "--staleness",
                          str(s), "--model", model, "--batch", str(batch), "--lr", str(lr), "--steps", str(steps)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def run(cluster, s):
    job = cluster.submit(job_for(s), name=f"stale{s}.json")
    status = cluster.wait_job(job, timeout=900)
    assert status["state"] == "completed", status
    points = [p for p in cluster.get(f"/api/v1/jobs/{job}/progress")["points"]
              if "loss" in p and "images" in p and "elapsed_s" in p]
    first, last = points[0], points[-1]
    ips = (last["images"] - first["images"]) / max(1e-9, last["elapsed_s"] - first["elapsed_s"])
    return ips, points


def images_to(points, target):
    for p in points:
        if p["loss"] <= target:
            return p["images"]
    return None


print(f"staleness_bench: {workers} workers, ps reducer, {model}, batch {batch}, lr {lr}, {steps} steps; "
      f"job manager + 2 daemons x 2 slots on 127.0.0.1; {rounds} interleaved rounds")
results = {s: [] for s in stalenesses}
with Cluster(copse, daemons=2, cpus=2) as cluster:
    for r in range(rounds):
        for s in stalenesses:
            ips, points = run(cluster, s)
            results[s].append((ips, points))
            print(f"  round {r} S={s}: {ips:,.0f} images/s, final running loss {points[-1]['loss']:.6f}", flush=True)
            # Deterministic: every round of one S trains the same parameters, so the same losses.
            assert points[-1]["loss"] == results[s][0][1][-1]["loss"], f"S={s} gave another loss in round {r}"

# The target: the running loss S = 0 reaches after two thirds of its steps (median over rounds).
def loss_at_two_thirds(points):
    want = steps * 2 // 3
    return min((p for p in points), key=lambda p: abs(p["step"] - want))["loss"]


target = statistics.median(loss_at_two_thirds(p) for _, p in results[0])
print(f"\ntarget: running training loss {target:.4f} (what S=0 reaches after {steps * 2 // 3} steps)")
print(f"{'staleness':<10} {'images/s':>10} {'images to target':>17} {'stat. efficiency':>17} {'goodput':>10} {'vs S=0':>7}")
base_goodput = None
base_images = statistics.median(images_to(p, target) for _, p in results[0])
for s in stalenesses:
    ips = statistics.median(i for i, _ in results[s])
    reached = [images_to(p, target) for _, p in results[s]]
    if any(x is None for x in reached):
        print(f"S={s:<8} {ips:>10,.0f} {'not reached':>17}")
        continue
    images = statistics.median(reached)
    efficiency = base_images / images
    goodput = ips * efficiency
    base_goodput = base_goodput or goodput
    print(f"S={s:<8} {ips:>10,.0f} {images:>17,.0f} {efficiency:>17.3f} {goodput:>10,.0f} {goodput / base_goodput:>6.2f}x")
