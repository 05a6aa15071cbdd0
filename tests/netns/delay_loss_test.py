"""Jobs complete with the right bytes over a slow, lossy, reordering network.

The job manager runs on h0, daemons d1, d2, d3 on h1, h2, h3. Between every two hosts, each
packet is delayed 30 ms +- 10 ms (uniform, so packets sent within 20 ms of each other are
reordered; a round trip takes about 60 ms) and 2 % of packets are dropped, each way
(netns_cluster.Net.delay and .loss: NFQUEUE and iptables statistic). The harness first checks
that the faults are in force (a TCP round trip between two daemon hosts takes at least 40 ms);
then wordcount, the stream pipeline (9 MiB streamed between hosts) and a lineage job (256 KiB
per channel) are submitted at once. Each must complete with the digests `copse run` gives
without faults, the lineage must name only completed attempts, none superseded when read
(check_lineage), and the loss rules must have dropped packets (else loss was not tested).
Exits 77 where namespaces cannot be made.

usage: delay_loss_test.py COPSE REPO WORKDIR"""

import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns_cluster as nc  # noqa: E402

DELAY_MS, JITTER_MS, LOSS = 30, 10, 0.02


def dropped_by_loss(net):
    """Packets the loss rules dropped, over every host."""
    total = 0
    for h in net.hosts:
        out = net.run_in(h.ns, ["iptables", "-w", "5", "-L", "COPSE-IN", "-n", "-v", "-x"], check=False).stdout
        for line in out.splitlines():
            if "DROP" in line and "statistic" in line:
                total += int(line.split()[0])
    return total


def main():
    copse, repo, work = nc.start_test(sys.argv)
    t0 = time.monotonic()
    jobs = nc.standard_jobs(repo, work)
    # (examples/ml/mlp-pipeline2-1f1b-m8, whose 800 micro-batch exchanges each wait a round
    # trip or more here, takes 80 s: too long for this test.)
    reference = nc.reference_digests(copse, jobs, work)
    print(f"references: {reference} ({time.monotonic() - t0:.1f} s)")

    with nc.Cluster(copse, os.path.join(work, "cluster"), hosts=4) as c:
        try:
            c.start_jm()
            for i in (1, 2, 3):
                c.add_daemon(f"d{i}", i, cpus=2, wait=False)
            c.wait_daemons()
            hosts = c.net.hosts
            plain = nc.tcp_rtt_ms(c.net, 1, 2)
            for i in range(len(hosts)):
                for j in range(i + 1, len(hosts)):
                    c.net.delay(i, j, DELAY_MS, JITTER_MS)
                    c.net.loss(i, j, LOSS)
            slow = nc.tcp_rtt_ms(c.net, 1, 2, samples=7)
            print(f"round trip h1-h2: {plain:.2f} ms without faults, {slow:.1f} ms with them (median of 7)")
            if slow < 2 * DELAY_MS - 2 * JITTER_MS:
                raise nc.Failure(f"the delay is not in force: a round trip takes {slow:.1f} ms")
            c.wait_daemons(timeout=30)
            start = time.monotonic()
            ids = {name: c.submit(path) for name, path in jobs.items()}
            for name, job in ids.items():
                out = os.path.join(work, "out-" + name)
                s, events = c.expect_outputs(name, job, out, reference[name], fetch_timeout=90, lineage=name == "lineage")
                reruns = sum(1 for line in events if re.search(r" version \d+ failed", line))
                print(f"{name} (job {job}): completed after {time.monotonic() - start:.1f} s, same digests, "
                      f"{reruns} failed attempts")
            dropped = dropped_by_loss(c.net)
            print(f"packets dropped by the loss rules: {dropped}")
            if dropped == 0:
                raise nc.Failure("no packet was dropped: loss was not tested")
        except BaseException:
            c.dump_logs()
            raise
    print(f"delay and loss: every output identical to copse run's, in {time.monotonic() - t0:.1f} s")
    print("PASS")


if __name__ == "__main__":
    nc.skip_on_unavailable(main)
