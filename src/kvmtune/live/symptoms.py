"""The live symptoms: one ``Signal`` per symptom, in one list (``SIGNALS``).

A signal names the counter it comes from, reads its rate from one interval's rates, compares it with
its threshold (whose direction, higher or lower is worse, is a field) and points to the audit topics
whose findings can explain it. ``diagnose.Diagnoser`` walks this list and nothing else: a new symptom
is one more entry here (and, if it needs a new counter, its rate in ``signals.py``).

The label shown next to a diagnosis ("5 % / 10 % per vCPU (CPU Ready)") is made from the numbers;
the thresholds are written once. The rule docs of the topics each signal points to quote them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from kvmtune.audit.rule import all_rules
from kvmtune.audit.thresholds import Thresholds
from kvmtune.live.model import GuestSample, Snapshot
from kvmtune.live.signals import GuestRates, HostRates

Level = Literal["warn", "critical"]


@dataclass(frozen=True)
class Threshold:
    """When a rate warns and when it is critical.

    ``worse="higher"``: a value at or above ``warn`` warns, at or above ``critical`` is critical.
    ``worse="lower"``: a value below ``warn`` warns, below ``critical`` is critical.
    """

    warn: float
    critical: float
    unit: str  # what the numbers measure
    source: str  # where they come from
    worse: Literal["higher", "lower"] = "higher"
    # how the label shows them
    scale: float = 1.0  # 100 for a fraction shown as a percentage
    symbol: str = ""  # "%" follows each number, any other symbol follows the pair
    measures: tuple[str, str] = ("", "")  # what is compared with warn and with critical, when not the same
    per: str = ""  # "per vCPU"
    cite: str = ""  # the source, short

    def reached(self, value: float, limit: float) -> bool:
        return value >= limit if self.worse == "higher" else value < limit

    def _number(self, value: float) -> str:
        if value == 0 and self.worse == "higher":
            return "any"
        text = f"{value * self.scale:g}"
        return f"{text} %" if self.symbol == "%" else text

    def label(self, note: str = "") -> str:
        """The threshold as shown: "80 % / 95 % (seed:000)", "2 / 10 ms (flash)"."""
        warn, critical = (" ".join(x for x in (m, self._number(v)) if x)
                          for m, v in zip(self.measures, (self.warn, self.critical), strict=True))
        text = f"{warn} / {critical}"
        if self.symbol and self.symbol != "%":
            text += f" {self.symbol}"
        if self.per:
            text += f" {self.per}"
        paren = note or self.cite
        return f"{text} ({paren})" if paren else text

    def as_json(self) -> dict[str, Any]:
        """The shape ``kvmtune sample --format json`` has always written (direction in the unit)."""
        unit = self.unit + (" (lower is worse)" if self.worse == "lower" else "")
        return {"warn": self.warn, "critical": self.critical, "unit": unit, "source": self.source}


@dataclass(frozen=True)
class Cause:
    """A cause seen live: the host rule of ``topic`` is named first, and ``fix`` replaces the findings' fix."""

    topic: str
    fix: str
    who: str = ""  # the neighbour seen live: "waits for db"


@dataclass(frozen=True)
class Reading:
    """One value of a signal for one subject (the host, a guest, or one disk or NIC of a guest)."""

    value: float  # compared with the threshold's warn (and critical, unless critical_value is given)
    shown: str  # the value as shown: "50% run delay"
    part: str = ""  # the disk or NIC: the diagnosis is "<signal> <part>"
    variant: str = ""  # which of the signal's thresholds applies
    note: str = ""  # the label's note instead of the threshold's cite (the disk's medium)
    critical_value: float | None = None
    cause: Callable[[], Cause | None] | None = None  # asked only when the signal fires


@dataclass(frozen=True)
class Subject:
    """What a signal reads: the interval's host rates, and for a guest signal the guest's rates and counters."""

    host: HostRates
    snap: Snapshot
    guest: GuestRates | None = None
    sample: GuestSample | None = None
    medium: Callable[[str], str] = lambda disk: "hdd"


def threshold_verdict(reading: Reading, th: Threshold) -> Level | None:
    critical = reading.value if reading.critical_value is None else reading.critical_value
    if th.reached(critical, th.critical):
        return "critical"
    if th.reached(reading.value, th.warn):
        return "warn"
    return None


@dataclass(frozen=True)
class Signal:
    name: str
    scope: Literal["host", "guest"]
    counter: str  # where the numbers come from
    read: Callable[[Subject], Iterable[Reading]]  # the rate(s) over the interval
    thresholds: Mapping[str, Threshold]  # by variant; "" when there is one
    topics: frozenset[str]  # the audit topics whose findings can explain it
    verdict: Callable[[Reading, Threshold], Level | None] = threshold_verdict
    # why the subject's figure could not be taken, where it applies but was not measured (None: measured, or
    # not applicable, like the balloon of a guest without one): shown as "not measured", never judged "ok"
    unmeasured: Callable[[Subject], str | None] = lambda s: None

    def threshold_key(self, variant: str) -> str:
        return f"{self.name}-{variant}" if variant else self.name

    def rule_ids(self) -> list[str]:
        """The rules this signal can point to: every rule of one of its topics."""
        return sorted(r.id for r in all_rules() if r.topic in self.topics)


def _guest(s: Subject) -> GuestRates:
    assert s.guest is not None, "a guest signal read without a guest"
    return s.guest


# --- readers: one per signal ------------------------------------------------------------------

def _host_cpu(s: Subject) -> Iterable[Reading]:
    if s.host.cpu_busy is None:
        return

    def emulated() -> Cause | None:  # a busy host is KVM's fault only when guests run under emulation
        tcg = sorted(g.name for g in s.snap.guests.values() if g.guest is not None and g.guest.virt_type == "qemu")
        if not tcg:
            return None
        return Cause("kvm-acceleration", f"{len(tcg)} guest(s) run under TCG emulation ({', '.join(tcg[:3])}), which "
                     "costs host CPU many times over: make KVM work")

    yield Reading(s.host.cpu_busy, f"{s.host.cpu_busy:.0%} busy", cause=emulated)


def _host_cpu_unmeasured(s: Subject) -> str | None:
    return ("/proc/stat was not read at both ends of the interval, or counted no CPU time between them"
            if s.host.cpu_busy is None else None)


def _psi_memory(s: Subject) -> Iterable[Reading]:
    if _psi_unmeasured(s) is not None:  # no PSI: not measured, never a zero
        return
    some, full = s.host.psi_some.get("memory") or 0, s.host.psi_full.get("memory") or 0
    yield Reading(some, f"some {some:.1f} % full {full:.1f} %", critical_value=full)


def _psi_unmeasured(s: Subject) -> str | None:
    if "memory" in s.host.psi_some or "memory" in s.host.psi_full:
        return None
    return "no /proc/pressure/memory (a kernel without CONFIG_PSI, or psi=0)"


def _vcpu_delay_unmeasured(s: Subject) -> str | None:
    if _guest(s).max_vcpu_delay is not None:
        return None
    if s.sample is not None and not s.sample.vcpus:
        return "its vCPU threads were not identified (QEMU without -name …,debug-threads=on, and no QMP)"
    return "its vCPUs' run delay was not read at both ends of the interval"


def _vcpu_delay(s: Subject) -> Iterable[Reading]:
    delay = _guest(s).max_vcpu_delay
    if delay is None:
        return
    sample = s.sample

    def confined() -> Cause | None:  # the most specific cause seen live comes first
        shared = _shared_cpus(sample, s.snap) if sample is not None else ""
        if not shared:
            return None
        others = _neighbours(sample, s.snap) if sample is not None else []
        return Cause("vcpu-overcommit", f"{shared}: give each busy guest its own host CPUs, or fewer vCPUs",
                     who=f"waits for {', '.join(others[:3])}" if others else "")

    yield Reading(delay, f"{delay:.0%} run delay", cause=confined)


def _disk_latency(s: Subject) -> Iterable[Reading]:
    for name, d in _guest(s).disks.items():
        worst = max((x for x in (d.read_ms, d.write_ms) if x is not None), default=None)
        if worst is None:
            continue
        medium = s.medium(name)
        yield Reading(worst, f"{worst:.1f} ms/op", part=name, variant="flash" if medium == "flash" else "hdd", note=medium)


def _net_drops(s: Subject) -> Iterable[Reading]:
    for name, n in _guest(s).nics.items():
        yield Reading(n.drops, f"{n.drops} drops ({n.drop_fraction:.2%})", part=name, critical_value=n.drop_fraction)


def _any_drop(reading: Reading, th: Threshold) -> Level | None:
    """Any dropped packet warns (the value is the count); the fraction dropped decides critical."""
    if reading.value <= th.warn:
        return None
    return "critical" if th.reached(reading.critical_value or 0.0, th.critical) else "warn"


def _balloon(s: Subject) -> Iterable[Reading]:
    fraction = _guest(s).balloon_fraction
    if fraction is not None:
        yield Reading(fraction, f"{fraction:.0%} of its memory")


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


def _neighbours(g: GuestSample, snap: Snapshot) -> list[str]:
    """The other guests whose vCPUs may only run on host CPUs this guest's vCPUs may run on."""
    cpus = frozenset().union(*(v.allowed_cpus for v in g.vcpus.values() if v.allowed_cpus))
    return sorted(o.name for o in snap.guests.values() if o.key != g.key and
                  any(v.allowed_cpus and v.allowed_cpus & cpus for v in o.vcpus.values()))


_DISK_SOURCE = "storage vendors' knowledge-base guidance"

# In the order `kvmtune sample` writes their thresholds; host signals are diagnosed before guests'.
SIGNALS: list[Signal] = [
    Signal("vcpu-delay", "guest", "libvirt vcpu.N.delay, or the vCPU thread's /proc schedstat run delay", _vcpu_delay,
           {"": Threshold(0.05, 0.10, "fraction of the interval per vCPU",
                          "VMware's CPU Ready guidance (5 % per vCPU worth a look, 10 % a problem)",
                          scale=100, symbol="%", per="per vCPU", cite="CPU Ready")},
           frozenset({"vcpu-overcommit", "vcpu-pinning", "cpu-utilization", "halt-polling", "kvm-acceleration"}),
           unmeasured=_vcpu_delay_unmeasured),
    Signal("host-cpu", "host", "/proc/stat (all CPUs: busy over total, iowait counted idle)", _host_cpu,
           {"": Threshold(0.80, 0.95, "fraction of all host CPUs", "seed:000 (target system use at 80 % or lower)",
                          scale=100, symbol="%", cite="seed:000")},
           frozenset({"cpu-utilization", "vcpu-overcommit", "ksm"}),  # kvm-acceleration: only as the live cause
           unmeasured=_host_cpu_unmeasured),
    Signal("disk-latency", "guest", "libvirt block.N.{rd,wr}.times/reqs, or QMP query-blockstats", _disk_latency,
           {"flash": Threshold(2.0, 10.0, "ms per operation", _DISK_SOURCE, symbol="ms"),
            "hdd": Threshold(10.0, 25.0, "ms per operation", f"{_DISK_SOURCE} (HDD or network storage)", symbol="ms")},
           frozenset({"disk-cache", "disk-io-mode", "image-preallocation", "image-format", "iothreads", "io-scheduler",
                      "storage-overcommit", "block-vs-file", "nfs-storage", "qcow2-cache", "backing-chain", "disk-bus",
                      "partition-alignment"}),
           ),
    Signal("net-drops", "guest", "libvirt net.N.{rx,tx}.{pkts,drop}, or the tap's /sys/class/net statistics", _net_drops,
           {"": Threshold(0.0, 0.01, "fraction of packets dropped",
                          "node-mixin's network alerts (any sustained drop; 1 % critical)", scale=100, symbol="%")},
           frozenset({"txqueuelen", "vhost-net", "nic-model", "net-multiqueue", "rps", "net-backend", "tcp-sysctl",
                      "mtu"}),
           verdict=_any_drop),
    Signal("psi-memory", "host", "/proc/pressure/memory (some and full avg10)", _psi_memory,
           {"": Threshold(10.0, 10.0, "% (some avg10 warns, full avg10 is critical)",
                          "kernel PSI documentation, systemd-oomd's default",
                          symbol="%", measures=("some avg10", "full avg10"))},
           frozenset({"swap", "memory-overcommit", "ksm", "thp", "hugepages", "balloon"}), unmeasured=_psi_unmeasured),
    Signal("balloon", "guest", "libvirt balloon.current / balloon.maximum", _balloon,
           {"": Threshold(0.90, 0.75, "balloon size / defined memory",
                          "kvmtune's own value: a guest ballooned below 90 % of its memory is being squeezed",
                          worse="lower", scale=100, symbol="%", cite="kvmtune")},
           frozenset({"balloon", "memory-overcommit", "ksm"})),
]


def with_thresholds(t: Thresholds, signals: Iterable[Signal] | None = None) -> list[Signal]:
    """The signals with a settings file's ``[thresholds]`` (run delay, host CPU, disk latency by medium) in
    place of their cited defaults (only those it changes); a critical level is never below its warn level."""
    d = Thresholds()
    warn: dict[tuple[str, str], tuple[float, float | None]] = {
        ("vcpu-delay", ""): (t.run_delay_warn, t.run_delay_critical),
        ("host-cpu", ""): (t.cpu_utilization, None),
        ("disk-latency", "flash"): (t.disk_latency_flash_ms, None),
        ("disk-latency", "hdd"): (t.disk_latency_hdd_ms, None),
    }
    defaults = {("vcpu-delay", ""): (d.run_delay_warn, d.run_delay_critical), ("host-cpu", ""): (d.cpu_utilization, None),
                ("disk-latency", "flash"): (d.disk_latency_flash_ms, None),
                ("disk-latency", "hdd"): (d.disk_latency_hdd_ms, None)}
    out: list[Signal] = []
    for sig in SIGNALS if signals is None else signals:
        changed = {}
        for variant, th in sig.thresholds.items():
            if (sig.name, variant) in warn and warn[sig.name, variant] != defaults[sig.name, variant]:
                w, c = warn[sig.name, variant]
                th = replace(th, warn=w, critical=max(w, th.critical if c is None else c))
            changed[variant] = th
        out.append(replace(sig, thresholds=changed))
    return out


def thresholds_json(signals: Iterable[Signal] | None = None) -> dict[str, dict[str, Any]]:
    """Every threshold by name ("disk-latency-flash" for a variant), as ``kvmtune sample`` writes them."""
    return {sig.threshold_key(variant): th.as_json()
            for sig in (SIGNALS if signals is None else signals) for variant, th in sig.thresholds.items()}


