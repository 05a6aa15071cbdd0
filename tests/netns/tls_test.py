"""With TLS on (`copse jm --tls`), jobs across four namespace hosts give exactly the bytes
`copse run` gives, and peers without the cluster's TLS directory are refused, saying why.

The job manager runs on h0 with --tls; daemons d1, d2, d3 on h1, h2, h3 get the TLS directory it
made (COPSE_TLS_DIR), as do clients. Every connection between hosts is then TLS (control, output
fetches) or CurveZMQ (stream channels): the hosts are separate network namespaces, so no local
socket is reachable. Checked:
  - examples/wordcount (outputs fetched between daemons), examples/stream_pipeline (a gang whose
    streams cross hosts) and a lineage job complete with copse run's digests;
  - a client on h2 without the TLS directory exits non-zero with "requires TLS";
  - a daemon on h3 without it is refused the same way and never registers.
Exits 77 where namespaces cannot be made.

usage: tls_test.py COPSE REPO WORKDIR"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns_cluster as nc  # noqa: E402


def main():
    copse, repo, work = nc.start_test(sys.argv)
    t0 = time.monotonic()
    jobs = nc.standard_jobs(repo, work)
    reference = nc.reference_digests(copse, jobs, work)

    with nc.Cluster(copse, os.path.join(work, "cluster"), hosts=4, tls=True) as c:
        try:
            c.start_jm()
            if "TLS with" not in c.log("jm"):
                raise nc.Failure("the job manager did not say it runs TLS:\n" + c.log("jm")[-2000:])
            for i in (1, 2, 3):
                c.add_daemon(f"d{i}", i, cpus=2, wait=False)
            c.wait_daemons()
            print(f"TLS cluster up after {time.monotonic() - t0:.1f} s")
            ids = {name: c.submit(path) for name, path in jobs.items()}
            for name, job in ids.items():
                s, events = c.expect_outputs(name, job, os.path.join(work, "out-" + name), reference[name],
                                             lineage=name == "lineage")
                daemons_used = {line.split(" placed on ")[1].split()[0] for line in events if " placed on " in line}
                remote = (s.get("input_bytes") or {}).get("remote", 0)
                print(f"{name} (job {job}): same digests over TLS, {remote} bytes from other daemons, "
                      f"ran on {sorted(daemons_used)}")
                if name == "stream_pipeline" and len(daemons_used) < 2:
                    raise nc.Failure("the stream pipeline ran on one daemon: no stream crossed hosts")
                if name != "stream_pipeline" and remote <= 0:
                    raise nc.Failure(f"{name} read nothing from another daemon")

            plain = c.client(["daemons"], host=2, tls=False)
            if plain.returncode == 0 or "requires TLS" not in plain.stderr:
                raise nc.Failure(f"a plaintext client was not refused with the reason: exit {plain.returncode}, "
                                 f"{plain.stderr.strip()}")
            print(f"plaintext client: {plain.stderr.strip()}")

            saved = c.tls_dir
            c.tls_dir = None  # this daemon's environment lacks the TLS directory
            try:
                p = c.add_daemon("plain", 3, cpus=1, flags=["--reconnect-timeout-s", "1"], wait=False)
            finally:
                c.tls_dir = saved
            nc.wait_until("the plaintext daemon to give up", lambda: p.popen.poll() is not None, 30)
            if "requires TLS" not in c.log("plain"):
                raise nc.Failure("the plaintext daemon's log does not say why it was refused:\n" + c.log("plain")[-2000:])
            if any(r["name"] == "plain" for r in c.daemon_rows()):
                raise nc.Failure("the plaintext daemon registered")
            print("plaintext daemon: refused, " + c.log("plain").strip().splitlines()[-1])
        except BaseException:
            c.dump_logs()
            raise
    print(f"TLS across four hosts: every output identical to copse run's, in {time.monotonic() - t0:.1f} s")
    print("PASS")


if __name__ == "__main__":
    nc.skip_on_unavailable(main)
