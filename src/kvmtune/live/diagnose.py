"""Live signals past their thresholds, tied to the audit rules that explain them.

The signals, their thresholds and the topics they point to are the list ``symptoms.SIGNALS``; this
module only walks it. A signal that no finding of the guest or the host explains is still shown,
marked "no rule explains this".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvmtune.audit.collect_host import add_guest_images
from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import AuditResult, run_rules
from kvmtune.audit.finding import Finding
from kvmtune.audit.rule import all_rules
from kvmtune.audit.thresholds import Thresholds
from kvmtune.host.facts import HostFacts
from kvmtune.host.parsers import mount_for
from kvmtune.host.root import HostRoot
from kvmtune.live.model import GuestSample, Snapshot
from kvmtune.live.signals import GuestRates, Rates
from kvmtune.live.symptoms import SIGNALS, Reading, Signal, Subject, with_thresholds
from kvmtune.qemu.process import running_qemu_guests

NO_RULE = "no rule explains this"


@dataclass
class Diagnosis:
    guest: str  # the guest's key; "" for the host
    signal: str
    level: str  # warn | critical
    value: str
    threshold: str
    rules: list[str] = field(default_factory=list)
    fix: str = ""
    who: str = ""  # the neighbour seen live ("waits for db"), when one is

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

    def __init__(self, host: HostRoot, thresholds: Thresholds | None = None) -> None:
        self.host = host
        self.facts = HostFacts(host, probe=False, guests=running_qemu_guests)
        self.thresholds = thresholds or Thresholds()
        # the settings file's [thresholds]; with none, the list itself (the cited defaults)
        self.signals = SIGNALS if self.thresholds == Thresholds() else with_thresholds(self.thresholds)
        self.ctx = AuditContext(host=host, host_facts=self.facts, thresholds=self.thresholds)
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

    def explain(self, signal_name: str, g: GuestSample) -> tuple[list[str], str]:
        """The rules (and the first one's fix) that explain ``signal_name`` for guest ``g``, as top judges it:
        the guest's and the host's findings in the signal's topics. ``kvmtune why`` asks this."""
        signal = next(s for s in self.signals if s.name == signal_name)
        return self._explain(signal, self.findings_for(g) + self.host_findings)

    def _explain(self, signal: Signal, findings: list[Finding]) -> tuple[list[str], str]:
        hits = [f for f in findings if f.topic in signal.topics]
        rules = sorted({f.rule for f in hits})
        return rules, (hits[0].fix.description if hits else "")

    def _diagnoses(self, guest: str, subject: Subject, scope: str, findings: list[Finding]) -> list[Diagnosis]:
        """The signals past their thresholds; each signal whose figure could not be taken is recorded in the
        rates' ``not_measured`` instead (shown as "not measured", never as "ok")."""
        out: list[Diagnosis] = []
        missing = subject.guest.not_measured if scope == "guest" and subject.guest else subject.host.not_measured
        for signal in self.signals:
            if signal.scope != scope:
                continue
            why = signal.unmeasured(subject)
            if why is not None:
                missing[signal.name] = why
            for reading in signal.read(subject):
                diagnosis = self._judge(guest, signal, reading, findings)
                if diagnosis is not None:
                    out.append(diagnosis)
        return out

    def _judge(self, guest: str, signal: Signal, reading: Reading, findings: list[Finding]) -> Diagnosis | None:
        threshold = signal.thresholds[reading.variant]
        level = signal.verdict(reading, threshold)
        if level is None:
            return None
        rules, fix = self._explain(signal, findings)
        cause = reading.cause() if reading.cause is not None else None
        if cause is not None:  # a cause seen live comes before what the configuration suggests
            rule = _host_rule_for(cause.topic)
            if rule:
                rules = [rule, *(x for x in rules if x != rule)]
            fix = cause.fix
        name = f"{signal.name} {reading.part}" if reading.part else signal.name
        return Diagnosis(guest, name, level, reading.shown, threshold.label(reading.note), rules, fix,
                         cause.who if cause is not None else "")

    def diagnose(self, r: Rates, snap: Snapshot) -> list[Diagnosis]:
        out = self._diagnoses("", Subject(r.host, snap), "host", self.host_findings)
        for gr in r.guests:
            g = snap.guests.get(gr.key)
            if g is not None:
                out.extend(self._guest(gr, g, r, snap))
        return out

    def _guest(self, gr: GuestRates, g: GuestSample, r: Rates, snap: Snapshot) -> list[Diagnosis]:
        subject = Subject(r.host, snap, gr, g, lambda disk: self.medium(g, disk))
        return self._diagnoses(gr.key, subject, "guest", self.findings_for(g) + self.host_findings)
