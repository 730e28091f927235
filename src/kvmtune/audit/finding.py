"""The finding: one problem on one target (schema in docs/architecture.md §4)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import date
from typing import Any, Literal, NamedTuple


class Severity(enum.IntEnum):
    INFO = 0
    LOW = 1
    MEDIUM = 2
    HIGH = 3
    CRITICAL = 4

    @classmethod
    def parse(cls, text: str) -> Severity:
        try:
            return cls[text.strip().upper()]
        except KeyError:
            names = ", ".join(s.name.lower() for s in cls)
            raise ValueError(f"unknown severity {text!r} (one of: {names})") from None

    def __str__(self) -> str:
        return self.name.lower()


TOPICS = frozenset(
    {
        # storage
        "disk-bus", "disk-cache", "disk-io-mode", "image-format", "image-preallocation",
        "storage-overcommit", "partition-alignment", "block-vs-file", "nfs-storage",
        "io-scheduler", "iothreads", "discard", "qcow2-cache", "backing-chain",
        # network
        "nic-model", "vhost-net", "net-backend", "mac-address", "mtu", "txqueuelen",
        "tcp-sysctl", "rps", "net-multiqueue",
        # cpu and memory
        "vcpu-overcommit", "cpu-utilization", "cpu-model", "vcpu-pinning", "halt-polling",
        "ksm", "ksm-per-guest", "balloon", "swap", "hugepages", "thp", "numa",
        # host-wide memory promised to running guests vs RAM: neither KSM, balloon nor swap names it
        "memory-overcommit",
        # security
        "entropy", "rng-device",
        # host
        "kvm-acceleration", "tuned-profile", "host-devices", "dirty-writeback",
        # CPU frequency and idle states, interrupt placement, CPU isolation, DMA remapping
        "cpu-power", "irq-affinity", "cpu-isolation", "iommu",
        # Windows guests: Hyper-V enlightenments and clock timers
        "hyperv", "guest-clock",
        # drivers inside a guest (what its guest agent reports)
        "guest-drivers",
    }
)


class Target(NamedTuple):
    """What a finding is about. A named tuple: immutable and hashable like a frozen dataclass, and
    built in under half the time (one per finding, ~6,000 in a corpus audit)."""

    host: str = "localhost"
    domain: str | None = None
    device: str | None = None

    def label(self) -> str:
        parts = [p for p in (self.domain, self.device) if p]
        return " ".join(parts) if parts else self.host


# How a finding is fixed: ``xml`` a guest fixer, ``sysctl``/``sysfs``/``udev``/``modprobe`` a host setting
# (fix --host), ``image`` fix --images, ``manual`` nothing automatic (kvmtune.fix.remedies says which part
# of kvmtune fix carries each out; tests/fix/test_remedies.py holds every rule to it).
FixKind = Literal["xml", "sysctl", "sysfs", "udev", "modprobe", "cmdline", "image", "manual"]


@dataclass(frozen=True, slots=True)
class FixHint:
    kind: FixKind
    description: str
    safe: bool
    # when kvmtune fix's change would take effect (one word of fix/effect.py, and its phrase); set by the audit
    # command for the guest's state, "" where nothing is fixed automatically
    takes_effect: str = ""
    when: str = ""


@dataclass(frozen=True, slots=True)
class Waiver:
    """An accepted finding: a settings file's ``[[waiver]]`` or a guest's own ``<metadata>`` (audit/waivers.py
    matches them). ``rule`` is an id or id prefix; ``host``, ``guest`` and ``target`` are globs (``None``: any),
    except that a ``<metadata>`` waiver (``guest_source`` set) is bound to the one guest it came from."""

    rule: str
    reason: str
    host: str | None = None
    guest: str | None = None  # a guest's name or UUID
    target: str | None = None  # the finding's device, e.g. disk:vdb
    expires: date | None = None  # waives up to and including this day
    by: str | None = None
    origin: str = ""  # where it was written: FILE:LINE, or the guest's <metadata>
    # a <metadata> waiver: where the one guest it came from was read (its file, URI or process); it then
    # applies to that guest's own findings only, ``guest`` being that guest's name, not a glob. None: a
    # settings file's waiver (globs)
    guest_source: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"rule": self.rule, "reason": self.reason, "host": self.host, "guest": self.guest, "target": self.target,
                "expires": self.expires.isoformat() if self.expires else None, "by": self.by, "origin": self.origin,
                "guest_source": self.guest_source}

    def label(self) -> str:
        """``KVM-STO-004 guest=db* (FILE:LINE)``: how notices name it."""
        scope = "".join(f" {k}={v}" for k, v in (("host", self.host), ("guest", self.guest), ("target", self.target)) if v)
        return f"{self.rule}{scope} ({self.origin})"


# Not frozen: a frozen dataclass sets each of its 15 fields through object.__setattr__, which made
# building a finding four times as costly (~19,000 instructions), and the corpus audit builds ~6,000.
# Nothing changes a finding after a rule made it; the reporters only read them.
@dataclass(slots=True)
class Finding:
    rule: str
    slug: str
    topic: str
    severity: Severity
    confidence: str  # certain | likely | possible
    target: Target
    actual: str
    expected: str
    evidence: str
    summary: str
    why: str
    fix: FixHint
    references: tuple[str, ...] = ()
    source: str = ""  # file, URI or process the evidence was read from
    extra: dict[str, Any] = field(default_factory=dict)
    waiver: Waiver | None = None  # set after the rules ran: still shown, not counted by --fail-on
    new: bool | None = None  # audit --new-since: not in the baseline (None: no baseline given)

    def sort_key(self) -> tuple[str, str, str, int, str]:
        t = self.target
        return (t.host, t.domain or "", t.device or "", -int(self.severity), self.rule)

    def to_json(self) -> dict[str, Any]:
        # by hand, not dataclasses.asdict: its deep copy was most of a 1,000-domain audit's time
        t, fix = self.target, self.fix
        data: dict[str, Any] = {
            "rule": self.rule, "slug": self.slug, "topic": self.topic, "severity": str(self.severity),
            "confidence": self.confidence, "target": {"host": t.host, "domain": t.domain, "device": t.device},
            "actual": self.actual, "expected": self.expected, "evidence": self.evidence, "summary": self.summary,
            "why": self.why, "fix": {"kind": fix.kind, "description": fix.description, "safe": fix.safe},
            "references": list(self.references), "source": self.source,
        }
        if fix.takes_effect:
            data["fix"]["takes_effect"] = fix.takes_effect
        if self.extra:
            data["extra"] = dict(self.extra)
        if self.waiver is not None:
            data["waiver"] = self.waiver.to_json()
        if self.new is not None:
            data["new"] = self.new
        return data
