"""A copse cluster spread over several "hosts" made of Linux network namespaces, with faults
between chosen hosts (docs/multi-host-testing.md).

Each host is a network namespace with one address on a private /24 (10.X.Y.0/24, X and Y from
this process's pid) and a veth whose other end is a port of a bridge; the bridge lives in a
namespace of its own (the "switch"), so the root namespace is not touched. Faults:

  - partition(a, b): every packet from a host of one side arriving at a host of the other is
    dropped (iptables DROP in the receiver's INPUT chain, both ways): the senders' kernels
    cannot tell and see silence, as behind a failed switch;
  - loss(a, b, p): the same for a random share p of the packets (iptables `-m statistic`);
  - delay(a, b, ms, jitter_ms, reorder): every packet is held in an NFQUEUE queue by a small
    process of this module in the receiving namespace and accepted ms +- jitter_ms later
    (uniform), which reorders packets sent closer together than the jitter; `reorder`, a
    share of packets accepted at once (they overtake the held ones, as netem's reorder);
  - kill/restart of a daemon (same name and work dir), SIGKILL/restart of the job manager
    (same state dir and address).

The kernel has no netem; NFQUEUE delays every packet, SYNs, ACKs and heartbeats included, at
the network layer, so TCP itself sees the delay, the reordering and the losses (a proxy would
terminate TCP and acknowledge data the peer has not received).

Every process started here is ended by its pid, and every namespace deleted, when the Cluster
(or Net) is closed: also on an exception, on SIGTERM/SIGINT/SIGHUP (turned into SystemExit),
and, when this process is killed outright (a CTest timeout sends SIGKILL), by a reaper process
that waits for this one's end on a pipe. Namespaces of earlier runs whose process is gone are
deleted at start. Every wait is bounded.

Python's standard library only; needs root. Where namespaces, veths, bridges or iptables are
missing, `Skip` is raised: tests print "skipped: <reason>" and exit 77 (`skip_on_unavailable`).

Also a program: `netns_cluster.py nfqueue QUEUE...` (the delay process, run inside a
namespace; it reads `set QUEUE MS JITTER_MS REORDER` lines on stdin and exits at its end) and
`netns_cluster.py reap PREFIX` (the reaper).
"""

import contextlib
import errno
import hashlib
import heapq
import json
import os
import random
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time

PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
THIS = os.path.abspath(__file__)
HERE = os.path.dirname(THIS)
LINEAGE_VERTEX = os.path.join(HERE, "lineage_vertex.sh")
PREFIX = "cpsn"  # every namespace of this harness: cpsn<pid>-sw, cpsn<pid>-h<i>
JM_PORT = 7077
SKIP_CODE = 77


class Skip(Exception):
    """This machine cannot run the harness (no namespaces, veths, bridges or iptables)."""


class Failure(AssertionError):
    """A check failed."""


def sh(argv, timeout=30, check=True, input=None):
    """Runs argv to its end (at most `timeout` s), its output captured as text."""
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=input)
    except subprocess.TimeoutExpired as e:
        raise Failure(f"{' '.join(argv)}: still running after {timeout} s") from e
    if check and p.returncode != 0:
        raise Failure(f"{' '.join(argv)}: exit {p.returncode}: {p.stderr.strip() or p.stdout.strip()}")
    return p


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def digests(directory):
    """{relative path: sha256} of every file under directory."""
    out = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            out[os.path.relpath(path, directory)] = sha256_file(path)
    return out


def wait_until(what, predicate, timeout, interval=0.1):
    """Calls predicate until it returns something true (returned) or `timeout` s passed (raises)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise Failure(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


# ---- signals and the reaper ------------------------------------------------------------------

def _raise_exit(signum, _frame):
    raise SystemExit(128 + signum)


def install_signal_handlers():
    """SIGTERM, SIGINT and SIGHUP end the program through SystemExit, so every `finally` and
    context manager runs (ending processes, deleting namespaces)."""
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, _raise_exit)


def netns_list():
    p = sh(["ip", "netns", "list"], check=False, timeout=10)
    return [line.split()[0] for line in p.stdout.splitlines() if line.strip()]


def delete_namespace(ns):
    """Ends every process left in ns (SIGKILL, by pid) and deletes it."""
    p = sh(["ip", "netns", "pids", ns], check=False, timeout=10)
    for pid in p.stdout.split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    sh(["ip", "netns", "del", ns], check=False, timeout=10)


def delete_namespaces(prefix):
    """Deletes the namespaces whose names start with prefix (the switch last)."""
    names = [n for n in netns_list() if n.startswith(prefix)]
    for ns in sorted(names, key=lambda n: n.endswith("-sw")):
        delete_namespace(ns)


def delete_stale_namespaces():
    """Namespaces of earlier runs of this harness whose process is gone (killed outright, and
    its reaper too)."""
    for ns in netns_list():
        m = re.match(PREFIX + r"(\d+)-", ns)
        if m and int(m.group(1)) != os.getpid() and not pid_alive(int(m.group(1))):
            delete_namespace(ns)


def reaper_main(prefix):
    """Waits for its parent's end (EOF on stdin), then deletes the parent's namespaces, ending
    what runs in them. Ignores the signals a terminal or CTest sends the parent's group."""
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    with contextlib.suppress(OSError):
        while sys.stdin.buffer.read(1 << 12):
            pass
    delete_namespaces(prefix)


# ---- NFQUEUE: delay and reordering in userspace -------------------------------------------------

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = 0, 1, 2
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN, NFQA_CFG_MASK, NFQA_CFG_FLAGS = 1, 2, 3, 4, 5
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_CFG_F_FAIL_OPEN, NFQA_CFG_F_GSO = 1, 4
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
NF_ACCEPT = 1


def _nlattr(kind, payload):
    length = 4 + len(payload)
    return struct.pack("=HH", length, kind) + payload + b"\0" * ((4 - length % 4) % 4)


def _nfq_msg(msg_type, queue, attrs, flags=NLM_F_REQUEST, seq=0, family=socket.AF_UNSPEC):
    body = struct.pack("=BB", family, 0) + struct.pack(">H", queue) + b"".join(attrs)
    return struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg_type, flags, seq, 0) + body


def _nl_messages(data):
    off = 0
    while off + 16 <= len(data):
        length, kind, _flags, seq, _pid = struct.unpack_from("=IHHII", data, off)
        if length < 16:
            break
        yield kind, seq, data[off + 16:off + length]
        off += (length + 3) & ~3


def _nl_attrs(data):
    off = 0
    while off + 4 <= len(data):
        length, kind = struct.unpack_from("=HH", data, off)
        if length < 4:
            break
        yield kind & 0x3FFF, data[off + 4:off + length]
        off += (length + 3) & ~3


def nfqueue_main(queues):
    """Holds the packets of the given queues for their delay. Settings per queue arrive on
    stdin (`set QUEUE MS JITTER_MS REORDER`); EOF ends it (its queues are then released and the
    rules' --queue-bypass lets packets through)."""
    for s in (signal.SIGINT, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    nl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    nl.bind((0, 0))
    with contextlib.suppress(OSError):
        nl.setsockopt(socket.SOL_SOCKET, 33, 16 << 20)  # SO_RCVBUFFORCE
    with contextlib.suppress(OSError):
        nl.setsockopt(270, 5, 1)  # SOL_NETLINK, NETLINK_NO_ENOBUFS
    seq = 0
    for q in queues:
        for attrs in ([_nlattr(NFQA_CFG_CMD, struct.pack(">BxH", NFQNL_CFG_CMD_BIND, socket.AF_INET))],
                      [_nlattr(NFQA_CFG_PARAMS, struct.pack(">IB", 0, NFQNL_COPY_META)),
                       _nlattr(NFQA_CFG_QUEUE_MAXLEN, struct.pack(">I", 20000)),
                       _nlattr(NFQA_CFG_MASK, struct.pack(">I", NFQA_CFG_F_FAIL_OPEN | NFQA_CFG_F_GSO)),
                       _nlattr(NFQA_CFG_FLAGS, struct.pack(">I", NFQA_CFG_F_FAIL_OPEN | NFQA_CFG_F_GSO))]):
            seq += 1
            nl.send(_nfq_msg(NFQNL_MSG_CONFIG, q, attrs, NLM_F_REQUEST | NLM_F_ACK, seq))
            deadline = time.monotonic() + 5
            acked = False
            while not acked and time.monotonic() < deadline:
                r, _, _ = select.select([nl], [], [], 0.5)
                if not r:
                    continue
                for kind, mseq, body in _nl_messages(nl.recv(65536)):
                    if kind == NLMSG_ERROR and mseq == seq:
                        err = struct.unpack_from("=i", body)[0]
                        if err:
                            print(f"nfqueue: configuring queue {q}: {os.strerror(-err)}", file=sys.stderr, flush=True)
                            sys.exit(1)
                        acked = True
            if not acked:
                print(f"nfqueue: no answer configuring queue {q}", file=sys.stderr, flush=True)
                sys.exit(1)
    settings = {q: (0.0, 0.0, 0.0) for q in queues}
    held = []  # (due, n, queue, packet id)
    n = 0
    rng = random.Random(os.getpid())
    stdin = sys.stdin.buffer.raw if hasattr(sys.stdin.buffer, "raw") else sys.stdin.buffer
    pending_line = b""
    print("nfqueue: ready", flush=True)

    def verdict(queue, packet_id):
        msg = _nfq_msg(NFQNL_MSG_VERDICT, queue, [_nlattr(NFQA_VERDICT_HDR, struct.pack(">II", NF_ACCEPT, packet_id))])
        with contextlib.suppress(OSError):
            nl.send(msg)

    while True:
        now = time.monotonic()
        while held and held[0][0] <= now:
            _, _, q, pid = heapq.heappop(held)
            verdict(q, pid)
        timeout = max(0.0, held[0][0] - now) if held else 1.0
        r, _, _ = select.select([nl, stdin], [], [], timeout)
        if stdin in r:
            chunk = os.read(stdin.fileno(), 4096)
            if not chunk:
                return
            pending_line += chunk
            while b"\n" in pending_line:
                line, pending_line = pending_line.split(b"\n", 1)
                parts = line.decode().split()
                if len(parts) == 5 and parts[0] == "set":
                    settings[int(parts[1])] = (float(parts[2]) / 1000, float(parts[3]) / 1000, float(parts[4]))
        if nl in r:
            try:
                data = nl.recv(1 << 20)
            except OSError as e:
                if e.errno == errno.ENOBUFS:
                    continue
                raise
            now = time.monotonic()
            for kind, _, body in _nl_messages(data):
                if kind != (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET or len(body) < 4:
                    continue
                queue = struct.unpack_from(">H", body, 2)[0]
                for akind, payload in _nl_attrs(body[4:]):
                    if akind == NFQA_PACKET_HDR:
                        packet_id = struct.unpack_from(">I", payload)[0]
                        delay, jitter, reorder = settings.get(queue, (0.0, 0.0, 0.0))
                        if reorder and rng.random() < reorder:
                            delay = 0.0  # sent at once: overtakes the packets held
                        elif jitter:
                            delay = max(0.0, delay + rng.uniform(-jitter, jitter))
                        if delay <= 0:
                            verdict(queue, packet_id)
                        else:
                            n += 1
                            heapq.heappush(held, (now + delay, n, queue, packet_id))
                        break


# ---- the network ------------------------------------------------------------------------------

class Host:
    def __init__(self, index, ns, addr):
        self.index = index
        self.name = f"h{index}"
        self.ns = ns
        self.addr = addr

    def __repr__(self):
        return f"{self.name}({self.addr})"


def preflight():
    """Raises Skip unless this process can make network namespaces (root, ip, iptables): for
    tests to call before any expensive step. Net checks the rest (veth, bridge, iptables rules
    inside a namespace) as it builds."""
    if os.geteuid() != 0:
        raise Skip("needs root (network namespaces, veths, iptables)")
    for tool in ("ip", "iptables", "iptables-restore"):
        if not shutil.which(tool):
            raise Skip(f"{tool} is not installed")
    probe = f"{PREFIX}{os.getpid()}-probe"
    p = sh(["ip", "netns", "add", probe], check=False)
    if p.returncode != 0:
        raise Skip(f"cannot create network namespaces: {p.stderr.strip()}")
    sh(["ip", "netns", "del", probe], check=False)


class Net:
    """N hosts (network namespaces) on one bridge, and the faults between them."""

    def __init__(self, hosts=4):
        preflight()
        pid = os.getpid()
        self.prefix = f"{PREFIX}{pid}-"
        self.subnet = f"10.{100 + (pid >> 8) % 150}.{pid % 256}"
        self.switch = self.prefix + "sw"
        self.hosts = [Host(i, f"{self.prefix}h{i}", f"{self.subnet}.{i + 1}") for i in range(hosts)]
        self.partitions = set()  # frozenset({i, j}) of host indices
        self.losses = {}  # (dst, src) -> probability
        self.delays = {}  # (dst, src) -> (ms, jitter ms, reorder share)
        self.nfqueue = {}  # dst -> Popen of its delay process
        self.reaper = None
        self.closed = False
        delete_stale_namespaces()
        # The reaper deletes this run's namespaces should this process be killed outright.
        self.reaper = subprocess.Popen([PYTHON, THIS, "reap", self.prefix], stdin=subprocess.PIPE,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            self._build()
        except BaseException:
            self.close()
            raise

    def _build(self):
        p = sh(["ip", "netns", "add", self.switch], check=False)
        if p.returncode != 0:
            raise Skip(f"cannot create network namespaces: {p.stderr.strip()}")
        p = self.run_in(self.switch, ["ip", "link", "add", "br0", "type", "bridge"], check=False)
        if p.returncode != 0:
            raise Skip(f"cannot create a bridge: {p.stderr.strip()}")
        # Bridged frames need not pass the switch's iptables (it has no rules; br_netfilter).
        self.run_in(self.switch, ["sysctl", "-q", "-w", "net.bridge.bridge-nf-call-iptables=0"], check=False)
        self.run_in(self.switch, ["ip", "link", "set", "br0", "up"])
        self.run_in(self.switch, ["ip", "link", "set", "lo", "up"])
        for h in self.hosts:
            sh(["ip", "netns", "add", h.ns])
            p = self.run_in(self.switch, ["ip", "link", "add", f"p{h.index}", "type", "veth", "peer", "name", "eth0",
                                          "netns", h.ns], check=False)
            if p.returncode != 0:
                raise Skip(f"cannot create a veth pair: {p.stderr.strip()}")
            self.run_in(self.switch, ["ip", "link", "set", f"p{h.index}", "master", "br0", "up"])
            self.run_in(h.ns, ["ip", "addr", "add", f"{h.addr}/24", "dev", "eth0"])
            self.run_in(h.ns, ["ip", "link", "set", "eth0", "up"])
            self.run_in(h.ns, ["ip", "link", "set", "lo", "up"])
            for cmd in (["iptables", "-w", "5", "-N", "COPSE-IN"], ["iptables", "-w", "5", "-I", "INPUT", "-j", "COPSE-IN"]):
                p = self.run_in(h.ns, cmd, check=False)
                if p.returncode != 0:
                    raise Skip(f"iptables does not work in a namespace: {p.stderr.strip()}")
            # The rules the faults need must load here (statistic, NFQUEUE).
            self._apply(h.index, probe=True)

    def run_in(self, ns, argv, timeout=30, check=True):
        return sh(["ip", "netns", "exec", ns, *argv], timeout=timeout, check=check)

    def host(self, h):
        if isinstance(h, Host):
            return h
        if isinstance(h, str):
            return self.hosts[int(h.lstrip("h"))]
        return self.hosts[h]

    def _indices(self, hs):
        if isinstance(hs, (list, tuple, set, frozenset)):
            return [self.host(h).index for h in hs]
        return [self.host(hs).index]

    # -- faults --

    def partition(self, a, b):
        """Drops every packet between any host of a and any host of b (hosts or lists of them)."""
        for i in self._indices(a):
            for j in self._indices(b):
                if i != j:
                    self.partitions.add(frozenset((i, j)))
        self._apply_all()

    def isolate(self, a):
        """Partitions host a from every other host."""
        self.partition(a, [h for h in self.hosts if h.index != self.host(a).index])

    def heal(self, a=None, b=None):
        """Ends the partitions between a and b (every partition when a is None)."""
        if a is None:
            self.partitions.clear()
        else:
            others = self._indices(b) if b is not None else range(len(self.hosts))
            for i in self._indices(a):
                for j in others:
                    self.partitions.discard(frozenset((i, j)))
        self._apply_all()

    def loss(self, a, b, probability):
        """Drops a random share of the packets between a and b, both ways (0 ends it)."""
        for i in self._indices(a):
            for j in self._indices(b):
                if i != j:
                    for key in ((i, j), (j, i)):
                        if probability > 0:
                            self.losses[key] = probability
                        else:
                            self.losses.pop(key, None)
        self._apply_all()

    def delay(self, a, b, ms, jitter_ms=0, reorder=0.0):
        """Delays every packet between a and b by ms +- jitter_ms, each way (so a round trip
        takes 2 ms more); a share `reorder` of them goes at once. ms 0 ends it."""
        for i in self._indices(a):
            for j in self._indices(b):
                if i != j:
                    for key in ((i, j), (j, i)):
                        if ms > 0 or jitter_ms > 0:
                            self.delays[key] = (ms, jitter_ms, reorder)
                        else:
                            self.delays.pop(key, None)
        self._apply_all()

    def set_faults(self, partitions=(), losses=None, delays=None):
        """Replaces every fault at once: partitions, pairs of hosts; losses, {(dst, src):
        probability}; delays, {(dst, src): (ms, jitter ms, reorder share)} (directed: packets
        from src arriving at dst). For callers that overlap faults and compute their union."""
        self.partitions = {frozenset((self.host(a).index, self.host(b).index)) for a, b in partitions}
        self.losses = dict(losses or {})
        self.delays = dict(delays or {})
        self._apply_all()

    def clear(self):
        """No fault anywhere."""
        self.partitions.clear()
        self.losses.clear()
        self.delays.clear()
        self._apply_all()

    def faults(self):
        """The faults in force, for people."""
        out = [f"partition h{min(p)}-h{max(p)}" for p in sorted(self.partitions, key=sorted)]
        out += [f"loss h{s}->h{d} {p:.0%}" for (d, s), p in sorted(self.losses.items())]
        out += [f"delay h{s}->h{d} {m}+-{j} ms reorder {r:.0%}" for (d, s), (m, j, r) in sorted(self.delays.items())]
        return out

    def _nfqueue_process(self, dst):
        proc = self.nfqueue.get(dst)
        if proc and proc.poll() is None:
            return proc
        queues = [str(100 + h.index) for h in self.hosts]
        proc = subprocess.Popen(["ip", "netns", "exec", self.hosts[dst].ns, PYTHON, THIS, "nfqueue", *queues],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.nfqueue[dst] = proc
        r, _, _ = select.select([proc.stdout], [], [], 10)
        line = proc.stdout.readline() if r else ""
        if "ready" not in line:
            proc.kill()
            proc.wait(timeout=10)
            raise Skip(f"NFQUEUE does not work in a namespace: {line.strip() or 'no answer in 10 s'}")
        return proc

    def _apply_all(self):
        for h in self.hosts:
            self._apply(h.index)

    def _apply(self, dst, probe=False):
        """Rewrites host dst's COPSE-IN chain (atomically, iptables-restore) from the faults in force."""
        rules = []
        for h in self.hosts:
            j = h.index
            if j == dst:
                continue
            src = h.addr
            if frozenset((dst, j)) in self.partitions:
                rules.append(f"-A COPSE-IN -s {src} -j DROP")
                continue
            p = self.losses.get((dst, j))
            if p:
                rules.append(f"-A COPSE-IN -s {src} -m statistic --mode random --probability {p:.4f} -j DROP")
            d = self.delays.get((dst, j))
            if d:
                proc = self._nfqueue_process(dst)
                proc.stdin.write(f"set {100 + j} {d[0]} {d[1]} {d[2]}\n")
                proc.stdin.flush()
                rules.append(f"-A COPSE-IN -s {src} -j NFQUEUE --queue-num {100 + j} --queue-bypass")
        if probe:  # rules of every kind, to an address no host has, then none
            rules = [f"-A COPSE-IN -s {self.subnet}.250 -m statistic --mode random --probability 0.5 -j DROP",
                     f"-A COPSE-IN -s {self.subnet}.251 -j NFQUEUE --queue-num 99 --queue-bypass"]
        text = "*filter\n:COPSE-IN - [0:0]\n" + "".join(r + "\n" for r in rules) + "COMMIT\n"
        p = sh(["ip", "netns", "exec", self.hosts[dst].ns, "iptables-restore", "-w", "5", "--noflush"], input=text,
               check=False)
        if p.returncode != 0:
            if probe:
                raise Skip(f"iptables statistic/NFQUEUE rules do not load: {p.stderr.strip()}")
            raise Failure(f"iptables-restore in {self.hosts[dst].name}: {p.stderr.strip()}\n{text}")
        if probe:
            self._apply(dst)

    def rules(self, h):
        """Host h's COPSE-IN chain with its counters, for reports."""
        return self.run_in(self.host(h).ns, ["iptables", "-w", "5", "-L", "COPSE-IN", "-n", "-v"], check=False).stdout

    def close(self):
        if self.closed:
            return
        self.closed = True
        for proc in self.nfqueue.values():
            with contextlib.suppress(OSError, ValueError):
                proc.stdin.close()
        for proc in self.nfqueue.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        for h in self.hosts:
            delete_namespace(h.ns)
        delete_namespace(self.switch)
        if self.reaper:
            with contextlib.suppress(OSError, ValueError):
                self.reaper.stdin.close()
            try:
                self.reaper.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.reaper.kill()
                self.reaper.wait(timeout=5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def tcp_rtt_ms(net, src, dst, port=9, samples=5):
    """Median time to connect from host src to a closed port of host dst (a SYN out, a RST
    back): one network round trip, for checking the faults in force."""
    code = ("import socket,time,statistics\nts=[]\n"
            f"for _ in range({samples}):\n"
            " s=socket.socket(); s.settimeout(5); t=time.monotonic()\n"
            f" try: s.connect(('{net.host(dst).addr}',{port}))\n"
            " except OSError: pass\n"
            " ts.append((time.monotonic()-t)*1000); s.close()\n"
            "print(statistics.median(ts))\n")
    p = net.run_in(net.host(src).ns, [PYTHON, "-c", code], timeout=60)
    return float(p.stdout.strip())


# ---- the cluster ------------------------------------------------------------------------------

class Proc:
    def __init__(self, name, host, argv, logpath):
        self.name = name
        self.host = host
        self.argv = argv
        self.logpath = logpath
        self.popen = None
        self.starts = 0


class Cluster:
    """A job manager and daemons on the hosts of a Net, each a process started (and ended) here.

    `Cluster(copse, workdir, hosts=4)` makes the Net too (closed with the cluster)."""

    def __init__(self, copse, workdir, hosts=4, heartbeat_timeout_ms=1000, jm_host=0, jm_flags=(), net=None,
                 log_level=None, tls=False):
        self.copse = os.path.abspath(copse)
        self.dir = os.path.abspath(workdir)
        os.makedirs(self.dir, exist_ok=True)
        self.heartbeat_timeout_ms = heartbeat_timeout_ms
        self.log_level = log_level
        self.own_net = net is None
        self.net = net or Net(hosts)
        self.procs = {}
        self.state = os.path.join(self.dir, "jm")
        self.jm_host = self.net.host(jm_host)
        self.jm_addr = f"{self.jm_host.addr}:{JM_PORT}"
        self.token = os.path.join(self.state, "secret")
        self.jm_flags = list(jm_flags) + (["--tls"] if tls else [])
        # With TLS every process gets the cluster's TLS directory (made by `copse jm --tls`)
        # through COPSE_TLS_DIR, as a copy of it would reach another machine.
        self.tls_dir = os.path.join(self.state, "tls") if tls else None
        self.closed = False

    # -- processes --

    def _env(self):
        return dict(self.client_env(), COPSE_DIE_WITH_PARENT="1")

    def client_env(self, tls=True):
        """The environment of a process of this cluster; tls=False leaves the TLS directory out."""
        env = dict(os.environ, COPSE_TOKEN_FILE=self.token)
        env.pop("COPSE_TLS_DIR", None)
        if self.tls_dir and tls:
            env["COPSE_TLS_DIR"] = self.tls_dir
        return env

    def _spawn(self, p):
        logf = open(p.logpath, "a")
        logf.write(f"==== start {p.starts + 1} at {time.strftime('%H:%M:%S')}\n")
        logf.flush()
        try:
            p.popen = subprocess.Popen(["ip", "netns", "exec", p.host.ns, *p.argv], stdout=logf, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, env=self._env())
        finally:
            logf.close()
        p.starts += 1

    def start_jm(self, timeout=30):
        """Starts the job manager on its host (or again, on the same state dir and address) and
        waits until it listens."""
        p = self.procs.get("jm")
        if p is None:
            argv = [self.copse, "jm", "--listen", self.jm_addr, "--state-dir", self.state, "--heartbeat-timeout-ms",
                    str(self.heartbeat_timeout_ms), *self.jm_flags]
            if self.log_level:
                argv += ["--log-level", self.log_level]
            p = self.procs["jm"] = Proc("jm", self.jm_host, argv, os.path.join(self.dir, "jm.log"))
        elif p.popen and p.popen.poll() is None:
            raise Failure("the job manager is running already")
        mark = self._log_size(p)
        self._spawn(p)
        wait_until("the job manager to listen", lambda: self._alive_or_raise(p) and "copse jm: listening" in self._log_tail(p, mark),
                   timeout, 0.05)

    def _alive_or_raise(self, p):
        if p.popen.poll() is not None:
            raise Failure(f"{p.name} exited ({p.popen.returncode}):\n{self.log(p.name)[-3000:]}")
        return True

    def _log_size(self, p):
        try:
            return os.path.getsize(p.logpath)
        except OSError:
            return 0

    def _log_tail(self, p, offset):
        try:
            with open(p.logpath, errors="replace") as f:
                f.seek(offset)
                return f.read()
        except OSError:
            return ""

    def add_daemon(self, name, host, cpus=2, flags=(), wait=True):
        """Starts daemon `name` on `host`, labelled host=<its host>, serving its outputs at the
        host's address, with work dir <dir>/<name>."""
        h = self.net.host(host)
        argv = [self.copse, "daemon", "--jm", self.jm_addr, "--name", name, "--cpus", str(cpus), "--work-dir",
                os.path.join(self.dir, name), "--label", f"host={h.name}", "--data-host", h.addr, *flags]
        if self.log_level:
            argv += ["--log-level", self.log_level]
        p = self.procs[name] = Proc(name, h, argv, os.path.join(self.dir, name + ".log"))
        self._spawn(p)
        if wait:
            self.wait_daemons([name])
        return p

    def daemons(self):
        return [n for n in self.procs if n != "jm"]

    def start(self, name, wait=True):
        """Starts a stopped daemon again (same name, host, work dir) or the job manager."""
        if name == "jm":
            return self.start_jm()
        p = self.procs[name]
        if p.popen and p.popen.poll() is None:
            raise Failure(f"{name} is running already")
        self._spawn(p)
        if wait:
            self.wait_daemons([name])

    def kill(self, name, sig=signal.SIGKILL, timeout=20):
        """Sends sig to the process by its pid and waits for its end (SIGKILL after timeout)."""
        p = self.procs[name]
        if not p.popen or p.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            p.popen.send_signal(sig)
        try:
            p.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.popen.kill()
            p.popen.wait(timeout=10)

    def running(self, name):
        p = self.procs.get(name)
        return bool(p and p.popen and p.popen.poll() is None)

    def log(self, name):
        p = self.procs[name]
        try:
            with open(p.logpath, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    # -- clients --

    def client(self, args, host=None, timeout=60, check=False, tls=True):
        """Runs `copse ARGS --jm <the job manager>` on a host (the job manager's by default);
        tls=False: without the cluster's TLS directory."""
        h = self.net.host(host) if host is not None else self.jm_host
        argv = ["ip", "netns", "exec", h.ns, self.copse, *args, "--jm", self.jm_addr]
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                               env=self.client_env(tls))
        except subprocess.TimeoutExpired as e:
            raise Failure(f"copse {' '.join(args)}: no answer in {timeout} s") from e
        if check and p.returncode != 0:
            raise Failure(f"copse {' '.join(args)}: exit {p.returncode}: {p.stderr.strip()[-2000:]} {p.stdout.strip()[-2000:]}")
        return p

    def daemon_rows(self):
        p = self.client(["daemons", "-o", "json"], timeout=40)
        if p.returncode != 0:
            return None
        rows = json.loads(p.stdout)
        return rows.get("daemons", rows) if isinstance(rows, dict) else rows

    def alive_daemons(self):
        rows = self.daemon_rows() or []
        return {r["name"] for r in rows if not r.get("superseded") and r.get("state") == "alive"}

    def wait_daemons(self, names=None, timeout=30):
        """Waits until the named daemons (all by default) are alive in the job manager's list."""
        names = set(names if names is not None else self.daemons())

        def alive():
            for n in names:
                if n in self.procs and self.procs[n].popen and self.procs[n].popen.poll() is not None:
                    raise Failure(f"daemon {n} exited ({self.procs[n].popen.returncode}):\n{self.log(n)[-2000:]}")
            return names <= self.alive_daemons()
        return wait_until(f"daemons {sorted(names)} to be alive", alive, timeout, 0.2)

    def submit(self, job_file, host=None):
        p = self.client(["submit", job_file, "-o", "json"], host=host, check=True)
        return json.loads(p.stdout)["id"]

    def status(self, job, timeout=40):
        """The job's status (a dict), or None when the job manager does not answer."""
        p = self.client(["status", str(job), "-o", "json"], timeout=timeout)
        if p.returncode != 0:
            return None
        try:
            return json.loads(p.stdout)
        except ValueError:
            return None

    def wait_job(self, job, timeout=120):
        """Waits until the job has ended; returns its final status (raises on timeout)."""
        def ended():
            s = self.status(job)
            return s if s and s.get("state") in ("completed", "failed", "cancelled") else None
        return wait_until(f"job {job} to end", ended, timeout, 0.25)

    def expect_outputs(self, what, job, outdir, want, timeout=120, fetch_timeout=60, lineage=False):
        """Waits for `job` to complete, copies its declared outputs to outdir and compares their
        digests with `want` (copse run's); with `lineage`, also checks its lineage.txt against
        the event log (check_lineage). Raises Failure naming `what` and what was wrong, the
        job's event lines included when it did not complete. Returns (status, event lines)."""
        s = self.wait_job(job, timeout=timeout)
        events = self.events(job)
        if s["state"] != "completed":
            raise Failure(f"{what} (job {job}) ended {s['state']}: {s.get('failure')}; its events:\n  " +
                          "\n  ".join(events))
        p = self.fetch_outputs(job, outdir, timeout=fetch_timeout)
        if p.returncode != 0:
            raise Failure(f"status --output of {what}: {p.stderr.strip()}")
        got = comparable_digests(outdir)
        if got != want:
            raise Failure(f"{what}: outputs differ from copse run's:\n  cluster   {got}\n  reference {want}")
        if lineage:
            with open(os.path.join(outdir, "lineage.txt")) as f:
                problems = check_lineage(f.read(), events, outputs=output_versions(s))
            if problems:
                raise Failure(f"{what}: a superseded attempt's output was read, or an attempt never recorded:\n  " +
                              "\n  ".join(problems))
        return s, events

    def fetch_outputs(self, job, outdir, host=None, timeout=60):
        """Copies a completed job's declared outputs to outdir (replaced); the client's result."""
        shutil.rmtree(outdir, ignore_errors=True)
        return self.client(["status", str(job), "--output", outdir], host=host, timeout=timeout)

    def events(self, job):
        """The job's event log lines (placements, completions, failures, recoveries)."""
        p = self.client(["logs", str(job), "-o", "json"], timeout=60, check=True)
        return [json.loads(line)["line"] for line in p.stdout.splitlines() if line.strip()]

    def dump_logs(self, lines=25):
        """Prints the end of every process's log and the faults in force (after a failure)."""
        print(f"---- faults in force: {self.net.faults() or 'none'}")
        for name in self.procs:
            text = self.log(name).splitlines()
            print(f"---- last {lines} lines of {self.procs[name].logpath}")
            print("\n".join(text[-lines:]))
        sys.stdout.flush()

    # -- the end --

    def close(self):
        """Ends every process by its pid (SIGTERM, SIGKILL after 10 s), then the network."""
        if self.closed:
            return
        self.closed = True
        try:
            live = [p for p in self.procs.values() if p.popen and p.popen.poll() is None]
            for p in live:
                with contextlib.suppress(ProcessLookupError):
                    p.popen.terminate()
            deadline = time.monotonic() + 10
            for p in live:
                try:
                    p.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.popen.kill()
                    p.popen.wait(timeout=10)
        finally:
            if self.own_net:
                self.net.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def private_copy(copse, bindir):
    """Copies copse and copse-node (which it runs, from beside it) to bindir and returns the
    copy of copse: a rebuild of the build tree while a test or soak runs must not swap the
    binaries under it (an exec then fails, or old and new processes mix). Retried while a
    build is writing them (a copy that does not run)."""
    os.makedirs(bindir, exist_ok=True)
    for attempt in range(30):
        for name in ("copse", "copse-node"):
            src = os.path.join(os.path.dirname(copse), name)
            if os.path.exists(src):
                shutil.copy2(src, os.path.join(bindir, name))
        p = subprocess.run([os.path.join(bindir, "copse"), "programs"], capture_output=True, text=True, timeout=60)
        if p.returncode == 0 and "checksum" in p.stdout:
            return os.path.join(bindir, "copse")
        time.sleep(2)
    raise Failure(f"{copse}: its copy does not run: {p.stderr.strip()}")


# ---- reference results --------------------------------------------------------------------------


def start_test(argv):
    """What every netns test does first: reads COPSE REPO WORKDIR from argv, skips (exit 77)
    where namespaces cannot be made (preflight), empties the work dir and runs a private copy
    of the binaries. Returns (copse, repo, work)."""
    copse, repo, work = argv[1:4]
    preflight()
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    return private_copy(copse, os.path.join(work, "bin")), repo, work

def reference_outputs(copse, job_file, outdir, daemons=3, timeout=120, cpus=2):
    """`copse run` of the job on this host (the embedded cluster, no fault): {path: sha256}."""
    shutil.rmtree(outdir, ignore_errors=True)
    p = subprocess.run([copse, "run", job_file, "--daemons", str(daemons), "--cpus", str(cpus), "--output", outdir],
                       capture_output=True, text=True, timeout=timeout, env=dict(os.environ, COPSE_DIE_WITH_PARENT="1"))
    if p.returncode != 0:
        raise Failure(f"copse run {job_file}: exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
    return digests(outdir)


# Fields of a training job's metrics.json that measure time, not results.
TIMING_FIELDS = ("images_per_s", "train_seconds", "tokens_per_s", "elapsed_s", "seconds")


def standard_jobs(repo, work):
    """The jobs most multi-host tests run: wordcount (file and memory channels across daemons),
    the stream pipeline (a gang whose streams cross hosts) and a lineage job (256 KiB per
    channel), by name."""
    examples = os.path.join(repo, "examples")
    return {
        "wordcount": os.path.join(examples, "wordcount", "wordcount.json"),
        "stream_pipeline": os.path.join(examples, "stream_pipeline.json"),
        "lineage": lineage_job(os.path.join(work, "lineage.json"), pad_bytes=256 << 10),
    }


def reference_digests(copse, jobs, work):
    """Each job's declared outputs' digests under `copse run` on one host, by name."""
    return {name: comparable_digests_of_run(copse, path, os.path.join(work, "ref-" + name)) for name, path in jobs.items()}


def comparable_digests_of_run(copse, job_file, outdir, daemons=3, timeout=120, cpus=2):
    """comparable_digests of a `copse run` of the job on this host."""
    reference_outputs(copse, job_file, outdir, daemons, timeout, cpus)
    return comparable_digests(outdir)


def comparable_digests(outdir):
    """{path: sha256} of a job's outputs, a metrics.json with its timings removed, a lineage
    job's lineage.txt left out (it names attempts, which faults change: check_lineage reads it)."""
    out = digests(outdir)
    out.pop("lineage.txt", None)
    for rel in out:
        if os.path.basename(rel) == "metrics.json":
            with open(os.path.join(outdir, rel)) as f:
                m = json.load(f)
            for k in TIMING_FIELDS:
                m.pop(k, None)
            out[rel] = hashlib.sha256(json.dumps(m, sort_keys=True).encode()).hexdigest()
    return out


# ---- lineage jobs: outputs that say which attempt of each input they read -----------------------

def lineage_job(path, name="lineage", sources=3, mids=3, aggs=2, pad_bytes=65536, sleep_ms=(0, 0, 0, 0),
                mid_channel="file", agg_channel="memory"):
    """Writes a job of `exec` vertices (tests/netns/lineage_vertex.sh): src[sources] ->
    all_to_all -> mid[mids] -> all_to_all -> agg[aggs] -> gather -> sink. Every output carries a
    digest of the data (which does not depend on attempts), pad_bytes of padding (bytes to
    move between daemons) and its lineage: which attempt (version) of each input every attempt
    upstream read. The sink declares data.txt (port 0: the digest alone, the same bytes on every
    run) and lineage.txt (port 1). sleep_ms: per stage, how long each vertex sleeps."""
    def stage(stage_name, replicas, sleep, extra=()):
        return {"name": stage_name, "program": "exec", "replicas": replicas,
                "params": {"argv": ["/bin/sh", LINEAGE_VERTEX, str(pad_bytes), str(sleep), *extra], "stdout": False}}
    job = {
        "version": 1, "name": name,
        "description": "lineage job of tests/netns: outputs carry the versions of what they read",
        "defaults": {"max_attempts": 6, "max_daemon_losses": 20},
        "stages": [stage("src", sources, sleep_ms[0]), stage("mid", mids, sleep_ms[1]), stage("agg", aggs, sleep_ms[2]),
                   stage("sink", 1, sleep_ms[3], ("sink",))],
        "edges": [{"from": "src", "to": "mid", "pattern": "all_to_all", "channel": mid_channel},
                  {"from": "mid", "to": "agg", "pattern": "all_to_all", "channel": agg_channel},
                  {"from": "agg", "to": "sink", "pattern": "gather", "channel": "file"}],
        "outputs": [{"from": "sink", "port": 0, "path": "data.txt"}, {"from": "sink", "port": 1, "path": "lineage.txt"}],
    }
    with open(path, "w") as f:
        json.dump(job, f, indent=1)
    return path


EVENT_RE = re.compile(r"^\s*(\d+\.\d+)s (\S+) version (\d+)(?: \([^)]*\))? (placed on|completed on) (\S+)")
OUTPUT_EVENT_RE = re.compile(r"^\s*(\d+\.\d+)s (\S+) output of version (\d+) (lost|is on daemon)")
FAILED_EVENT_RE = re.compile(r"^\s*(\d+\.\d+)s (\S+) version (\d+) (failed|withdrawn)")
CANCELLED_EVENT_RE = re.compile(r"^\s*(\d+\.\d+)s (\S+) version \d+ \([^)]*\) finished first; version (\d+) cancelled")
CARRIES_ON_EVENT_RE = re.compile(r"^\s*(\d+\.\d+)s (\S+) one attempt lost with daemon \S+; version (\d+) carries on")
RESTART_EVENT = "restored from the journal after a job manager restart"


def _mentions(line, vertex):
    """Whether an event line is about `vertex` (`sink` and `sink[0]` alike)."""
    parts = line.split()
    return len(parts) > 1 and _canonical(parts[1]) == vertex


def _canonical(vertex):
    """`sink` and `sink[0]` name the same vertex."""
    return vertex if "[" in vertex else vertex + "[0]"


def output_versions(status):
    """{vertex: version} of a completed job's declared outputs, from its status (`outputs[].key`):
    the attempts the job manager finally recorded for them."""
    out = {}
    for o in (status or {}).get("outputs", []):
        key = o.get("key") or {}
        if "version" in key and o.get("vertex"):
            out[_canonical(o["vertex"])] = int(key["version"])
    return out


def completions(events, job_completed=False, notes=None):
    """{vertex: [(event index, version)]}: the completions the event log records, and those it
    leaves out but implies. A job manager SIGKILLed just after a completion may have journaled
    it (and acted on it once restarted) without its event line reaching the job's history,
    which is written once a tick (reported as a copse bug). At a "restored from the journal"
    line, an attempt still open (placed; not completed, failed, withdrawn or cancelled) whose
    vertex is not placed again after it (before anything else is said of the vertex) was
    restored as completed: the attempts running then are run again, as new versions. At the
    end of a completed job's log, every attempt still open completed (the job could not have
    completed otherwise). Such completions count from the restart line (or the log's end);
    each is added to `notes`."""
    completed = {}
    open_attempts = {}  # vertex -> set of versions placed, not yet ended

    def close(vertex, version):
        open_attempts.get(vertex, set()).discard(version)

    def infer(at, snapshot, why):
        for vertex, versions in snapshot.items():
            if not versions:
                continue
            version = max(versions)
            if at < len(events):
                after = [line for line in events[at + 1:] if _mentions(line, vertex)]
                m = EVENT_RE.match(after[0]) if after else None
                if m and m.group(4) == "placed on":
                    continue  # it was running: run again
            completed.setdefault(vertex, []).append((at, version))
            if notes is not None:
                notes.append(f"{vertex} version {version}: completion inferred {why} (no event line)")

    for i, line in enumerate(events):
        if RESTART_EVENT in line:
            snapshot = {v: set(vs) for v, vs in open_attempts.items()}
            open_attempts.clear()
            infer(i, snapshot, "at a job manager restart")
            continue
        m = EVENT_RE.match(line)
        if m:
            vertex, version = _canonical(m.group(2)), int(m.group(3))
            if m.group(4) == "placed on":
                open_attempts.setdefault(vertex, set()).add(version)
            else:
                completed.setdefault(vertex, []).append((i, version))
                close(vertex, version)
            continue
        for regex in (FAILED_EVENT_RE, CANCELLED_EVENT_RE):
            m = regex.match(line)
            if m:
                close(_canonical(m.group(2)), int(m.group(3)))
        m = CARRIES_ON_EVENT_RE.match(line)
        if m:
            vertex = _canonical(m.group(2))
            open_attempts[vertex] = open_attempts.get(vertex, set()) & {int(m.group(3))}
    if job_completed:
        infer(len(events), open_attempts, "at the end of the completed job's log")
    for lst in completed.values():
        lst.sort()
    return completed


def check_lineage(lineage_text, events, notes=None, job_completed=True, outputs=None):
    """Checks a lineage job's lineage.txt against the job manager's event log (`copse logs
    JOB`) and, when given, its final record of the outputs (`outputs`: output_versions(status)).
    Returns a list of problems (empty: none):

      - every attempt named in the lineage (each reader, each version read) is one the job
        manager recorded as completed ("X version N completed on D"; see completions());
      - no attempt read a superseded output: the version of P that attempt C.vc read is not
        older than a version of P that had completed before C.vc was placed;
      - the outputs come from the sink attempt the job manager recorded for them (`outputs`),
        which is also its last completed attempt in the event log."""
    placed = {}  # (vertex, version) -> event index
    for i, line in enumerate(events):
        m = EVENT_RE.match(line)
        if m and m.group(4) == "placed on":
            placed.setdefault((_canonical(m.group(2)), int(m.group(3))), i)
    completed = completions(events, job_completed, notes)
    problems = []
    writer = None
    edges = []
    for line in lineage_text.splitlines():
        parts = line.split()
        if parts[:1] == ["S"] and len(parts) == 3:
            writer = (_canonical(parts[1]), int(parts[2].lstrip("v")))
        elif parts[:1] == ["E"] and len(parts) == 7:
            # E <consumer> v<N> p<port> <- <producer> v<M>
            edges.append((_canonical(parts[1]), int(parts[2].lstrip("v")), parts[3], _canonical(parts[5]),
                          int(parts[6].lstrip("v"))))
    if writer is None:
        return ["lineage.txt names no writer (S line)"]
    if not edges:
        problems.append("lineage.txt lists no input read")
    done = {v: {ver for _, ver in lst} for v, lst in completed.items()}
    if outputs and writer[0] in outputs and outputs[writer[0]] != writer[1]:
        problems.append(f"the outputs come from {writer[0]} version {writer[1]}, but the job manager records version "
                        f"{outputs[writer[0]]} for them")
    if not completed.get(writer[0]):
        problems.append(f"the event log records no completion of {writer[0]}")
    elif completed[writer[0]][-1][1] != writer[1]:
        problems.append(f"the outputs come from {writer[0]} version {writer[1]}, but the job manager's last completed "
                        f"version is {completed[writer[0]][-1][1]}")
    for c, vc, port, p, vp in edges:
        if vc not in done.get(c, ()):
            problems.append(f"{c} version {vc} wrote lineage that was read, but never completed (event log)")
        if vp not in done.get(p, ()):
            problems.append(f"{c} version {vc} read {p} version {vp} ({port}), which never completed (event log): "
                            f"completed versions {sorted(done.get(p, ()))}")
            continue
        at = placed.get((c, vc))
        if at is None:
            continue
        newer = [v for i, v in completed.get(p, []) if i < at and v > vp]
        if newer:
            problems.append(f"{c} version {vc} read {p} version {vp} ({port}), superseded by version {max(newer)} "
                            f"which had completed before {c} version {vc} was placed")
    return problems


# ---- entry points ---------------------------------------------------------------------------------

def skip_on_unavailable(main):
    """Runs main(); a Skip prints `skipped: <reason>` and exits 77. SIGTERM/SIGINT/SIGHUP end
    it through SystemExit (so every cleanup runs)."""
    install_signal_handlers()
    try:
        rc = main()
    except Skip as e:
        print(f"skipped: {e}", flush=True)
        sys.exit(SKIP_CODE)
    sys.exit(rc or 0)


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "nfqueue":
        nfqueue_main([int(q) for q in sys.argv[2:]])
    elif len(sys.argv) == 3 and sys.argv[1] == "reap":
        reaper_main(sys.argv[2])
    else:
        print(__doc__)
        sys.exit(2)
