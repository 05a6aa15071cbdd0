"""The harness leaves nothing behind: a program holding a cluster (job manager, daemon, delay
process, faults in force) that gets SIGTERM ends every process it started and deletes its
namespaces; one that gets SIGKILL (what a CTest timeout sends) has them ended and deleted by
its reaper. Checked from outside: after each, no namespace of that program is left and none
of the processes that ran in them is alive. Exits 77 where namespaces cannot be made.

usage: harness_cleanup_test.py COPSE REPO WORKDIR"""

import os
import select
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import netns_cluster as nc  # noqa: E402

HOLDER = r"""
import sys, time
sys.path.insert(0, {here!r})
import netns_cluster as nc
nc.install_signal_handlers()
try:
    with nc.Cluster({copse!r}, {work!r}, hosts=3) as c:
        c.start_jm()
        c.add_daemon("d1", 1)
        c.net.delay(0, 1, 20, 5)
        c.net.loss(1, 2, 0.1)
        c.net.partition(0, 2)
        print("ready", flush=True)
        time.sleep(120)
except nc.Skip as e:
    print("skipped:", e, flush=True)
"""


def really_alive(pid):
    """Alive and not a zombie (a zombie's parent has not collected it: it runs nothing)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def namespaces_of(pid):
    return [n for n in nc.netns_list() if n.startswith(f"{nc.PREFIX}{pid}-")]


def pids_in(namespaces):
    pids = set()
    for ns in namespaces:
        out = nc.sh(["ip", "netns", "pids", ns], check=False).stdout
        pids.update(int(p) for p in out.split())
    return pids


def run_and_kill(copse, work, sig):
    holder = subprocess.Popen([nc.PYTHON, "-c", HOLDER.format(here=nc.HERE, copse=copse, work=work)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        line = ""
        while time.monotonic() < deadline and "ready" not in line and "skipped" not in line:
            r, _, _ = select.select([holder.stdout], [], [], max(0.1, deadline - time.monotonic()))
            if r:
                line = holder.stdout.readline()
                if not line:
                    break
        if "skipped" in line:
            raise nc.Skip(line.split(":", 1)[1].strip())
        if "ready" not in line:
            raise nc.Failure(f"the holder did not start its cluster: {line!r} {holder.stdout.read() if holder.poll() is not None else ''}")
        namespaces = namespaces_of(holder.pid)
        pids = pids_in(namespaces)
        if len(namespaces) != 4 or len(pids) < 3:
            raise nc.Failure(f"expected 4 namespaces and a job manager, a daemon and a delay process in them: "
                             f"{namespaces}, pids {sorted(pids)}")
        holder.send_signal(sig)
        holder.wait(timeout=40)
        # After SIGKILL the reaper does the work, on its own time: wait for it (bounded).
        nc.wait_until(f"the namespaces of pid {holder.pid} to go", lambda: not namespaces_of(holder.pid), 30, 0.2)
        nc.wait_until("the processes that ran in them to end", lambda: not [p for p in pids if really_alive(p)], 30, 0.2)
        print(f"{signal.Signals(sig).name}: {len(namespaces)} namespaces deleted, {len(pids)} processes ended "
              f"(holder exit {holder.returncode})")
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=10)


def main():
    copse, _repo, work = nc.start_test(sys.argv)
    run_and_kill(copse, os.path.join(work, "term"), signal.SIGTERM)
    run_and_kill(copse, os.path.join(work, "kill"), signal.SIGKILL)
    print("PASS")


if __name__ == "__main__":
    nc.skip_on_unavailable(main)
