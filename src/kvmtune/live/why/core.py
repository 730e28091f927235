"""``kvmtune why``'s shared core: the report and its lines, the guest it samples, why's own thresholds (each
default cited) and the rules of the catalogue it names, found by topic and slug (never by a written id)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from kvmtune.audit.rule import Rule, all_rules
from kvmtune.audit.verifyplan import BlockExperiment, NoExperiment
from kvmtune.errors import UsageError
from kvmtune.host.parsers import parse_count
from kvmtune.host.root import HostRoot
from kvmtune.live.model import Snapshot
from kvmtune.live.symptoms import SIGNALS

TICK_S = 1.0

# the vcpu-delay Signal row's warn level (top's, cited there): a vCPU, a thread bound or a vhost worker waiting this long
VCPU_WARN = next(s.thresholds[""].warn for s in SIGNALS if s.name == "vcpu-delay")


@dataclass(frozen=True)
class WhySettings:
    """``why``'s own thresholds, beside the Signal rows it judges as top does; each default says where it comes from
    (``CITES``: a seed, a peer's figure, or kvmtune's own value where no source gives one)."""

    throttle_near: float = 0.8  # a disk at 80 % or more of an I/O limit is held by it
    cpu_cause_min: float = 0.05  # a neighbour that used a waited-on CPU for less than 5 % of the interval is not named
    host_busy: float = 0.8  # a backing device busy 80 % of the interval or more is saturated
    ksm_share: float = 0.10  # KSM merging a tenth of the guest's memory or more is worth a line
    vhost_busy: float = 0.5  # a single-queue NIC whose vhost worker is busy half a CPU or more is held by its one queue

    CITES: ClassVar[dict[str, str]] = {
        "throttle_near": "seed:000 (target system use at 80 % or lower): a limit used 80 % or more holds the disk",
        "cpu_cause_min": "VMware's CPU Ready guidance, the vcpu-delay signal's warn level (5 % per vCPU worth a look)",
        "host_busy": "seed:000 (target system use at 80 % or lower), as the host-cpu signal's warn level",
        "ksm_share": "kvmtune's own value: KSM merging a tenth of a guest's memory is worth naming",
        "vhost_busy": "kvmtune's own value: one vhost worker busy half a CPU carries a single-queue NIC",
    }


LIMITS = WhySettings()


def rules_of(topic: str) -> list[type[Rule]]:
    """The catalogue's rules of one topic, as ``Signal.rule_ids`` takes them."""
    return sorted((r for r in all_rules() if r.topic == topic), key=lambda r: r.id)


@dataclass(frozen=True)
class CatalogueRule:
    """A rule a cause names, found in the catalogue by its topic and slug: its id is the catalogue's, never written
    here (``tests/live/test_why_rules.py`` checks that each one is there)."""

    topic: str
    slug: str

    def rule(self) -> type[Rule] | None:
        return next((r for r in rules_of(self.topic) if r.slug == self.slug), None)

    @property
    def id(self) -> str:
        rule = self.rule()
        if rule is None:
            raise LookupError(f"no rule {self.slug!r} in topic {self.topic!r}")
        return rule.id


def short_ids(rules: tuple[CatalogueRule, ...]) -> str:
    """"<first id>/<number>…" for rules of one family: the second and later only by their number."""
    ids = [r.id for r in rules]
    return "/".join([ids[0], *(i.rsplit("-", 1)[-1] for i in ids[1:])])


@dataclass
class WhyLine:
    """One line of the breakdown."""

    area: str  # cpu | disk | net | memory
    share: float | None  # the fraction of the interval (or of the operations) it accounts for
    what: str  # the headline
    evidence: str
    cause: str
    rule: str | None
    fix: str
    verify: str
    no_rule: str = ""  # when ``rule`` is None: why no rule covers it

    def as_json(self) -> dict[str, Any]:
        return {"area": self.area, "share": self.share, "what": self.what, "evidence": self.evidence,
                "cause": self.cause, "rule": self.rule, "no_rule": self.no_rule or None, "fix": self.fix,
                "verify": self.verify}


@dataclass
class Target:
    name: str
    source: str
    key: str
    pid: int | None
    uuid: str | None
    libvirt: bool
    owner: str = ""  # a QEMU libvirt did not start: who runs it (user name, else "uid N")


@dataclass
class WhyReport:
    target: Target
    seconds: float
    accel: str | None  # kvm | tcg | None (not known)
    lines: list[WhyLine] = field(default_factory=list)
    vcpus: list[dict[str, Any]] = field(default_factory=list)
    disks: list[dict[str, Any]] = field(default_factory=list)
    nics: list[dict[str, Any]] = field(default_factory=list)
    memory: dict[str, Any] = field(default_factory=dict)
    psi: dict[str, float] = field(default_factory=dict)  # the guest's cgroup: 'some' share of the interval
    notes: list[str] = field(default_factory=list)
    not_measured: dict[str, str] = field(default_factory=dict)  # a figure that could not be taken -> why
    # without named vCPU threads: the busiest threads' schedstat, whose largest wait bounds every vCPU's
    vcpu_wait_bound: dict[str, Any] | None = None

    @property
    def emulation(self) -> bool:
        return self.accel == "tcg"

    def as_json(self) -> dict[str, Any]:
        t = self.target
        return {"schema_version": 1, "kind": "kvmtune-why",
                "guest": {"name": t.name, "source": t.source, "key": t.key, "pid": t.pid, "uuid": t.uuid,
                          "owner": t.owner or None},
                "seconds": self.seconds, "accel": self.accel, "emulation": self.emulation,
                "explained": bool(self.lines), "lines": [line.as_json() for line in self.lines],
                "vcpus": self.vcpus, "disks": self.disks, "nics": self.nics, "memory": self.memory,
                "psi": self.psi, "not_measured": self.not_measured, "vcpu_wait_bound": self.vcpu_wait_bound,
                "notes": self.notes}


# --- finding the guest -------------------------------------------------------------------------------


def _libvirt_pid(host: HostRoot, name: str) -> int | None:
    text = host.read_optional(f"/run/libvirt/qemu/{name}.pid")
    return parse_count(text or "")


def find_target(host: HostRoot, snap: Snapshot, text: str) -> Target:
    """The one running guest ``text`` names (libvirt name or UUID, pid, QEMU ``-name``); UsageError otherwise."""
    matches: list[Target] = []
    for g in snap.guests.values():
        libvirt = g.pid is None
        pid = g.pid if g.pid is not None else (_libvirt_pid(host, g.name) if host.is_live else None)
        uuid = g.guest.uuid if g.guest is not None else None
        names = {g.name, *([uuid.lower()] if uuid else [])}
        if (text.isascii() and text.isdigit() and pid == int(text)) or text in names or text.lower() in names:
            matches.append(Target(g.name, g.source, g.key, pid, uuid, libvirt, g.owner))
    if not matches:
        seen = ", ".join(sorted(g.name for g in snap.guests.values())) or "none"
        raise UsageError(f"{text}: no running guest has this name, UUID or pid (running: {seen})")
    if len(matches) > 1:
        shown = ", ".join(m.source + (f" ({m.owner})" if m.owner else "") for m in matches)
        raise UsageError(f"{text}: names {len(matches)} running guests ({shown}); "
                         "name it by pid or UUID")
    return matches[0]



# --- rules -------------------------------------------------------------------------------------------


def _rule(rule_id: str) -> type[Rule] | None:
    return next((r for r in all_rules() if r.id == rule_id), None)


def verify_text(rule_id: str | None, guest: str, again: str) -> str:
    rule = _rule(rule_id) if rule_id else None
    if rule is not None and rule.verify is not None and not isinstance(rule.verify, NoExperiment):
        return f"kvmtune verify --only {rule_id} (measures the fix), then `kvmtune why {guest}` again: {again}"
    return f"`kvmtune why {guest}` again after the change: {again}"


def capture_hint(rule_id: str | None, guest: str) -> str:
    """For a disk cause whose fix verify measures on the block tier: capturing the guest's own I/O first is optional,
    and lets verify judge the fix on it (docs/capture.md)."""
    rule = _rule(rule_id) if rule_id else None
    if rule is None or not isinstance(rule.verify, BlockExperiment):
        return ""
    return (f"; optional: `kvmtune capture {guest} -o {guest}.workload.json` records its own disk I/O, and "
            f"`kvmtune verify … --only {rule_id} --replay {guest}.workload.json` judges the fix on it")


def rule_fix(rule_id: str) -> str:
    rule = _rule(rule_id)
    return rule.fix_description if rule is not None else ""
