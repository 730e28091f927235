"""Live signals past their thresholds, tied to the audit rules that explain them.

The thresholds and their sources are listed in ``THRESHOLDS``; the rule docs of the topics each
signal points to quote them. A signal that no finding of the guest or the host explains is still
shown, marked "no rule explains this".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvmtune.audit.collect_host import add_guest_images
from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import AuditResult, run_rules
from kvmtune.audit.finding import Finding
from kvmtune.audit.rule import all_rules
from kvmtune.host.facts import HostFacts
from kvmtune.host.parsers import mount_for
from kvmtune.host.root import HostRoot
from kvmtune.live.model import GuestSample, Snapshot
from kvmtune.live.signals import GuestRates, Rates
from kvmtune.qemu.process import running_qemu_guests

NO_RULE = "no rule explains this"


@dataclass(frozen=True)
class Threshold:
    warn: float
    critical: float
    unit: str
    source: str


THRESHOLDS: dict[str, Threshold] = {
    "vcpu-delay": Threshold(0.05, 0.10, "fraction of the interval per vCPU",
                            "VMware's CPU Ready guidance (5 % per vCPU worth a look, 10 % a problem)"),
    "host-cpu": Threshold(0.80, 0.95, "fraction of all host CPUs", "seed:000 (target system use at 80 % or lower)"),
    "disk-latency-flash": Threshold(2.0, 10.0, "ms per operation", "storage vendors' knowledge-base guidance"),
    "disk-latency-hdd": Threshold(10.0, 25.0, "ms per operation",
                                  "storage vendors' knowledge-base guidance (HDD or network storage)"),
    "net-drops": Threshold(0.0, 0.01, "fraction of packets dropped",
                           "node-mixin's network alerts (any sustained drop; 1 % critical)"),
    "psi-memory": Threshold(10.0, 10.0, "% (some avg10 warns, full avg10 is critical)",
                            "kernel PSI documentation, systemd-oomd's default"),
    "balloon": Threshold(0.90, 0.75, "balloon size / defined memory (lower is worse)",
                         "kvmtune's own value: a guest ballooned below 90 % of its memory is being squeezed"),
}

# Which audit topics can explain each signal.
TOPICS_FOR: dict[str, frozenset[str]] = {
    "vcpu-delay": frozenset({"vcpu-overcommit", "vcpu-pinning", "cpu-utilization", "halt-polling", "kvm-acceleration"}),
    "host-cpu": frozenset({"cpu-utilization", "vcpu-overcommit", "ksm", "kvm-acceleration"}),
    "disk-latency": frozenset({"disk-cache", "disk-io-mode", "image-preallocation", "image-format", "iothreads",
                               "io-scheduler", "storage-overcommit", "block-vs-file", "nfs-storage", "qcow2-cache",
                               "backing-chain", "disk-bus", "partition-alignment"}),
    "net-drops": frozenset({"txqueuelen", "vhost-net", "nic-model", "net-multiqueue", "rps", "net-backend",
                            "tcp-sysctl", "mtu"}),
    "psi-memory": frozenset({"swap", "memory-overcommit", "ksm", "thp", "hugepages", "balloon"}),
    "balloon": frozenset({"balloon", "memory-overcommit", "ksm"}),
}


@dataclass
class Diagnosis:
    guest: str  # the guest's key; "" for the host
    signal: str
    level: str  # warn | critical
    value: str
    threshold: str
    rules: list[str] = field(default_factory=list)
    fix: str = ""

    @property
    def explanation(self) -> str:
        return ", ".join(self.rules) if self.rules else NO_RULE


def _host_rule_for(topic: str) -> str | None:
    for rule in all_rules():
        if rule.topic == topic and rule.scope == "host":
            return rule.id
    return None


class Diagnoser:
    """Audits each guest once (configuration, images, host) and matches signals to its findings."""

    def __init__(self, host: HostRoot) -> None:
        self.host = host
        self.facts = HostFacts(host, probe=False, guests=running_qemu_guests)
        self.ctx = AuditContext(host=host, host_facts=self.facts)
        self.host_findings: list[Finding] = run_rules(self.ctx, (), (), audit_host=True)
        self._guest_findings: dict[str, list[Finding]] = {}
        self._media: dict[str, str] = {}

    def findings_for(self, g: GuestSample) -> list[Finding]:
        if g.key not in self._guest_findings:
            result = AuditResult(guests=[g.guest] if g.guest is not None else [])
            add_guest_images(self.ctx, result)  # the image rules explain first-write latency (seed:003)
            self._guest_findings[g.key] = run_rules(self.ctx, result.guests, result.images, audit_host=False)
        return self._guest_findings[g.key]

    def medium(self, g: GuestSample, disk: str) -> str:
        """'flash', 'hdd' or 'network' storage behind ``disk`` (hdd thresholds when unknown)."""
        key = f"{g.key}/{disk}"
        if key in self._media:
            return self._media[key]
        medium = "hdd"
        source = next((d.source for d in (g.guest.disks if g.guest else []) if d.target == disk or
                       disk.endswith(d.target)), None)
        if source and source.startswith("/"):
            mount = mount_for(source, self.facts.mounts)
            if mount is not None and mount.fstype in ("nfs", "nfs4", "cifs", "ceph", "glusterfs"):
                medium = "network"
            elif mount is not None and mount.device.startswith("/dev/"):
                dev = mount.device.rsplit("/", 1)[-1]
                for path in (f"/sys/class/block/{dev}/queue/rotational",
                             f"/sys/class/block/{dev}/../queue/rotational"):
                    value = self.host.read_optional(path)
                    if value is not None:
                        medium = "hdd" if value.strip() == "1" else "flash"
                        break
        self._media[key] = medium
        return medium

    def _explain(self, signal: str, findings: list[Finding]) -> tuple[list[str], str]:
        topics = TOPICS_FOR[signal]
        hits = [f for f in findings if f.topic in topics]
        rules = sorted({f.rule for f in hits})
        return rules, (hits[0].fix.description if hits else "")

    def diagnose(self, r: Rates, snap: Snapshot) -> list[Diagnosis]:
        out: list[Diagnosis] = []
        t = THRESHOLDS
        hc = r.host.cpu_busy
        if hc is not None and hc >= t["host-cpu"].warn:
            rules, fix = self._explain("host-cpu", self.host_findings)
            out.append(Diagnosis("", "host-cpu", _level(hc, t["host-cpu"]), f"{hc:.0%} busy",
                                 "80 % / 95 % (seed:000)", rules, fix))
        some, full = r.host.psi_some.get("memory"), r.host.psi_full.get("memory")
        if (some or 0) >= t["psi-memory"].warn or (full or 0) >= t["psi-memory"].critical:
            rules, fix = self._explain("psi-memory", self.host_findings)
            level = "critical" if (full or 0) >= t["psi-memory"].critical else "warn"
            out.append(Diagnosis("", "psi-memory", level, f"some {some or 0:.1f} % full {full or 0:.1f} %",
                                 "some avg10 10 % / full avg10 10 %", rules, fix))
        for gr in r.guests:
            g = snap.guests.get(gr.key)
            if g is not None:
                out.extend(self._guest(gr, g, snap))
        return out

    def _guest(self, gr: GuestRates, g: GuestSample, snap: Snapshot) -> list[Diagnosis]:
        out: list[Diagnosis] = []
        t = THRESHOLDS
        findings = self.findings_for(g) + self.host_findings
        delay = gr.max_vcpu_delay
        if delay is not None and delay >= t["vcpu-delay"].warn:
            rules, fix = self._explain("vcpu-delay", findings)
            shared = _shared_cpus(g, snap)
            if shared:  # the most specific cause seen live comes first
                rule = _host_rule_for("vcpu-overcommit")
                if rule:
                    rules = [rule, *(x for x in rules if x != rule)]
                fix = f"{shared}: give each busy guest its own host CPUs, or fewer vCPUs"
            out.append(Diagnosis(gr.key, "vcpu-delay", _level(delay, t["vcpu-delay"]), f"{delay:.0%} run delay",
                                 "5 % / 10 % per vCPU (CPU Ready)", rules, fix))
        for name, d in gr.disks.items():
            worst = max((x for x in (d.read_ms, d.write_ms) if x is not None), default=None)
            if worst is None:
                continue
            medium = self.medium(g, name)
            th = t["disk-latency-flash"] if medium == "flash" else t["disk-latency-hdd"]
            if worst >= th.warn:
                rules, fix = self._explain("disk-latency", findings)
                out.append(Diagnosis(gr.key, f"disk-latency {name}", _level(worst, th), f"{worst:.1f} ms/op",
                                     f"{th.warn:g} / {th.critical:g} ms ({medium})", rules, fix))
        for name, n in gr.nics.items():
            if n.drops > 0:
                rules, fix = self._explain("net-drops", findings)
                level = "critical" if n.drop_fraction >= t["net-drops"].critical else "warn"
                out.append(Diagnosis(gr.key, f"net-drops {name}", level, f"{n.drops} drops ({n.drop_fraction:.2%})",
                                     "any / 1 %", rules, fix))
        if gr.balloon_fraction is not None and gr.balloon_fraction < t["balloon"].warn:
            rules, fix = self._explain("balloon", findings)
            level = "critical" if gr.balloon_fraction < t["balloon"].critical else "warn"
            out.append(Diagnosis(gr.key, "balloon", level, f"{gr.balloon_fraction:.0%} of its memory",
                                 "90 % / 75 % (kvmtune)", rules, fix))
        return out


def _level(value: float, th: Threshold) -> str:
    return "critical" if value >= th.critical else "warn"


def _shared_cpus(g: GuestSample, snap: Snapshot) -> str:
    """Describe host CPUs that hold more busy vCPUs than they have room for (affinity), if any."""
    mine = [v.allowed_cpus for v in g.vcpus.values() if v.allowed_cpus]
    if not mine:
        return ""
    cpus = frozenset().union(*mine)
    vcpus = 0
    guests = 0
    for other in snap.guests.values():
        inside = [v for v in other.vcpus.values() if v.allowed_cpus and v.allowed_cpus <= cpus]
        if inside:
            vcpus += len(inside)
            guests += 1
    if vcpus <= len(cpus):
        return ""
    listed = ",".join(str(c) for c in sorted(cpus))
    return f"{vcpus} vCPUs of {guests} guests confined to {len(cpus)} host CPU(s) {{{listed}}}"
