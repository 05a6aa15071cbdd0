#!/usr/bin/env python3
"""copse plan's predictions against measurements (issue 41).

Runs `copse plan` (which profiles the model on a local cluster), then runs the chosen layout, the
next fastest candidates and data-parallel 1 (one worker) with `copse run`, in rounds (the order
reversed every other round), and prints each layout's predicted step time next to the measured
steady one (the median interval between consecutive steps' updates in the job manager's trace),
and the chosen plan against data-parallel 1 measured in the same rounds.

  /usr/bin/python3 bench/plan_bench.py <build>/cli/copse [--model mlp] [--batch 128]
      [--steps 60] [--rounds 3] [--daemons 2] [--top 4]
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw)


def graph_args(c):
    if c["kind"] == "pipeline":
        args = ["pipeline", "--stages", str(c["degree"]), "--microbatches", str(c["microbatches"]),
                "--schedule", c["schedule"], "--split", ",".join(str(b) for b in c["split"])]
        if c["schedule"] == "interleaved":
            args += ["--virtual-stages", str(c["virtual_stages"])]
        return args
    if c["kind"] == "tensor-parallel":
        return ["tensor-parallel", "--tensor-parallel", str(c["degree"]), "--tp-channel", "shm"]
    return ["data-parallel", "--workers", str(c["degree"]), "--reducer", "ps"]


def step_ms(summary, work, c):
    """The run's steady step time: the median interval between consecutive updates' ends, from
    the job manager's trace (as `copse run`'s summary computes it for a planned job)."""
    trace = json.load(open(os.path.join(work, "trace.json")))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    update = {"pipeline": "upd0", "tensor-parallel": "tp0"}.get(c["kind"], "ps")
    ends = {}
    for e in events:
        if e.get("ph") != "X" or e.get("args", {}).get("outcome") != "completed":
            continue
        name = e["name"]
        if name.startswith(update + "["):
            ends[int(name[len(update) + 1:-1])] = e["ts"] + e["dur"]
    steps = [(ends[t] - ends[t - 1]) / 1e3 for t in sorted(ends) if t >= 2 and t - 1 in ends]
    return statistics.median(steps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("copse")
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--optimizer", default="sgd")
    ap.add_argument("--lr", default="0.05")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--daemons", type=int, default=2)
    ap.add_argument("--top", type=int, default=4, help="candidates run besides the chosen one and data-parallel 1")
    ap.add_argument("--cpus", type=int, default=2, help="a daemon's slots, and copse train's threads")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="plan-bench-")
    try:
        bench(a, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def bench(a, work):
    common = ["--model", a.model, "--batch", str(a.batch), "--steps", str(a.steps), "--daemon-cpus", str(a.cpus),
              "--optimizer", a.optimizer, "--lr", a.lr]
    plan = json.loads(run([a.copse, "plan", *common, "--daemons", str(a.daemons), "--out",
                           os.path.join(work, "planned.json"), "--save-costs", os.path.join(work, "costs.json"),
                           "-o", "json"]).stdout)
    link = plan["costs"]["link"]
    print(f"model {a.model}, batch {a.batch}, {a.daemons} daemons; gap {link['gap']*1e6:.0f} us, "
          f"hop {link['hop']*1e6:.0f} us, {link['bytes_per_s']/1e6:.0f} MB/s; chosen: {plan['chosen']}")
    fits = [c for c in plan["candidates"] if c["fits"]]
    chosen = fits[0]
    single = next(c for c in fits if c["kind"] == "data-parallel" and c["degree"] == 1)
    runs = [chosen] + [c for c in fits[1:1 + a.top] if c is not single]
    if single is not chosen:
        runs.append(single)
    measured = {c["layout"]: [] for c in runs}
    single_process = []  # copse train: one process with every core a daemon has
    for r in range(a.rounds):
        out = run([a.copse, "train", "--model", a.model, "--batch", str(a.batch), "--steps", str(a.steps),
                   "--threads", str(a.cpus), "--optimizer", a.optimizer, "--lr", a.lr, "-o", "json"])
        trained = json.loads(out.stdout)
        # Samples (images, or a gpt's windows) per second.
        single_process.append(trained["tokens_per_s"] / int(a.model.split("-")[3].split(",")[0])
                              if a.model.startswith("gpt:") else trained["images_per_s"])
        order = runs if r % 2 == 0 else list(reversed(runs))
        for c in order:
            job = os.path.join(work, "job.json")
            run([a.copse, "graph", *graph_args(c), *common, "--out", job])
            out = run([a.copse, "run", job, "--daemons", str(a.daemons), "--cpus", str(a.cpus), "-o", "json",
                       "--output", os.path.join(work, "out"), "--trace", os.path.join(work, "trace.json")])
            s = json.loads(out.stdout)
            measured[c["layout"]].append(step_ms(s, work, c))
    print(f"{'layout':<50} {'predicted step ms':>18} {'measured (median)':>18} {'measured/predicted':>19}"
          f" {'samples/s measured':>18}")
    for c in runs:
        m = statistics.median(measured[c["layout"]])
        print(f"{c['layout']:<50} {c['step_ms']:>18.2f} {m:>18.2f} {m / c['step_ms']:>18.2f}x {a.batch / m * 1e3:>18.0f}"
              + ("   <- chosen" if c is chosen else ""))
    ratio = statistics.median(measured[single["layout"]]) / statistics.median(measured[chosen["layout"]])
    print(f"chosen plan vs data-parallel 1 (one worker, same runs), steady steps: {ratio:.2f}x")
    train = statistics.median(single_process)
    print(f"copse train (one process, {a.cpus} threads): {train:.0f} samples/s (median of {a.rounds})")
    for c in runs:
        images = a.batch / statistics.median(measured[c["layout"]]) * 1e3
        if c is chosen or (c["kind"] == "pipeline" and c is next(x for x in runs if x["kind"] == "pipeline")):
            print(f"  {c['layout']}: {images / train:.2f}x copse train")


if __name__ == "__main__":
    sys.exit(main())
