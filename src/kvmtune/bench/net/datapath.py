"""``kvmtune bench net --tier datapath``: seed 002's tests over the host's datapath, without guests.

Each topology is built exactly as for guests (:mod:`.topology`), with
``attach=netns``: where a guest's tap would be, a veth sits on the same bridge
or Open vSwitch port, its other end ``eth0`` in a namespace of its own that
stands in for the guest (MAC, address, gateway, MTU as the guest would set
them). macvtap's twin is a macvlan in bridge mode on the same lower device.
``netload serve`` runs in each server's namespace and ``netload run`` in each
client's, directly, so the numbers are the host kernel's (and Open vSwitch's)
forwarding cost at host speed, not a TCG guest's.

All topologies of a run are up at once, and the tests are interleaved across
them (test 1 on every topology, then test 2, …, the topology order rotating),
so that drift on a shared host spreads over all of them. All pairs of one
topology run each test at the same time, as in seed 002. Each (topology, pair,
test) is one cell, stored like a guest network cell (``topology``, ``mtu``,
``hosts``, ``pairs``, ``pair``, …) plus ``tier = datapath``.

CPU per unit of work: netload's clients and servers report their own CPU time
(getrusage: where the kernel forwards a packet in the sender's system call, it
is counted there), and the topology's daemons (Open vSwitch's userspace
datapath forwards in ``ovs-vswitchd``) are sampled from /proc around each test.
Their sum per MB and per transaction is ``path_cpu_s_per_mb`` /
``path_cpu_us_per_txn``; forwarding done later in ``ksoftirqd`` is not in it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvmtune.bench.net.catalog import NetTest, Tunings
from kvmtune.bench.net.guest import describe
from kvmtune.host.process import process_cpu_s
from kvmtune.host.root import HostRoot
from kvmtune.lab.accel import AccelChoice
from kvmtune.lab.net.netload import NETLOAD_PORT, netload_metrics, new_token
from kvmtune.lab.net.netns import NetError, Netns
from kvmtune.lab.net.topology import SWITCH, Endpoint, Topology, TopologySpec, make_topology
from kvmtune.lab.runner import Cell, CellSink, base_environment
from kvmtune.lab.workdir import stop_process
from kvmtune.runner import Runner

TIER = "datapath"
READY_TIMEOUT_S = 15.0  # a netload server in a fresh namespace answers within milliseconds
MIN_STALL_S = 10.0  # netload ends a run in which no operation at all completes for this long, and reports it
SERVER_CATCH_UP_S = 10.0  # netload's wait for server strands after the client stops
REPORT_SLACK_S = 5.0  # connecting 250 users and reporting (a tenth of a second on a bridge)
NO_GUEST = AccelChoice("none", "the datapath tier runs no guest (netload in namespaces, no QEMU)", 0.0)
OVS_PORT_PREFIXES = ("kvtap-", SWITCH)  # the guests' ports and the two-host switch veth
TWIN = {"macvtap": "macvlan", "bridge": "veth", "ovs": "veth", "nat": "veth"}


def stall_timeout_s(duration_s: float) -> float:
    return max(MIN_STALL_S, 2 * duration_s)


def per_test_deadline_s(duration_s: float) -> float:
    """How long one test may take before kvmtune stops it: netload gives up on its own well before."""
    return duration_s + stall_timeout_s(duration_s) + SERVER_CATCH_UP_S + REPORT_SLACK_S


@dataclass(kw_only=True)
class DatapathContext:
    runner: Runner
    host: HostRoot
    workdir: Path
    specs: Sequence[TopologySpec]  # attach=netns, one per topology
    tests: Sequence[NetTest]
    netload: str
    tunings: Tunings = field(default_factory=Tunings)
    duration_s: float = 5.0
    pin: bool = True  # clients on CPU 0, servers on CPU 1 (when the host has two)
    sink: CellSink = field(default_factory=CellSink)
    facts: dict[str, dict[str, Any]] = field(default_factory=dict)  # per topology, once it is up


def config_key(spec: TopologySpec, tunings: Tunings) -> str:
    key = f"{spec.kind}-mtu{spec.mtu}-h{spec.hosts}-p{spec.pairs}-{TIER}"
    return key + (f"-{tunings.tag()}" if tunings.tag() else "")


def pinning(runner: Runner, want: bool) -> tuple[list[str], list[str], str]:
    """(client prefix, server prefix, what is stored): ``taskset`` to CPU 0 and CPU 1, when there are two."""
    cpus = sorted(os.sched_getaffinity(0))
    if not want:
        return [], [], "off"
    taskset = runner.which("taskset")
    if len(cpus) < 2 or taskset is None:
        return [], [], "off (needs two CPUs and taskset)"
    c, s = cpus[0], cpus[1]
    return [taskset, "-c", str(c)], [taskset, "-c", str(s)], f"client cpu{c}, server cpu{s}"


class _Topo:
    """One topology of the run, up, with its netload servers."""

    def __init__(self, topo: Topology, ctx: DatapathContext) -> None:
        self.topo = topo
        self.ctx = ctx
        self.kind = topo.kind
        self.key = config_key(topo.spec, ctx.tunings)

    def ns(self, ep: Endpoint) -> Netns:
        assert ep.guest_netns is not None
        return self.topo.namespaces[ep.guest_netns]

    def daemon_cpu_s(self) -> float:
        return sum(process_cpu_s(self.ctx.host, pid) or 0.0 for pid in self.topo.daemon_pids())

    def ovs_packets(self) -> tuple[int, int, int | None] | None:
        """(received, sent, dropped by OVS's packet sockets) over every Open vSwitch port of this topology; None
        for other topologies.

        The kernel's counters of the ports' host ends, read now: OVS's own statistics column lags by up to its
        5 s stats-update-interval, and for these ports it copies the same kernel counters. The userspace
        datapath reads each port through an AF_PACKET socket; a packet that finds that socket's receive buffer
        full is counted as received by the port and dropped by the socket (its ``sk_drops``, which ``ss -m``
        shows as ``d``, and which OVS's own statistics do not include). None for that figure where OVS has no
        such sockets (the kernel datapath) or ``ss`` is missing."""
        if not self.topo.ovs_instances():
            return None
        rx = tx = 0
        drops: int | None = None
        for h in range(self.topo.spec.hosts):
            ns = self.topo.host_ns(h)
            res = ns.ip("-s", "-j", "link", "show")
            try:
                links = json.loads(res.stdout)
            except ValueError:
                return None
            for link in links:
                if str(link.get("ifname", "")).startswith(OVS_PORT_PREFIXES):
                    stats = link.get("stats64") or {}
                    rx += int((stats.get("rx") or {}).get("packets") or 0)
                    tx += int((stats.get("tx") or {}).get("packets") or 0)
            if self.topo.facts.get("ovs_datapath") == "netdev":
                sockets = ns.exec("ss", "-0", "-a", "-m", "-n", "-H", check=False)
                if sockets.ok:
                    drops = (drops or 0) + sum(int(d) for d in _SOCKET_DROPS.findall(sockets.stdout))
        return rx, tx, drops

    def config(self, pair: int, pinned: str) -> dict[str, Any]:
        s, f = self.topo.spec, self.topo.facts
        return {
            "topology": s.kind, "mtu": s.mtu, "hosts": s.hosts, "pairs": s.pairs, "pair": pair,
            "tunings": self.ctx.tunings.as_dict(), "duration_s": self.ctx.duration_s, "vhost_net": None,
            "ovs_datapath": f.get("ovs_datapath"), "tier": TIER, "attach": TWIN.get(s.kind, "veth"), "pinned": pinned,
        }


def _remote(ep: Endpoint) -> str:
    return f"{ep.connect_address}:{NETLOAD_PORT}"


def _run_argv(ctx: DatapathContext, prefix: list[str], server: Endpoint, workload: str, users: int, duration: str,
              *extra: str) -> list[str]:
    return [*prefix, ctx.netload, "run", "--workload", workload, "--users", str(users), "--duration", duration,
            "--remote", _remote(server), "-q", *extra]


class DatapathRun:
    """Brings every topology up, starts the servers, runs the tests interleaved, records the cells."""

    def __init__(self, ctx: DatapathContext) -> None:
        self.ctx = ctx
        self.token = new_token()
        self.client_pin, self.server_pin, self.pinned = pinning(ctx.runner, ctx.pin)
        self.overhead_s: list[float] = []  # per test: wall time beyond the measured duration

    def env(self) -> dict[str, str]:
        return {"NETLOAD_TOKEN": self.token}

    def _popen(self, ns: Netns, argv: list[str], out: Path) -> subprocess.Popen[bytes]:
        """Start ``argv`` in ``ns``; stdout to ``out``, stderr beside it (``out`` + ``.err``)."""
        with open(out, "wb") as fh, open(f"{out}.err", "wb") as err:
            return self.ctx.runner.popen(
                [*ns.exec_prefix, *argv], stdin=subprocess.DEVNULL, stdout=fh, stderr=err,
                env={**os.environ, **self.env()},
            )

    def start_servers(self, t: _Topo) -> None:
        for _client, server in t.topo.pairs():
            argv = [*self.server_pin, self.ctx.netload, "serve", "-q", "--listen", _remote(server)]
            proc = self._popen(t.ns(server), argv, t.topo.rundir / f"serve-{server.name}.log")
            t.topo.add_process(proc, f"netload serve {server.name}")
        for client, server in t.topo.pairs():
            self._wait_ready(t, client, server)

    def _wait_ready(self, t: _Topo, client: Endpoint, server: Endpoint) -> None:
        argv = _run_argv(self.ctx, [], server, "rr1c-1x1", 1, "50ms", "--connect-timeout", "1s")
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            res = self.ctx.runner.run([*t.ns(client).exec_prefix, *argv], timeout=READY_TIMEOUT_S + 10, env=self.env())
            if res.ok:
                return
            if res.returncode != 3 or time.monotonic() > deadline:
                raise NetError(f"{t.kind}: netload server {server.name} not usable from {client.name}: "
                               f"{res.describe_failure()}")
            time.sleep(0.05)

    def run_test(self, t: _Topo, test: NetTest) -> list[Cell]:
        """All pairs of ``t`` run ``test`` at once; one cell per pair."""
        ctx = self.ctx
        dur = f"{ctx.duration_s:g}s"
        procs: list[tuple[int, subprocess.Popen[bytes], Path]] = []
        cpu0, packets0 = t.daemon_cpu_s(), t.ovs_packets()
        start = time.monotonic()
        try:
            for client, server in t.topo.pairs():
                out = t.topo.rundir / f"run-{client.name}.json"
                argv = _run_argv(ctx, self.client_pin, server, test.workload, test.users, dur, "--json",
                                 "--stall-timeout", f"{stall_timeout_s(ctx.duration_s):g}s")
                procs.append((client.pair, self._popen(t.ns(client), argv, out), out))
            deadline = start + per_test_deadline_s(ctx.duration_s)
            for _pair, proc, _out in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        finally:
            for _pair, proc, _out in procs:
                if proc.poll() is None:
                    stop_process(proc, grace=2.0)
        wall = time.monotonic() - start
        daemon_s = t.daemon_cpu_s() - cpu0
        packets1 = t.ovs_packets()
        unforwarded = _unforwarded_pct(packets0, packets1)
        socket_drops = _socket_drop_pct(packets0, packets1)
        self.overhead_s.append(max(0.0, wall - ctx.duration_s))
        docs = [(pair, proc.returncode, _read_doc(out), _last_line(Path(f"{out}.err"))) for pair, proc, out in procs]
        total_mb = sum(float(((d or {}).get("summary") or {}).get("bytes") or 0.0) for _p, _rc, d, _e in docs) / 1e6
        cells = []
        for pair, rc, doc, stderr in docs:
            cell = Cell(t.key, t.config(pair, self.pinned), test.name, "error", rep=pair, duration_s=wall)
            cell.raw = json.dumps(doc) if doc is not None else None
            if doc is not None and doc.get("error") is None and rc == 0:
                cell.status = "ok"
                cell.metrics = path_metrics(doc, daemon_s, total_mb)
                if unforwarded is not None:
                    cell.metrics["ovs_unforwarded_pct"] = unforwarded
                if socket_drops is not None:
                    cell.metrics["ovs_socket_drop_pct"] = socket_drops
            else:
                reason = (doc or {}).get("error") or {}
                cell.error = (reason.get("message") if isinstance(reason, dict) else None) or stderr or (
                    "netload did not finish in time" if rc is not None and rc < 0 else f"netload exited {rc}")
            cells.append(cell)
        return cells

    def execute(self, sink: CellSink) -> None:
        ctx = self.ctx
        with contextlib.ExitStack() as stack:
            topos = []
            for spec in ctx.specs:
                if ctx.tunings.txqueuelen is not None:  # on the host ends and the stand-ins' eth0, as for guests' taps
                    spec = dataclasses.replace(spec, txqueuelen=ctx.tunings.txqueuelen)
                topo = stack.enter_context(make_topology(spec, runner=ctx.runner, host=ctx.host, workdir=ctx.workdir))
                t = _Topo(topo, ctx)
                for ep in topo.endpoints:
                    for key, value in ctx.tunings.guest_sysctls:
                        t.ns(ep).sysctl(key, value)
                ctx.facts[spec.kind] = topo.facts
                self.start_servers(t)
                topos.append(t)
            for i, test in enumerate(ctx.tests):
                for t in topos[i % len(topos):] + topos[: i % len(topos)]:
                    for cell in self.run_test(t, test):
                        sink.record(cell)


_SOCKET_DROPS = re.compile(r"skmem:\([^)]*\bd(\d+)\)")
_Packets = tuple[int, int, int | None]


def _unforwarded_pct(before: _Packets | None, after: _Packets | None) -> float | None:
    """Of the packets Open vSwitch received on its ports during a test, the share it sent on none (dropped:
    every destination is learned by then, so each received packet leaves by exactly one port)."""
    if before is None or after is None:
        return None
    rx, tx = after[0] - before[0], after[1] - before[1]
    return 100.0 * max(0, rx - tx) / rx if rx > 0 else None


def _socket_drop_pct(before: _Packets | None, after: _Packets | None) -> float | None:
    """Of the packets Open vSwitch's ports received during a test, the share its userspace datapath's AF_PACKET
    sockets dropped because their receive buffer was full."""
    if before is None or after is None or before[2] is None or after[2] is None:
        return None
    rx = after[0] - before[0]
    return 100.0 * max(0, after[2] - before[2]) / rx if rx > 0 else None


def _read_doc(path: Path) -> dict[str, Any] | None:
    """netload's JSON document (its stdout), or None when it printed none."""
    try:
        doc = json.loads(path.read_text(errors="replace"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _last_line(path: Path) -> str | None:
    """The last non-empty line of netload's stderr, shortened, printable (it names what failed)."""
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return None
    return "".join(ch if ch.isprintable() else "?" for ch in lines[-1][:300]) if lines else None


def path_metrics(doc: dict[str, Any], daemon_cpu_s: float, topology_mb: float) -> dict[str, float]:
    """netload's figures plus the CPU of the whole path: both netloads' own CPU time and this pair's share
    (by bytes moved) of the topology's daemons."""
    m = netload_metrics(doc)
    cpu = doc.get("cpu") or {}
    own = sum(float((cpu.get(side) or {}).get("process_cpu_s") or 0.0) for side in ("client", "server"))
    mb = m.get("bytes", 0.0) / 1e6
    share = daemon_cpu_s * (mb / topology_mb) if topology_mb > 0 else 0.0
    m["daemon_cpu_s"] = share
    if mb > 0:
        m["path_cpu_s_per_mb"] = (own + share) / mb
    if m.get("transactions"):
        m["path_cpu_us_per_txn"] = (own + share) * 1e6 / m["transactions"]
    return m


@dataclass
class DatapathBenchmark:
    """``kvmtune bench net --tier datapath``: one stored run over one or more topologies."""

    ctx: DatapathContext
    kind: str = "net"
    _run: DatapathRun | None = None

    def planned_cells(self) -> int:
        return len(self.ctx.tests) * sum(s.pairs for s in self.ctx.specs)

    def plan(self) -> str:
        c = self.ctx
        kinds = ", ".join(s.kind + (" (as macvlan, its namespace twin)" if s.kind == "macvtap" else "") for s in c.specs)
        return (f"datapath tier (netload in namespaces, no guest, no QEMU): {kinds}; {len(c.tests)} tests × "
                f"{c.specs[0].pairs} pair(s), {c.duration_s:g}s each")

    def environment(self) -> dict[str, Any]:
        ctx = self.ctx
        env = base_environment(ctx.runner, ctx.host, NO_GUEST, None)
        res = ctx.runner.run([ctx.netload, "version"], timeout=20)
        env["netload"] = res.stdout.strip() if res.ok else None
        env["ovs"] = ctx.runner.which("ovs-vswitchd") is not None
        env["tier"] = TIER
        env["topologies"] = [s.kind for s in ctx.specs]
        env["pinned"] = pinning(ctx.runner, ctx.pin)[2]
        return env

    def describe(self, cell: Cell) -> str:
        return describe(cell)

    def execute(self, sink: CellSink) -> None:
        self._run = DatapathRun(self.ctx)
        self._run.execute(sink)

    def overhead_s(self) -> list[float]:
        return list(self._run.overhead_s) if self._run else []

    def cleanup(self) -> list[str]:
        return []  # execute's topologies remove namespaces, daemons and netload processes on every exit
