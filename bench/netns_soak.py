"""A Jepsen-style randomized soak of copse on hosts made of network namespaces
(tests/netns/netns_cluster.py; docs/multi-host-testing.md).

  /usr/bin/python3 bench/netns_soak.py --copse <build>/cli/copse [--runs N] [--seed S]
      [--hosts 5] [--workdir DIR] [--keep] [--window-s 8]

Needs root. The binaries are copied under --workdir first (a rebuild must not swap them mid-soak).
Once, every job kind runs fault-free under `copse run` on this host: its digests
are the reference. Then each run r (seeded by S + r) starts a fresh cluster on the same
namespaces: the job manager on h0, daemons d1 ... on h1 ... (2 cpus each, heartbeat timeout 1 s);
submits 3-4 jobs of random kinds at once, and 1-2 more at each of 2-3 random moments of the
fault window (so that faults find jobs running);
and injects 2-6 faults at random moments of the window (--window-s, 8 s), each for a random
time:
  - daemon_kill: SIGKILL a live daemon, start it again (same name, host, work dir) 0.1-2.5 s
    later, or (half the time) 3-6 s later;
  - jm_kill: SIGKILL the job manager, start it again (same state dir, address) 0.1-2 s later;
  - partition: one daemon host isolated from every other host, or the hosts split in two random
    sides (the job manager's among them), for 0.5-4 s;
  - delay: 10-60 ms (+- a third, reordering; sometimes 5-20 % of packets sent at once) each way
    between one host and the others, or between every two hosts, for 1-6 s;
  - loss: 1-8 % of packets, the same pairs, for 1-6 s.
Faults overlap freely. Like systemd's Restart=always, a daemon that exits on its own (one
started while the job manager is down exits: "cannot connect") is started again 0.5 s later;
an exit by a signal nobody sent, or a job manager exit, is a crash. When the window and every
fault have ended, everything is healed and started, and the run waits (at most --timeout-s,
180 s) for every job to end. Checks, per job:
its declared outputs, copied when it completed (`copse status --output`), have the fault-free
digests (metrics.json without its timings; a lineage job's data.txt); a lineage job's
lineage.txt names no attempt the job manager did not record as completed and no output read
after it was superseded, and comes from the sink attempt its status records (check_lineage);
and, once the faults have ended and every daemon is back, every completed job's outputs are
copied again and must be the same bytes. A run prints its faults and its verdict; the end, one
summary line: runs, the fault mix, wrong outputs, lost outputs, superseded reads, jobs failed
(by reason), jobs that never ended, crashes, daemons restarted after exiting on their own,
completions the job manager journaled but its event log lacks (after a SIGKILL; inferred by
check_lineage), the median run time.
Exits 1 when an output was wrong or lost, a superseded output was read, a job never ended or
a process crashed (a failed job is reported, not counted as an error: enough faults may
exhaust its allowed daemon losses). Logs of runs with anything to report are kept under --workdir."""

import argparse
import collections
import json
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "netns"))
import netns_cluster as nc  # noqa: E402

HEARTBEAT_MS = 1000
FAULT_KINDS = ("daemon_kill", "jm_kill", "partition", "delay", "loss")


# ---- job kinds -----------------------------------------------------------------------------------

def example_copy(src, dst, absolute_path_params=()):
    """An example job with more daemon losses allowed (faults here are not injected through copse,
    so each counts against max_daemon_losses) and relative paths made absolute."""
    with open(src) as f:
        job = json.load(f)
    job.setdefault("defaults", {})
    job["defaults"]["max_daemon_losses"] = 50
    job["defaults"]["max_attempts"] = 8
    for stage in job["stages"]:
        for key in absolute_path_params:
            if key in stage.get("params", {}):
                stage["params"][key] = os.path.join(os.path.dirname(src), stage["params"][key])
    with open(dst, "w") as f:
        json.dump(job, f, indent=1)
    return dst


def checksum_dag(dst):
    """Built-in checksum vertices, slow enough for faults to land while they run."""
    job = {"version": 1, "name": "checksum-dag", "defaults": {"max_daemon_losses": 50, "max_attempts": 8},
           "stages": [{"name": "a", "program": "checksum", "replicas": 4, "params": {"bytes": 200000, "sleep_ms": 400}},
                      {"name": "b", "program": "checksum", "replicas": 4, "params": {"sleep_ms": 600}},
                      {"name": "c", "program": "checksum", "replicas": 2, "params": {"sleep_ms": 300}},
                      {"name": "d", "program": "checksum"}],
           "edges": [{"from": "a", "to": "b", "pattern": "all_to_all", "channel": "memory"},
                     {"from": "b", "to": "c", "pattern": "all_to_all", "channel": "file"},
                     {"from": "c", "to": "d", "pattern": "gather", "channel": "file"}],
           "outputs": [{"from": "d", "path": "digest.txt"}]}
    with open(dst, "w") as f:
        json.dump(job, f, indent=1)
    return dst


def make_kinds(workdir):
    ex = os.path.join(REPO, "examples")
    d = os.path.join(workdir, "jobs")
    os.makedirs(d, exist_ok=True)
    return {
        "wordcount": example_copy(os.path.join(ex, "wordcount", "wordcount.json"), os.path.join(d, "wordcount.json"),
                                  ("path",)),
        "diamond": example_copy(os.path.join(ex, "diamond.json"), os.path.join(d, "diamond.json")),
        "stream": example_copy(os.path.join(ex, "stream_pipeline.json"), os.path.join(d, "stream.json")),
        "checksum_dag": checksum_dag(os.path.join(d, "checksum_dag.json")),
        "lineage": nc.lineage_job(os.path.join(d, "lineage.json"), name="lineage", mids=4, pad_bytes=64 << 10,
                                  sleep_ms=(100, 800, 200, 0)),
        "lineage_wide": nc.lineage_job(os.path.join(d, "lineage_wide.json"), name="lineage-wide", sources=4, mids=6,
                                       aggs=3, pad_bytes=16 << 10, sleep_ms=(300, 1500, 300, 100),
                                       mid_channel="memory", agg_channel="file"),
    }


# ---- faults -------------------------------------------------------------------------------------

class Fault:
    def __init__(self, kind, at, duration, **params):
        self.kind, self.at, self.duration, self.params = kind, at, duration, params
        self.fired = False
        self.note = ""

    def describe(self):
        p = self.params
        if self.kind == "daemon_kill":
            what = f"kill {p['daemon']}" if "daemon" in p else "kill a daemon"
        elif self.kind == "jm_kill":
            what = "kill the jm"
        elif self.kind == "partition":
            what = "partition " + "|".join(",".join(f"h{i}" for i in sorted(side)) for side in p["sides"])
        elif self.kind == "delay":
            what = f"delay {p['scope']} {p['ms']}+-{p['jitter']}ms" + (f" reorder {p['reorder']:.0%}" if p["reorder"] else "")
        else:
            what = f"loss {p['scope']} {p['p']:.1%}"
        return f"{what} @{self.at:.1f}s/{self.duration:.1f}s" + (f" ({self.note})" if self.note else "")


def pairs_of(scope, n_hosts):
    """Unordered host pairs a delay or loss applies to: 'all', or 'hK' against every other host."""
    if scope == "all":
        return [(i, j) for i in range(n_hosts) for j in range(i + 1, n_hosts)]
    k = int(scope[1:])
    return [(k, j) for j in range(n_hosts) if j != k]


def plan_faults(rng, n_hosts, window):
    faults = []
    for _ in range(rng.randint(2, 6)):
        kind = rng.choice(FAULT_KINDS)
        at = rng.uniform(0.3, window)
        if kind == "daemon_kill":
            # Half come back within the job manager's return grace (1 s) or soon after; half
            # stay away longer, so their outputs are regenerated elsewhere.
            faults.append(Fault(kind, at, rng.uniform(0.1, 2.5) if rng.random() < 0.5 else rng.uniform(3.0, 6.0)))
        elif kind == "jm_kill":
            faults.append(Fault(kind, at, rng.uniform(0.1, 2.0)))
        elif kind == "partition":
            if rng.random() < 0.6:
                victim = rng.randint(1, n_hosts - 1)
                sides = [{victim}, set(range(n_hosts)) - {victim}]
            else:
                hosts = list(range(n_hosts))
                rng.shuffle(hosts)
                cut = rng.randint(1, n_hosts - 1)
                sides = [set(hosts[:cut]), set(hosts[cut:])]
            faults.append(Fault(kind, at, rng.uniform(0.5, 4.0), sides=sides))
        else:
            scope = "all" if rng.random() < 0.4 else f"h{rng.randint(0, n_hosts - 1)}"
            if kind == "delay":
                ms = rng.randint(10, 60)
                faults.append(Fault(kind, at, rng.uniform(1.0, 6.0), scope=scope, ms=ms, jitter=ms // 3,
                                    reorder=rng.choice((0.0, 0.0, 0.05, 0.2))))
            else:
                faults.append(Fault(kind, at, rng.uniform(1.0, 6.0), scope=scope, p=round(rng.uniform(0.01, 0.08), 3)))
    return sorted(faults, key=lambda f: f.at)


def apply_network(net, active):
    """The union of the network faults in force."""
    partitions, losses, delays = set(), {}, {}
    n = len(net.hosts)
    for f in active:
        if f.kind == "partition":
            a, b = f.params["sides"]
            partitions.update((i, j) for i in a for j in b)
        elif f.kind == "loss":
            for i, j in pairs_of(f.params["scope"], n):
                for key in ((i, j), (j, i)):
                    losses[key] = max(losses.get(key, 0.0), f.params["p"])
        elif f.kind == "delay":
            for i, j in pairs_of(f.params["scope"], n):
                for key in ((i, j), (j, i)):
                    delays[key] = (f.params["ms"], f.params["jitter"], f.params["reorder"])
    net.set_faults(partitions, losses, delays)


# ---- one run --------------------------------------------------------------------------------------

class Job:
    def __init__(self, kind, job_id):
        self.kind, self.id = kind, job_id
        self.state = None
        self.failure = ""
        self.first = None  # raw digests of the outputs copied when it completed
        self.status = None  # its final status
        self.problems = []


def run_once(args, run, net, kinds, reference, totals):
    rng = random.Random(args.seed + run)
    rundir = os.path.join(args.workdir, f"run{run:04d}")
    shutil.rmtree(rundir, ignore_errors=True)
    os.makedirs(rundir)
    n_hosts = len(net.hosts)
    daemons = [f"d{i}" for i in range(1, n_hosts)]
    faults = plan_faults(rng, n_hosts, args.window_s)
    names = sorted(kinds)
    first_batch = [rng.choice(names) for _ in range(rng.randint(3, 4))]
    # More jobs at random moments of the window, so that faults find jobs running.
    later = [(rng.uniform(0.5, args.window_s), [rng.choice(names) for _ in range(rng.randint(1, 2))])
             for _ in range(rng.randint(2, 3))]
    jobs = []
    report = {"wrong": [], "lost": [], "superseded": [], "failed": [], "hung": [], "crashed": [], "inferred": [],
              "restarted": []}
    started = time.monotonic()
    c = nc.Cluster(args.copse, rundir, net=net, heartbeat_timeout_ms=HEARTBEAT_MS)
    try:
        c.start_jm()
        for i, name in enumerate(daemons, start=1):
            c.add_daemon(name, i, cpus=2, wait=False)
        c.wait_daemons(timeout=60)
        for kind in first_batch:
            jobs.append(Job(kind, c.submit(kinds[kind])))
        t0 = time.monotonic()
        # Timeline: fault starts and ends, the later submissions.
        timeline = [(f.at, "start", f) for f in faults] + [(at, "submit", batch) for at, batch in later]
        active = []
        down = {}  # process name -> time to start it again
        last_poll = 0.0
        pending_submit = []
        window_end = max([f.at + f.duration for f in faults] + [at for at, _ in later]) + 0.2
        deadline = t0 + window_end + args.timeout_s
        while True:
            now = time.monotonic() - t0
            timeline.sort(key=lambda e: e[0])
            while timeline and timeline[0][0] <= now:
                _, what, f = timeline.pop(0)
                if what == "submit":
                    pending_submit += f
                elif what == "start":
                    fire(c, f, rng, active, down, now, daemons)
                    if f.fired and f.kind in ("partition", "delay", "loss"):
                        timeline.append((f.at + f.duration, "end", f))
                elif what == "end":
                    active.remove(f)
                    apply_network(net, active)
            supervise(c, daemons, down, now, report)
            for name, when in list(down.items()):
                if now >= when:
                    c.start(name, wait=False)
                    del down[name]
            while pending_submit and c.running("jm"):
                try:
                    jobs.append(Job(pending_submit[0], c.submit(kinds[pending_submit[0]])))
                    pending_submit.pop(0)
                except nc.Failure:
                    break  # the job manager is starting: next turn
            if time.monotonic() - last_poll > 0.5 and c.running("jm"):
                last_poll = time.monotonic()
                for j in jobs:
                    if j.state is None:
                        poll(c, j, rundir)
            if not timeline and not down and not pending_submit and all(j.state for j in jobs):
                break
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        # The faults have ended: heal, start what is down, wait for every job and daemon.
        active.clear()
        net.clear()
        for name in list(down):
            c.start(name, wait=False)
        down.clear()
        supervise(c, daemons, down, 0.0, report)
        if not c.running("jm"):
            c.start_jm()
        for name in daemons:
            if not c.running(name):
                c.start(name, wait=False)
        while any(j.state is None for j in jobs) and time.monotonic() < deadline:
            supervise(c, daemons, down, 0.0, report)
            for name in list(down):
                c.start(name, wait=False)
                del down[name]
            for j in jobs:
                if j.state is None:
                    poll(c, j, rundir)
            time.sleep(0.3)
        c.wait_daemons(timeout=60)
        for j in jobs:
            if j.state is None:
                report["hung"].append(f"job {j.id} ({j.kind}) did not end within {args.timeout_s} s of the faults")
            elif j.state != "completed":
                report["failed"].append(f"job {j.id} ({j.kind}) {j.state}: {j.failure[:160]}")
            else:
                check_completed(c, j, rundir, reference, report)
    except nc.Failure as e:
        report["hung"].append(f"harness: {e}")
        c.dump_logs(10)
    finally:
        c.close()
        net.clear()
    elapsed = time.monotonic() - started
    for f in faults:
        if f.fired:
            totals["faults"][f.kind] += 1
    bad = report["wrong"] or report["lost"] or report["superseded"] or report["hung"] or report["crashed"]
    verdict = "BAD" if bad else ("ok, a job failed" if report["failed"] else "ok")
    kinds_run = ",".join(j.kind for j in jobs)
    print(f"run {run} (seed {args.seed + run}): {elapsed:.1f} s, jobs [{kinds_run}], faults: "
          f"{'; '.join(f.describe() for f in faults if f.fired) or 'none fired'} -> {verdict}", flush=True)
    for key in ("wrong", "lost", "superseded", "failed", "hung", "crashed", "restarted", "inferred"):
        for line in report[key]:
            print(f"    {key}: {line}", flush=True)
    totals["runs"] += 1
    totals["jobs"] += len(jobs)
    totals["times"].append(elapsed)
    for key in ("wrong", "lost", "superseded", "hung", "crashed", "restarted", "inferred"):
        totals[key] += len(report[key])
    for line in report["failed"]:
        totals["failed"] += 1
        totals["failed_reasons"][reason_of(line)] += 1
    if not bad and not report["failed"] and not args.keep:
        shutil.rmtree(rundir, ignore_errors=True)
    return not bad


def reason_of(line):
    for key in ("malformed message", "max_daemon_losses", "daemon losses", "not retried", "max_attempts", "cancel"):
        if key in line:
            return key
    return line.split(": ", 1)[-1][:60]


def supervise(c, daemons, down, now, report):
    """Plays systemd's Restart=always: a daemon that exited on its own (at start while the job
    manager was down, "cannot connect", is the usual case) is started again 0.5 s later. An
    exit by a signal this program did not send, or any exit of the job manager it did not
    kill, is a crash."""
    for name in ["jm", *daemons]:
        p = c.procs[name].popen
        if name in down or p is None or p.poll() is None:
            continue
        last = (c.log(name).strip().splitlines() or [""])[-1][:200]
        if name == "jm" or p.returncode < 0:
            report["crashed"].append(f"{name} exited ({p.returncode}) on its own: {last}")
        else:
            report["restarted"].append(f"{name} exited ({p.returncode}): {last}")
        down[name] = now + 0.5


def fire(c, f, rng, active, down, now, daemons):
    if f.kind == "daemon_kill":
        live = [d for d in daemons if c.running(d) and d not in down]
        if not live:
            f.note = "no live daemon"
            return
        d = rng.choice(live)
        f.params["daemon"] = d
        c.kill(d, signal.SIGKILL)
        down[d] = now + f.duration
    elif f.kind == "jm_kill":
        if not c.running("jm") or "jm" in down:
            f.note = "already down"
            return
        c.kill("jm", signal.SIGKILL)
        down["jm"] = now + f.duration
    else:
        active.append(f)
        apply_network(c.net, active)
    f.fired = True


def poll(c, j, rundir):
    s = c.status(j.id, timeout=20)
    if not s or s.get("state") not in ("completed", "failed", "cancelled"):
        return
    j.state = s["state"]
    j.status = s
    if j.state != "completed":
        fail = s.get("failure")
        j.failure = json.dumps(fail) if not isinstance(fail, str) else fail
        return
    out = os.path.join(rundir, f"job{j.id}-first")
    p = c.fetch_outputs(j.id, out, timeout=60)
    if p.returncode == 0:
        j.first = nc.digests(out)
    # else: copied once the faults have ended (a partition may hide the daemon holding them)


def check_completed(c, j, rundir, reference, report):
    want = reference[j.kind]
    if j.first is None:  # its first copy failed during the faults
        out = os.path.join(rundir, f"job{j.id}-first")
        p = c.fetch_outputs(j.id, out, timeout=60)
        if p.returncode != 0:
            report["lost"].append(f"job {j.id} ({j.kind}) completed, but its outputs cannot be copied: "
                                  f"{p.stderr.strip()[-300:]}")
            return
        j.first = nc.digests(out)
    first_dir = os.path.join(rundir, f"job{j.id}-first")
    got = nc.comparable_digests(first_dir)
    if got != want:
        report["wrong"].append(f"job {j.id} ({j.kind}): {got} instead of {want}")
    if "lineage.txt" in j.first:
        with open(os.path.join(first_dir, "lineage.txt")) as f:
            notes = []
            problems = nc.check_lineage(f.read(), c.events(j.id), notes, outputs=nc.output_versions(j.status))
        report["inferred"] += [f"job {j.id} ({j.kind}): {n}" for n in notes]
        for p in problems:
            report["superseded"].append(f"job {j.id} ({j.kind}): {p}")
    again = os.path.join(rundir, f"job{j.id}-again")
    p = c.fetch_outputs(j.id, again, timeout=60)
    if p.returncode != 0:
        report["lost"].append(f"job {j.id} ({j.kind}): outputs lost after the faults: {p.stderr.strip()[-300:]}")
    elif nc.digests(again) != j.first:
        report["wrong"].append(f"job {j.id} ({j.kind}): outputs changed after the faults: {nc.digests(again)} "
                               f"instead of {j.first}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--copse", default=shutil.which("copse"), help="the copse binary (default: on PATH)")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--hosts", type=int, default=5, help="hosts: the job manager's and one per daemon (3-8)")
    ap.add_argument("--window-s", type=float, default=8.0, help="faults start within this many seconds")
    ap.add_argument("--timeout-s", type=float, default=180.0, help="how long jobs may take once the faults ended")
    ap.add_argument("--workdir", default=None, help="logs of runs with anything to report (default: a new /tmp dir)")
    ap.add_argument("--keep", action="store_true", help="keep every run's logs")
    args = ap.parse_args()
    if not args.copse or not os.path.exists(args.copse):
        ap.error("--copse: the copse binary is needed (none on PATH)")
    if not 3 <= args.hosts <= 8:
        ap.error("--hosts: 3 to 8")
    nc.preflight()
    args.copse = os.path.abspath(args.copse)
    args.workdir = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="copse-netns-soak-"))
    os.makedirs(args.workdir, exist_ok=True)
    print(f"netns soak: {args.runs} runs from seed {args.seed}, {args.hosts} hosts, logs under {args.workdir}", flush=True)
    args.copse = nc.private_copy(args.copse, os.path.join(args.workdir, "bin"))
    kinds = make_kinds(args.workdir)
    reference = {}
    for kind, path in kinds.items():
        reference[kind] = nc.comparable_digests_of_run(args.copse, path, os.path.join(args.workdir, "ref", kind))
    print("fault-free digests: " + ", ".join(f"{k} {sorted(v.values())[0][:12]}" for k, v in reference.items()), flush=True)
    totals = {"runs": 0, "jobs": 0, "times": [], "faults": collections.Counter(), "wrong": 0, "lost": 0,
              "superseded": 0, "hung": 0, "crashed": 0, "restarted": 0, "inferred": 0, "failed": 0, "failed_reasons": collections.Counter()}
    try:
        with nc.Net(args.hosts) as net:
            for run in range(args.runs):
                run_once(args, run, net, kinds, reference, totals)
    finally:
        mix = ", ".join(f"{k} {totals['faults'][k]}" for k in FAULT_KINDS)
        median = statistics.median(totals["times"]) if totals["times"] else 0.0
        reasons = ", ".join(f"{k}: {v}" for k, v in totals["failed_reasons"].items())
        print(f"summary: runs {totals['runs']}, jobs {totals['jobs']}, faults [{mix}], wrong outputs {totals['wrong']}, "
              f"lost outputs {totals['lost']}, superseded reads {totals['superseded']}, jobs failed {totals['failed']}"
              f"{' (' + reasons + ')' if reasons else ''}, jobs never ended {totals['hung']}, "
              f"crashes {totals['crashed']}, daemons restarted after exiting on their own {totals['restarted']}, "
              f"completions missing from event logs {totals['inferred']}, "
              f"median run {median:.1f} s", flush=True)
    return 1 if totals["wrong"] or totals["lost"] or totals["superseded"] or totals["hung"] or totals["crashed"] else 0


if __name__ == "__main__":
    nc.skip_on_unavailable(main)
