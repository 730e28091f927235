"""Host findings: the runtime value the host fix writes, measured in kvmtune's namespaces or, with
``--apply``, on the host itself through the fix journal.

* Per-namespace network settings (``net.ipv4.tcp_*``, ``net.core.somaxconn``,
  an interface's txqueuelen) are measured between two namespaces kvmtune makes
  (a veth pair, addresses from 198.18.0.0/15) with netload: side A with the
  host's current value, side B with the fixed one. The host is not touched.
* Host-wide settings (the I/O scheduler of a block device) change the host, so
  they run only with ``--apply``: measure, apply the one runtime write through
  the real fix journal, measure again, and undo through the journal unless the
  change helps (or ``--keep``). The sides are measured in two blocks, not
  alternated: every flip would be another change to the host.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvmtune.errors import KvmtuneError
from kvmtune.fix.apply import apply_plan
from kvmtune.fix.host import plan_host
from kvmtune.fix.journal import journal_dir, locked
from kvmtune.fix.plan import Plan, SysfsWrite, read_value
from kvmtune.fix.undo import undo_journal
from kvmtune.host.root import HostRoot
from kvmtune.host.settings import PROFILES as HOST_PROFILES
from kvmtune.lab.net.netload import find_netload, netload_metrics, new_token
from kvmtune.lab.net.netns import NetError, Netns, require_net_admin
from kvmtune.lab.replica import make_scratch_dir
from kvmtune.lab.storage.fio import parse_fio_json
from kvmtune.lab.workdir import Started, stop_process
from kvmtune.qemuopts import fio_option
from kvmtune.verify.experiments import Outcome, Subject, Unmeasurable, VerifyContext
from kvmtune.verify.measure import Metric, Samples, alternate, judge, settles

# per-namespace sysctls (net/ipv4/sysctl_net_ipv4.c: per netns since Linux 4.15 for tcp_rmem/tcp_wmem)
PER_NAMESPACE = (
    "net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem", "net.ipv4.tcp_notsent_lowat", "net.ipv4.tcp_slow_start_after_idle",
    "net.ipv4.tcp_tw_reuse", "net.ipv4.tcp_fastopen", "net.core.somaxconn",
)
THROUGHPUT = Metric("throughput", "MB/s", True, "netload stream between two kvmtune namespaces")
TPS = Metric("transactions", "tx/s", True, "netload request/response between two kvmtune namespaces")
SCHED_IOPS = Metric("iops", "IOPS", True, "fio direct 4 KiB random I/O on a scratch file of the device")
NET_A, NET_B = "198.18.250.1", "198.18.250.2"
NETLOAD_PORT = 20190


def _matching_write(subject: Subject, ctx: VerifyContext) -> SysfsWrite:
    """The runtime write of the host fix for this finding: from ``--profile``, else the first profile that has one
    (the TCP buffer findings are fixed by network-throughput, not by virtual-host)."""
    evidence = subject.finding.evidence
    at_boot: str | None = None
    for profile in dict.fromkeys([ctx.profile, *HOST_PROFILES]):
        for change in plan_host(ctx.root, profile).changes:
            if isinstance(change, SysfsWrite) and evidence.startswith(change.path):
                return change
            if at_boot is None and any(p.rule == subject.finding.rule and p.takes_effect == "host-boot"
                                       for p in change.planned):
                at_boot = profile
    if at_boot is not None:
        raise Unmeasurable(not_before_reboot(subject.finding.rule, at_boot))
    raise Unmeasurable("the host fix writes no runtime value for this finding (see kvmtune fix --host)")


def not_before_reboot(rule: str, profile: str) -> str:
    """Why a fix that takes effect at the host's next boot (a kernel command line, a module option) is not
    measured now, and the command that measures it after the reboot."""
    return (f"its fix takes effect at the host's next boot (host-boot): not measured before a reboot; after "
            f"'kvmtune fix --host --profile {profile} --apply' and a reboot, measure it with: "
            f"kvmtune verify --host --only {rule}")


def plan_host_finding(subject: Subject, ctx: VerifyContext) -> NamespaceExperiment | SchedulerExperiment:
    write = _matching_write(subject, ctx)
    if write.path.startswith("/proc/sys/"):
        key = write.path[len("/proc/sys/"):].replace("/", ".")
        if key not in PER_NAMESPACE:
            raise Unmeasurable(f"{key} is host-wide and verify has no experiment for it")
        return NamespaceExperiment(key, write.prior, write.new)
    if write.path.startswith("/sys/class/net/") and write.path.endswith("/tx_queue_len"):
        return NamespaceExperiment("txqueuelen", write.prior, write.new)
    if write.path.startswith("/sys/block/") and write.path.endswith("/queue/scheduler"):
        if not ctx.apply:
            raise Unmeasurable(
                "host-wide change: measured only with --apply (measure, apply through the journal, measure again, "
                "undo unless it helps)"
            )
        return SchedulerExperiment(write.path.split("/")[3], write)
    raise Unmeasurable(f"{write.path}: no experiment for this runtime value")


# --------------------------------------------------------------------------- namespaces


@dataclass
class NamespaceExperiment:
    setting: str  # a per-namespace sysctl key, or "txqueuelen"
    prior: str
    new: str
    tier: str = "netns"

    @property
    def change(self) -> str:
        return f"{self.setting} {self.prior} → {self.new}"

    @property
    def stream(self) -> bool:
        return self.setting not in ("net.ipv4.tcp_tw_reuse", "net.ipv4.tcp_fastopen", "net.core.somaxconn")

    @property
    def workload(self) -> str:
        kind = "str-writex30k, 1 user" if self.stream else "rr1c-1x1, 10 users"
        return f"netload {kind} over a veth pair between two kvmtune namespaces"

    def run(self, ctx: VerifyContext) -> Outcome:
        require_net_admin(HostRoot())  # this process, whatever --root audits
        netload = find_netload(None, ctx.runner)
        with _NamespacePair(ctx, netload) as pair:
            probe = _NetProbe(pair, self, ctx.seconds)
            samples = alternate(probe, ctx.repeat, ctx.deadline, settled=settles(probe.metric, ctx.threshold),
                                until=ctx.finding_until())
        j = judge(samples, probe.metric, ctx.threshold)
        notes = []
        if self.stream:
            notes.append("veth between namespaces has no wire latency: buffer limits show most on long, fast paths")
        details = {"samples_a": samples.a, "samples_b": samples.b, "workload": self.workload}
        return Outcome(j, "nothing changed on the host (kvmtune's own namespaces, removed)", notes, details,
                       samples.cut_short)


class _NamespacePair(Started):
    """Client and server namespaces joined by a veth pair; netload serves in the server namespace."""

    def __init__(self, ctx: VerifyContext, netload: str) -> None:
        tag = f"v{os.getpid()}{int(time.monotonic() * 1000) % 100000}"
        self.ctx = ctx
        self.netload = netload
        self.client = Netns(f"kvmtune-{tag}-c", ctx.runner)
        self.server = Netns(f"kvmtune-{tag}-s", ctx.runner)
        self.made: list[Netns] = []
        self.proc: subprocess.Popen[bytes] | None = None
        # netload serves a veth address, not loopback: it needs a token (in the environment, out of argv)
        self.env = {"NETLOAD_TOKEN": new_token()}

    def start(self) -> None:
        for ns in (self.client, self.server):
            ns.create()
            self.made.append(ns)
        self.client.ip("link", "add", "veth0", "type", "veth", "peer", "name", "veth1", "netns", self.server.name)
        self.client.add_address("veth0", f"{NET_A}/30")
        self.server.add_address("veth1", f"{NET_B}/30")
        self.client.up("veth0")
        self.server.up("veth1")
        self.proc = self.ctx.runner.popen(
            [*self.server.exec_prefix, self.netload, "serve", "-q", "--listen", f"{NET_B}:{NETLOAD_PORT}"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
            env={**os.environ, **self.env},
        )

    def set(self, setting: str, value: str) -> None:
        if setting == "txqueuelen":
            self.client.ip("link", "set", "dev", "veth0", "txqueuelen", value)
            self.server.ip("link", "set", "dev", "veth1", "txqueuelen", value)
            return
        for ns in (self.client, self.server):
            ns.sysctl(setting, value)

    def run(self, workload: str, users: int, seconds: float) -> dict[str, float]:
        duration = f"{max(1, round(seconds * 1000))}ms"
        argv = [self.netload, "run", "--workload", workload, "--users", str(users), "--duration", duration,
                "--remote", f"{NET_B}:{NETLOAD_PORT}", "-q", "--json"]
        for _try in range(20):  # the server may still be starting
            res = self.ctx.runner.run([*self.client.exec_prefix, *argv], timeout=seconds + 30, env=self.env)
            if res.ok:
                try:
                    return netload_metrics(json.loads(res.stdout))
                except (ValueError, KeyError) as exc:
                    raise NetError(f"netload printed no usable result ({exc})") from None
            if self.proc is not None and self.proc.poll() is not None:
                raise NetError("netload serve exited in the server namespace")
            time.sleep(0.1)
        raise NetError(f"netload run failed: {res.describe_failure()}")

    def close(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            if self.proc.stderr is not None:
                self.proc.stderr.close()
            self.proc = None
        while self.made:
            self.made.pop().delete()


class _NetProbe:
    def __init__(self, pair: _NamespacePair, exp: NamespaceExperiment, seconds: float) -> None:
        self.pair, self.exp, self.seconds = pair, exp, seconds
        self.metric = THROUGHPUT if exp.stream else TPS

    def sample(self, side: str) -> float:
        self.pair.set(self.exp.setting, self.exp.prior if side == "A" else self.exp.new)
        if self.exp.stream:
            return self.pair.run("str-writex30k", 1, self.seconds)["throughput_Bps"] / 1e6
        return self.pair.run("rr1c-1x1", 10, self.seconds)["tps"]


# --------------------------------------------------------------------------- host-wide, through the journal


def _device_numbers(ctx: VerifyContext, dev: str) -> set[int]:
    """st_dev values of ``dev`` and its partitions (major:minor from sysfs)."""
    out: set[int] = set()
    base = f"/sys/block/{dev}"
    for sub in ["", *[n for n in ctx.host.listdir(base) if n.startswith(dev)]]:
        text = (ctx.host.read_optional(f"{base}/{sub}/dev" if sub else f"{base}/dev") or "").strip()
        if ":" in text:
            major, minor = text.split(":", 1)
            with contextlib.suppress(ValueError):
                out.add(os.makedev(int(major), int(minor)))
    return out


def scratch_dir_on(ctx: VerifyContext, dev: str) -> Path:
    """A writable directory on a file system of block device ``dev``: the work directory, or a mount point."""
    from kvmtune.host.facts import HostFacts

    numbers = _device_numbers(ctx, dev)
    candidates = [ctx.workdir, *[Path(m.mountpoint) for m in HostFacts(ctx.host).mounts if "rw" in m.options]]
    for c in candidates:
        with contextlib.suppress(OSError):
            if os.stat(c).st_dev in numbers and os.access(c, os.W_OK | os.X_OK):
                return c
    raise Unmeasurable(f"no writable file system of {dev} is mounted, so the scheduler's effect cannot be measured")


@dataclass
class SchedulerExperiment:
    device: str
    write: SysfsWrite
    tier: str = "host"
    journal_id: str | None = field(default=None, init=False)

    @property
    def change(self) -> str:
        return f"block {self.device}: scheduler {self.write.prior} → {self.write.new}"

    @property
    def workload(self) -> str:
        return "fio direct 4k random 70% reads QD16 on a scratch file of the device"

    def scratch_parents(self, ctx: VerifyContext) -> list[Path]:
        try:
            return [scratch_dir_on(ctx, self.device)]
        except Unmeasurable:
            return []

    def run(self, ctx: VerifyContext) -> Outcome:
        where = scratch_dir_on(ctx, self.device)
        scratch = make_scratch_dir(where)
        try:
            return self._run(ctx, scratch / "fio.data")
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _fio(self, ctx: VerifyContext, path: Path) -> float:
        argv = ["fio", "--name=sched", fio_option("filename", path), fio_option("size", min(ctx.size, 256 << 20)),
                "--rw=randrw", "--rwmixread=70", "--bs=4k", "--iodepth=16", "--ioengine=libaio", "--direct=1",
                fio_option("runtime", f"{max(1, round(ctx.seconds * 1000))}ms"), "--time_based", "--output-format=json"]
        res = ctx.runner.run(argv, timeout=ctx.seconds + 120)
        if not res.ok:
            raise KvmtuneError(f"fio on {path}: {res.describe_failure()}")
        try:
            return parse_fio_json(res.stdout)["iops"]
        except ValueError as exc:
            raise KvmtuneError(f"fio on {path}: {exc}") from None

    def _measure(self, ctx: VerifyContext, path: Path, into: list[float]) -> None:
        for _ in range(ctx.repeat):
            into.append(self._fio(ctx, path))

    def _run(self, ctx: VerifyContext, path: Path) -> Outcome:
        samples = Samples()
        self._measure(ctx, path, samples.a)
        directory = journal_dir(str(ctx.journal_dir) if ctx.journal_dir else None)
        with locked(directory):
            journal = apply_plan(Plan(changes=[self.write]), directory,
                                 argv=["kvmtune", "verify", "--apply", self.change], root=ctx.root, runner=ctx.runner)
        self.journal_id = journal.id
        kept = False
        try:
            self._measure(ctx, path, samples.b)
            j = judge(samples, SCHED_IOPS, ctx.threshold)
            kept = ctx.keep or j.verdict == "helps"
        finally:
            if not kept:
                with locked(directory):
                    _done, problems = undo_journal(journal, runner=ctx.runner)
                if problems:
                    raise KvmtuneError(f"undo of journal {journal.id} left problems: {'; '.join(problems)}")
        now = read_value(self.write.real, self.write.parse)
        details = {"samples_a": samples.a, "samples_b": samples.b, "journal": journal.id, "value_now": now,
                   "workload": self.workload}
        if kept:
            why = "--keep" if ctx.keep and j.verdict != "helps" else "it helps"
            action = f"kept ({why}); journal {journal.id}: '{journal.undo_command()}' restores {self.write.prior}"
        else:
            action = f"undone automatically (journal {journal.id}); {self.write.path} is {now} again"
        return Outcome(j, action, [], details)
