"""``kvmtune bench net``: netload between probe-guest pairs over a topology.

For every pair a server guest runs ``netload serve`` and a client guest runs
the tests one after another (``netload run --json``), printing each JSON
document between ``KVMTUNE-JSON-BEGIN/END`` markers on its console, the way
the storage benchmark's fio jobs do. All pairs run at once, as in seed 002.
While a test runs the host samples the CPU time of both QEMU processes (and
their ``vhost-PID`` threads when vhost-net is on) at the client's
``KVMTUNE-W-BEGIN``/``W-DONE`` markers. Each (pair, test) becomes one cell in
the results store: key ``CONFIG|TEST``, ``rep`` = pair index.

The guests boot from the storage benchmark's probe guest with ``netload``
added (:class:`~kvmtune.lab.guest.ExtraFile`), launched by
:class:`~kvmtune.lab.qemu.GuestRun` inside the endpoint's namespace.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvmtune.bench.net.catalog import NetTest, Tunings
from kvmtune.host.process import process_cpu_s
from kvmtune.host.root import HostRoot
from kvmtune.lab.guest import ProbeGuest
from kvmtune.lab.net.netload import NETLOAD_PORT, netload_metrics, new_token
from kvmtune.lab.net.netns import NetError
from kvmtune.lab.net.topology import Endpoint, Topology, TopologySpec, make_topology
from kvmtune.lab.qemu import GuestRun, Nic, VmSpec
from kvmtune.lab.runner import BenchContext, Cell, CellSink, base_environment

SERVER_WAIT_TRIES = 40  # × (2 s connect timeout + 1 s): how long a client waits for its server to boot
NETDEV = "net0"  # the -netdev id of a guest's one NIC
NET_MODULES = ("virtio_pci", "virtio_net")
TEST_OVERHEAD_S = 45.0  # connecting 250 users and reporting, under TCG


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


def server_job(guest: ProbeGuest, ep: Endpoint, tunings: Tunings, token: str) -> str:
    # netload serves only the guest's own address and only clients holding this run's token
    serve = f"NETLOAD_TOKEN={token} exec netload serve -q --listen {ep.ip}:{_port(ep)}"
    return "\n".join([*_net_setup(guest, ep, tunings), serve, ""])


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


def client_job(guest: ProbeGuest, client: Endpoint, server: Endpoint, tests: Sequence[NetTest], tunings: Tunings,
               duration_s: float, token: str) -> str:
    warm = _run_cmd(client, server, "rr1c-1x1", 1, "1s", "--connect-timeout 2s --peer-timeout 5s")
    lines = [
        *_net_setup(guest, client, tunings),
        f"export NETLOAD_TOKEN={token}",
        "u() { cut -d' ' -f1 /proc/uptime; }",
        "i=0",
        f"until {warm} >/dev/null 2>/tmp/warm.err; do",
        "  rc=$?; i=$((i+1))",
        f'  if [ $rc -ne 3 ] || [ $i -ge {SERVER_WAIT_TRIES} ]; then',
        '    echo "KVMTUNE-FATAL server not usable: $(tail -n 1 /tmp/warm.err)"; exit 1',
        "  fi",
        "  sleep 1",
        "done",
        'echo "KVMTUNE-SERVER-UP $i"',
    ]
    dur = f"{duration_s:g}s"
    for t in tests:
        lines += [
            f'echo "KVMTUNE-W-BEGIN {t.name} $(u)"',
            f"{_run_cmd(client, server, t.workload, t.users, dur, '--json')} > /tmp/{t.name}.json 2>/tmp/{t.name}.err",
            "rc=$?",
            f'echo "KVMTUNE-W-DONE {t.name} $rc $(u)"',
            f"[ $rc -ne 0 ] && echo \"KVMTUNE-ERR {t.name} $(grep -v '^$' /tmp/{t.name}.err | tail -n 2 | tr '\\n' ' ')\"",
            f'echo "KVMTUNE-JSON-BEGIN {t.name}"; cat /tmp/{t.name}.json 2>/dev/null; echo; echo "KVMTUNE-JSON-END {t.name}"',
        ]
    return "\n".join([*lines, ""])


# --------------------------------------------------------------------------- parsing


def parse_console(lines: Sequence[str]) -> tuple[dict[str, str], dict[str, str], dict[str, int], str | None]:
    """(JSON text per test, error line per test, exit code per test, fatal error).

    The guest's MTU as it reported it (``KVMTUNE-NET-UP MTU MAC``) is under the code key ``@mtu``.
    """
    docs: dict[str, str] = {}
    errs: dict[str, str] = {}
    codes: dict[str, int] = {}
    fatal: str | None = None
    collecting: str | None = None
    buf: list[str] = []
    for line in lines:
        if collecting is not None:
            if line.startswith(f"KVMTUNE-JSON-END {collecting}"):
                docs[collecting] = "\n".join(buf).strip()
                collecting, buf = None, []
            else:
                buf.append(line)
            continue
        parts = line.split()
        if not parts:
            continue
        if parts[0] == "KVMTUNE-JSON-BEGIN" and len(parts) > 1:
            collecting = parts[1]
        elif parts[0] == "KVMTUNE-W-DONE" and len(parts) > 2 and parts[2].lstrip("-").isdigit():
            codes[parts[1]] = int(parts[2])
        elif parts[0] == "KVMTUNE-ERR" and len(parts) > 1:
            errs[parts[1]] = " ".join(parts[2:])
        elif parts[0] == "KVMTUNE-FATAL" and fatal is None:
            fatal = " ".join(parts[1:])
        elif parts[0] == "KVMTUNE-NET-UP" and len(parts) > 1 and parts[1].isdigit():
            codes["@mtu"] = int(parts[1])
    return docs, errs, codes, fatal


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


def _vm_spec(ctx: NetContext, ep: Endpoint, job: str) -> tuple[VmSpec, int | None]:
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
        wrapper=ep.exec_prefix, pass_fds=(fd,) if fd is not None else (),
    )
    return spec, fd


def _start(ctx: NetContext, topo: Topology, ep: Endpoint, job: str) -> GuestRun:
    spec, fd = _vm_spec(ctx, ep, job)
    vm = GuestRun(spec, topo.rundir / "vm", ctx.runner, name=ep.name)
    try:
        proc = vm.start()
    finally:
        if fd is not None:
            os.close(fd)
    topo.add_process(proc, f"QEMU {ep.name}")
    return vm


def _cell(ctx: NetContext, pair: int, t: NetTest, lines: Sequence[str], cpu: dict[str, float],
          why_not: str | None = None) -> Cell:
    """The cell of test ``t`` from the client console so far; ``why_not`` explains a test that never reported."""
    docs, errs, codes, fatal = parse_console(lines)
    cell = Cell(ctx.config_key, ctx.config(pair), t.name, "error", raw=docs.get(t.name), rep=pair)
    try:
        doc = json.loads(docs[t.name]) if docs.get(t.name) else None
    except ValueError:
        doc = None
    if doc is not None and doc.get("error") is None and codes.get(t.name) == 0:
        cell.status = "ok"
        cell.metrics = netload_metrics(doc)
        if "@mtu" in codes:
            cell.metrics["guest_mtu"] = float(codes["@mtu"])
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
    cell.error = (
        (reason.get("message") if isinstance(reason, dict) else None)
        or errs.get(t.name)
        or fatal
        or why_not
        or (f"netload exited {codes[t.name]}" if t.name in codes else "the test did not run")
    )
    return cell


def run_net(ctx: NetContext) -> int:
    """Bring the topology up, boot the pairs, run the tests, store every cell as it completes; returns failed cells."""
    spec = ctx.spec
    if ctx.tunings.txqueuelen is not None:
        spec = TopologySpec(spec.kind, spec.pairs, spec.hosts, spec.mtu, ctx.tunings.txqueuelen, spec.ovs_datapath, spec.vhost)
    timeout = ctx.boot_timeout_s + len(ctx.tests) * (ctx.duration_s + TEST_OVERHEAD_S)
    tests = {t.name: t for t in ctx.tests}
    with make_topology(spec, runner=ctx.runner, host=ctx.host, workdir=ctx.workdir) as topo:
        ctx.topology_facts = topo.facts
        servers: dict[int, GuestRun] = {}
        clients: dict[int, GuestRun] = {}
        token = new_token()
        for _client, server in topo.pairs():
            servers[server.pair] = _start(ctx, topo, server, server_job(ctx.guest, server, ctx.tunings, token))
        for client, server in topo.pairs():
            job = client_job(ctx.guest, client, server, ctx.tests, ctx.tunings, ctx.duration_s, token)
            clients[client.pair] = _start(ctx, topo, client, job)
        done: queue.Queue[Cell] = queue.Queue()  # cells go to the store from this thread only (sqlite)
        failures: list[BaseException] = []

        def follow(pair: int) -> None:
            vm, srv = clients[pair], servers[pair]
            assert vm.proc is not None and srv.proc is not None
            lines: list[str] = []
            marks: dict[str, tuple[float, float | None, float | None]] = {}
            cpu: dict[str, dict[str, float]] = {}
            reported: set[str] = set()

            def on_line(line: str, now: float) -> None:
                lines.append(line)
                parts = line.split()
                if len(parts) < 2:
                    return
                if parts[0] == "KVMTUNE-JSON-END" and parts[1] in tests and parts[1] not in reported:
                    reported.add(parts[1])
                    done.put(_cell(ctx, pair, tests[parts[1]], lines, cpu.get(parts[1], {})))
                    return
                if parts[0] not in ("KVMTUNE-W-BEGIN", "KVMTUNE-W-DONE"):
                    return
                assert vm.proc is not None and srv.proc is not None
                c, s = qemu_cpu_s(ctx.host, vm.proc.pid), qemu_cpu_s(ctx.host, srv.proc.pid)
                if parts[0] == "KVMTUNE-W-BEGIN":
                    marks[parts[1]] = (now, c, s)
                elif parts[1] in marks:
                    t0, c0, s0 = marks.pop(parts[1])
                    row = {"wall_s": now - t0}
                    if c is not None and c0 is not None:
                        row["client"] = c - c0
                    if s is not None and s0 is not None:
                        row["server"] = s - s0
                    cpu[parts[1]] = row

            try:
                out = vm.follow(timeout, on_line=on_line)
            except BaseException as exc:  # reported by the main thread
                failures.append(exc)
                return
            why = out.error()
            if srv.proc.poll() is not None:
                why = f"server guest: {_server_error(srv)}"
            for t in ctx.tests:
                if t.name not in reported:
                    done.put(_cell(ctx, pair, t, out.lines, cpu.get(t.name, {}), why))

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
        for vm in [*clients.values(), *servers.values()]:
            vm.close()
    return failed


def _server_error(vm: GuestRun) -> str:
    try:
        text = vm.serial.read_text(errors="replace")
    except OSError:
        return "stopped early"
    for line in text.splitlines():
        if line.startswith("KVMTUNE-FATAL"):
            return line.removeprefix("KVMTUNE-FATAL").strip()
    return "stopped before the client finished"


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
