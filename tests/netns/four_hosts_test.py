"""Jobs across four namespace hosts give exactly the bytes `copse run` gives on one host.

The job manager runs on h0, daemons d1, d2, d3 on h1, h2, h3 (each labelled host=hN, serving
its outputs at hN's address). Four jobs are submitted at once:
  - examples/wordcount (file and memory channels, all_to_all: shards counted on other daemons),
  - examples/stream_pipeline (a gang of three stream-joined vertices; the daemons have 2 cpus
    each, so the gang spans daemons and 9 MiB stream between hosts),
  - examples/ml/mlp-pipeline2-1f1b-m8 (pipeline-parallel training; its two stages' affinity
    groups on two daemons exchange activations and gradients),
  - a lineage job (tests/netns/lineage_vertex.sh: 256 KiB per channel, and every output says
    which attempt of each input it read).
Each must complete; the sha256 of every declared output must equal the single-host run's
(metrics.json compared without its timings); every job but the stream pipeline must have read
bytes from another daemon (input_bytes.remote > 0) and the stream pipeline must have run on
more than one daemon; the lineage must name only attempts the job manager recorded as
completed. Exits 77 where namespaces cannot be made.

usage: four_hosts_test.py COPSE REPO WORKDIR"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns_cluster as nc  # noqa: E402


def main():
    copse, repo, work = nc.start_test(sys.argv)
    t0 = time.monotonic()
    examples = os.path.join(repo, "examples")
    jobs = nc.standard_jobs(repo, work)
    ml = os.path.join(examples, "ml", "mlp-pipeline2-1f1b-m8.json")
    if os.path.isdir("/usr/share/datasets/fashion-mnist"):
        jobs["mlp_pipeline"] = ml
    else:
        print("note: /usr/share/datasets/fashion-mnist is missing; the ML example is left out")

    # The single-host references first: the cluster's daemons must not compete with them.
    reference = {}
    for name, path in jobs.items():
        reference[name] = nc.comparable_digests_of_run(copse, path, os.path.join(work, "ref-" + name))
        print(f"reference {name}: {reference[name]}")
    print(f"references took {time.monotonic() - t0:.1f} s")

    with nc.Cluster(copse, os.path.join(work, "cluster"), hosts=4) as c:
        try:
            c.start_jm()
            for i in (1, 2, 3):
                c.add_daemon(f"d{i}", i, cpus=2, wait=False)
            c.wait_daemons()
            rows = {r["name"]: r for r in c.daemon_rows() if not r.get("superseded")}
            for i in (1, 2, 3):
                r = rows[f"d{i}"]
                h = c.net.host(i)
                if r["labels"].get("host") != h.name or not r["data"].startswith(h.addr + ":"):
                    raise nc.Failure(f"d{i} should be labelled host={h.name} and serve at {h.addr}: {r}")
            print(f"cluster up after {time.monotonic() - t0:.1f} s: jm on {c.jm_host}, daemons on h1-h3")
            ids = {name: c.submit(path) for name, path in jobs.items()}
            for name, job in ids.items():
                out = os.path.join(work, "out-" + name)
                s, events = c.expect_outputs(name, job, out, reference[name], lineage=name == "lineage")
                daemons_used = {line.split(" placed on ")[1].split()[0] for line in events if " placed on " in line}
                remote = (s.get("input_bytes") or {}).get("remote", 0)
                print(f"{name} (job {job}): completed, same digests, {remote} bytes read from other daemons, "
                      f"ran on {sorted(daemons_used)}")
                if name == "stream_pipeline":
                    if len(daemons_used) < 2:
                        raise nc.Failure(f"{name} ran on one daemon only: nothing crossed the network")
                elif remote <= 0:
                    raise nc.Failure(f"{name} read nothing from another daemon: nothing crossed the network")
        except BaseException:
            c.dump_logs()
            raise
    print(f"four hosts: every output identical to copse run's, in {time.monotonic() - t0:.1f} s")
    print("PASS")


if __name__ == "__main__":
    nc.skip_on_unavailable(main)
