"""``kvmtune bench net``: netload between probe-guest pairs over a topology.

Every guest boots with a job that brings its NIC up (drivers, address, MTU, the tunings' sysctls) and
starts its guest agent; from then on the host drives it through the agent
(:class:`~kvmtune.lab.probe.agent.ProbeAgent`), the one way kvmtune drives a probe guest. For every pair
the server guest runs ``netload serve`` and the client guest runs the tests one after another
(``netload run --json`` through ``guest-exec``, its exit code and JSON document returned apart from the
console). All pairs run at once, as in seed 002. Around each test the host samples the CPU time of both
QEMU processes (and their ``vhost-PID`` threads when vhost-net is on). Each (pair, test) becomes one cell
in the results store: key ``CONFIG|TEST``, ``rep`` = pair index.

The guests boot from the storage benchmark's probe guest with ``netload`` and ``qemu-ga`` added
(:class:`~kvmtune.lab.guest.ExtraFile`), launched by :class:`~kvmtune.lab.qemu.GuestRun` inside the
endpoint's namespace.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvmtune.bench.net.catalog import NetTest, Tunings
from kvmtune.errors import KvmtuneError
from kvmtune.host.process import process_cpu_s
from kvmtune.host.root import HostRoot
from kvmtune.lab.guest import ExtraFile, ProbeGuest, guest_agent_file, guest_agent_job
from kvmtune.lab.net.netload import NETLOAD_PORT, netload_metrics, new_token
from kvmtune.lab.net.netns import NetError
from kvmtune.lab.net.topology import Endpoint, Topology, TopologySpec, make_topology
from kvmtune.lab.probe.agent import ProbeAgent
from kvmtune.lab.probe.side import ExecResult
from kvmtune.lab.qemu import GuestRun, Nic, VmSpec
from kvmtune.lab.runner import BenchContext, Cell, CellSink, base_environment

SERVER_WAIT_TRIES = 40  # × (2 s connect timeout + 1 s): how long a client waits for its server to boot
NETDEV = "net0"  # the -netdev id of a guest's one NIC
NET_MODULES = ("virtio_pci", "virtio_net")
TEST_OVERHEAD_S = 45.0  # connecting 250 users and reporting, under TCG
GUEST_PATH = "/bin:/sbin:/usr/bin:/usr/sbin"  # what guest_init.sh gives every job


@dataclass(kw_only=True)
class NetContext(BenchContext):
    """The network tier's state: topology, tests, and the guests' settings."""

    workdir: Path
    guest: ProbeGuest
    spec: TopologySpec
    tests: Sequence[NetTest]
    tunings: Tunings = field(default_factory=Tunings)
    duration_s: float = 30.0
    boot_timeout_s: float = 120.0
    topology_facts: dict[str, Any] = field(default_factory=dict)

    @property
    def config_key(self) -> str:
        s = self.spec
        key = f"{s.kind}-mtu{s.mtu}-h{s.hosts}-p{s.pairs}"
        return key + (f"-{self.tunings.tag()}" if self.tunings.tag() else "")

    def config(self, pair: int) -> dict[str, Any]:
        """What one pair's cells are stored with (the topology's facts are known once it is up)."""
        return {
            "topology": self.spec.kind, "mtu": self.spec.mtu, "hosts": self.spec.hosts, "pairs": self.spec.pairs,
            "pair": pair, "tunings": self.tunings.as_dict(), "duration_s": self.duration_s,
            "vhost_net": self.topology_facts.get("vhost_net"), "ovs_datapath": self.topology_facts.get("ovs_datapath"),
        }


# --------------------------------------------------------------------------- guest jobs


def guest_files(netload: str) -> list[ExtraFile]:
    """What the net tier adds to the probe guest: netload, and qemu-ga to be driven through."""
    return [ExtraFile(netload, "/usr/bin/netload"), guest_agent_file()]



def _module_lines(guest: ProbeGuest) -> list[str]:
    paths = guest.modules_for(NET_MODULES)
    if not any(p.rsplit("/", 1)[-1].startswith("virtio_net.") for p in paths) and "virtio_net" not in guest.modules:
        raise NetError(f"the probe guest kernel {guest.release} has no virtio_net module")
    return [f"insmod /lib/modules/{p} 2>/dev/null" for p in paths]


def _net_setup(guest: ProbeGuest, ep: Endpoint, tunings: Tunings) -> list[str]:
    lines = _module_lines(guest)
    lines += [
        "ip link set lo up",
        '[ -d /sys/class/net/eth0 ] || { echo "KVMTUNE-FATAL no eth0 in the guest (virtio-net did not appear)"; exit 1; }',
        *ep.guest_commands(),
    ]
    lines += [f"echo {v} > /proc/sys/{k.replace('.', '/')}" for k, v in tunings.guest_sysctls]
    lines.append('echo "KVMTUNE-NET-UP $(cat /sys/class/net/eth0/mtu) $(cat /sys/class/net/eth0/address)"')
    return lines


def _port(ep: Endpoint) -> int:
    return ep.ports[0] if ep.ports else NETLOAD_PORT


def guest_job(guest: ProbeGuest, ep: Endpoint, tunings: Tunings) -> str:
    """The boot job of either guest of a pair: its NIC up, then its agent, then wait to be driven."""
    return "\n".join([*_net_setup(guest, ep, tunings), guest_agent_job().rstrip("\n"), "echo KVMTUNE-PROBE-READY",
                      "while true; do sleep 3600; done", ""])


def netload_env(token: str) -> list[str]:
    """The whole environment of a netload command in the guest: this run's token there, never on a command line."""
    return [f"PATH={GUEST_PATH}", f"NETLOAD_TOKEN={token}"]


def _sh(command: str) -> list[str]:
    return ["/bin/sh", "-c", command]


def serve_argv(ep: Endpoint) -> list[str]:
    # netload serves only the guest's own address and only clients holding this run's token (netload_env)
    return _sh(f"exec netload serve -q --listen {ep.ip}:{_port(ep)}")


def _run_cmd(client: Endpoint, server: Endpoint, workload: str, users: int, duration: str, extra: str = "") -> str:
    remote = f"{server.connect_address}:{_port(server)}"
    if server.fixed_ports_only:
        # slirp forwards fixed ports only: pin netload's data connections to the server's second port
        prof = f"/tmp/{workload}.xml"
        return (
            f"netload profile --workload {workload} --xml | sed 's/protocol=tcp/port={server.ports[1]} protocol=tcp/' > {prof}"
            f" && netload run {prof} --var h={server.connect_address} --var nprocs={users} --var duration={duration}"
            f" --remote {remote} -q {extra}"
        )
    return f"netload run --workload {workload} --users {users} --duration {duration} --remote {remote} -q {extra}"


def warm_argv(client: Endpoint, server: Endpoint) -> list[str]:
    """One short exchange; netload exits 3 while the server does not answer yet."""
    return _sh(_run_cmd(client, server, "rr1c-1x1", 1, "1s", "--connect-timeout 2s --peer-timeout 5s"))


def run_argv(client: Endpoint, server: Endpoint, t: NetTest, duration_s: float) -> list[str]:
    """Test ``t``: its JSON document on stdout."""
    return _sh(_run_cmd(client, server, t.workload, t.users, f"{duration_s:g}s", "--json"))


def last_error(stderr: str) -> str:
    """A failed command's last two non-empty error lines, as one line."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    return " ".join(" ".join(lines[-2:]).split())


# --------------------------------------------------------------------------- host CPU of QEMU


def qemu_cpu_s(host: HostRoot, pid: int) -> float | None:
    """CPU seconds of QEMU ``pid`` plus its ``vhost-PID`` kernel threads; None once it is gone."""
    own = process_cpu_s(host, pid)
    if own is None:
        return None
    total = own
    for entry in host.listdir("/proc"):
        if entry.isdigit() and (host.read_optional(f"/proc/{entry}/comm") or "").strip() == f"vhost-{pid}":
            total += process_cpu_s(host, entry) or 0.0
    return total


# --------------------------------------------------------------------------- the run


def _vm_spec(ctx: NetContext, ep: Endpoint, job: str, agent_socket: Path | None = None) -> tuple[VmSpec, int | None]:
    fd = None
    if ep.needs_chardev_fd:
        assert ep.chardev is not None
        try:
            fd = os.open(ep.chardev, os.O_RDWR)
        except OSError as exc:
            raise NetError(f"{ep.chardev}: cannot open the macvtap device ({exc.strerror})") from None
    spec = VmSpec(
        guest=ctx.guest, accel=ctx.accel.accel, memory_mb=ctx.memory_mb, smp=ctx.smp, job=job,
        nics=[Nic(NETDEV, ep.netdev_arg(NETDEV, fd), mac=ep.mac, host_mtu=ep.mtu if ep.mtu != 1500 else None)],
        wrapper=ep.exec_prefix, pass_fds=(fd,) if fd is not None else (), agent_socket=agent_socket,
    )
    return spec, fd


def _start(ctx: NetContext, topo: Topology, ep: Endpoint) -> ProbeAgent:
    """Boot ``ep``'s guest (its NIC up, its agent started); the agent is connected later."""
    sock = topo.rundir / f"qga-{ep.name}.sock"
    spec, fd = _vm_spec(ctx, ep, guest_job(ctx.guest, ep, ctx.tunings), sock)
    vm = GuestRun(spec, topo.rundir / "vm", ctx.runner, name=ep.name)
    try:
        proc = vm.start()
    finally:
        if fd is not None:
            os.close(fd)
    topo.add_process(proc, f"QEMU {ep.name}")
    return ProbeAgent(vm, sock, ep.name)


def _connect(agent: ProbeAgent, until: float, boot_timeout: float) -> None:
    """Wait for the guest's agent; a job that failed before it (``KVMTUNE-FATAL`` on the console) says why."""
    try:
        agent.connect(until, boot_timeout)
    except KvmtuneError as exc:
        fatal = _console_fatal(agent.run)
        raise KvmtuneError(fatal or str(exc)) from None


def _cell(ctx: NetContext, pair: int, t: NetTest, res: ExecResult | None, cpu: dict[str, float],
          mtu: int | None, why_not: str | None = None) -> Cell:
    """The cell of test ``t`` from what its ``netload run`` returned (None: it never ran, ``why_not`` says why)."""
    text = res.stdout.strip() if res is not None else None
    cell = Cell(ctx.config_key, ctx.config(pair), t.name, "error", raw=text, rep=pair)
    try:
        doc = json.loads(text) if text else None
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        doc = None
    rc = res.rc if res is not None else None
    if doc is not None and doc.get("error") is None and rc == 0:
        cell.status = "ok"
        cell.metrics = netload_metrics(doc)
        if mtu is not None:
            cell.metrics["guest_mtu"] = float(mtu)
        wall = cpu.get("wall_s") or 0.0
        mb = cell.metrics.get("bytes", 0.0) / 1e6
        for side in ("client", "server"):
            if side in cpu and wall > 0:
                cell.metrics[f"qemu_{side}_cpu_pct"] = 100.0 * cpu[side] / wall
                if mb > 0:
                    cell.metrics[f"qemu_{side}_cpu_s_per_mb"] = cpu[side] / mb
        cell.duration_s = wall or None
        return cell
    reason = (doc or {}).get("error") or {}
    timed_out = res is not None and res.rc is None
    cell.error = (
        (reason.get("message") if isinstance(reason, dict) else None)
        or (last_error(res.stderr) if res is not None and rc not in (None, 0) else None)
        or why_not
        or (f"netload did not finish within {res.seconds:.0f}s" if timed_out and res is not None else None)
        or (f"netload exited {rc}" if rc is not None else "the test did not run")
    )
    return cell


def _guest_mtu(agent: ProbeAgent) -> int | None:
    """The MTU the client guest's eth0 has (what the topology set, as the guest sees it)."""
    res = agent.exec(["/bin/cat", "/sys/class/net/eth0/mtu"], 30.0)
    text = res.stdout.strip()
    return int(text) if res.rc == 0 and text.isdigit() and len(text) < 7 else None


def _wait_server(client: ProbeAgent, argv: list[str], env: list[str]) -> None:
    """Until the server answers a short exchange; raise with its last error line when it will not."""
    for _ in range(SERVER_WAIT_TRIES):
        res = client.exec(argv, 60.0, env)
        if res.rc == 0:
            return
        if res.rc != 3:
            break
        time.sleep(1)
    raise KvmtuneError(f"server not usable: {last_error(res.stderr) or f'netload exited {res.rc}'}")


def run_net(ctx: NetContext) -> int:
    """Bring the topology up, boot the pairs, run the tests, store every cell as it completes; returns failed cells."""
    spec = ctx.spec
    if ctx.tunings.txqueuelen is not None:
        spec = TopologySpec(spec.kind, spec.pairs, spec.hosts, spec.mtu, ctx.tunings.txqueuelen, spec.ovs_datapath, spec.vhost)
    with make_topology(spec, runner=ctx.runner, host=ctx.host, workdir=ctx.workdir) as topo:
        ctx.topology_facts = topo.facts
        servers: dict[int, ProbeAgent] = {}
        clients: dict[int, ProbeAgent] = {}
        endpoints: dict[int, tuple[Endpoint, Endpoint]] = {}
        env = netload_env(new_token())
        for client, server in topo.pairs():
            servers[server.pair] = _start(ctx, topo, server)
            endpoints[client.pair] = (client, server)
        for client, _server in topo.pairs():
            clients[client.pair] = _start(ctx, topo, client)
        booted_by = time.monotonic() + ctx.boot_timeout_s
        done: queue.Queue[Cell] = queue.Queue()  # cells go to the store from this thread only (sqlite)
        failures: list[BaseException] = []

        def follow(pair: int) -> None:
            agent, srv = clients[pair], servers[pair]
            client_ep, server_ep = endpoints[pair]
            reported: set[str] = set()
            mtu: int | None = None
            try:
                _connect(srv, booted_by, ctx.boot_timeout_s)
                srv.spawn(serve_argv(server_ep), env=env)
                _connect(agent, booted_by, ctx.boot_timeout_s)
                mtu = _guest_mtu(agent)
                _wait_server(agent, warm_argv(client_ep, server_ep), env)
                for t in ctx.tests:
                    assert agent.run.proc is not None and srv.run.proc is not None
                    t0 = time.monotonic()
                    c0, s0 = qemu_cpu_s(ctx.host, agent.run.proc.pid), qemu_cpu_s(ctx.host, srv.run.proc.pid)
                    res = agent.exec(run_argv(client_ep, server_ep, t, ctx.duration_s),
                                     ctx.duration_s + TEST_OVERHEAD_S, env)
                    c1, s1 = qemu_cpu_s(ctx.host, agent.run.proc.pid), qemu_cpu_s(ctx.host, srv.run.proc.pid)
                    cpu = {"wall_s": time.monotonic() - t0}
                    if c0 is not None and c1 is not None:
                        cpu["client"] = c1 - c0
                    if s0 is not None and s1 is not None:
                        cpu["server"] = s1 - s0
                    why = f"server guest: {_server_error(srv)}" if res.rc != 0 and srv.run.proc.poll() is not None else None
                    reported.add(t.name)
                    done.put(_cell(ctx, pair, t, res, cpu, mtu, why))
            except KvmtuneError as exc:
                why_not = str(exc)
                if srv.run.proc is not None and srv.run.proc.poll() is not None and "server" not in why_not:
                    why_not = f"server guest: {_server_error(srv)}"
                for t in ctx.tests:
                    if t.name not in reported:
                        done.put(_cell(ctx, pair, t, None, {}, mtu, why_not))
            except BaseException as exc:  # reported by the main thread
                failures.append(exc)

        threads = [threading.Thread(target=follow, args=(p,), daemon=True) for p in clients]
        for th in threads:
            th.start()
        failed = 0
        while any(th.is_alive() for th in threads) or not done.empty():
            try:
                cell = done.get(timeout=0.5)  # wakes up for Ctrl-C
            except queue.Empty:
                continue
            failed += not cell.ok
            ctx.record(cell)
        if failures:
            raise failures[0]
        for agent in [*clients.values(), *servers.values()]:
            agent.close()
            agent.run.close()
    return failed


def _console_fatal(vm: GuestRun) -> str | None:
    """What a guest's job printed as ``KVMTUNE-FATAL`` before its agent could answer, if it did."""
    try:
        text = vm.serial.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("KVMTUNE-FATAL"):
            return line.removeprefix("KVMTUNE-FATAL").strip()[:300]
    return None


def _server_error(agent: ProbeAgent) -> str:
    if agent.run.proc is not None and agent.run.proc.poll() is None:
        return "stopped before the client finished"
    return _console_fatal(agent.run) or "stopped early"


def describe(cell: Cell) -> str:
    """A network cell's figure on its progress line."""
    m = cell.metrics
    return (f"pair {cell.rep}: {m['throughput_Bps'] / 1e6:9.2f} MB/s {m['tps']:10,.0f} tx/s "
            f"avg {m.get('lat_avg_us', 0):9.1f} µs")


def environment(ctx: NetContext, netload: str) -> dict[str, Any]:
    env = base_environment(ctx.runner, ctx.host, ctx.accel, ctx.guest)
    res = ctx.runner.run([netload, "version"], timeout=20)
    env["netload"] = res.stdout.strip() if res.ok else None
    env["ovs"] = shutil.which("ovs-vswitchd") is not None
    return env


@dataclass
class NetBenchmark:
    """``kvmtune bench net``: the tests between guest pairs over one topology."""

    ctx: NetContext
    netload: str
    kind: str = "net"

    def planned_cells(self) -> int:
        return len(self.ctx.tests) * self.ctx.spec.pairs

    def plan(self) -> str:
        c = self.ctx
        return (f"{c.spec.kind}, {len(c.tests)} tests × {c.spec.pairs} pair(s), {c.duration_s:g}s each, "
                f"accelerator {c.accel.accel}")

    def environment(self) -> dict[str, Any]:
        return environment(self.ctx, self.netload)

    def describe(self, cell: Cell) -> str:
        return describe(cell)

    def execute(self, sink: CellSink) -> None:
        self.ctx.sink = sink
        run_net(self.ctx)

    def cleanup(self) -> list[str]:
        return []  # run_net's topology context removes namespaces, daemons and guests on every exit
