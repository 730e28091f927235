"""Finding → experiment: which measurement judges which fix, keyed by rule id like the fixers.

:data:`DISK_EXPERIMENTS` names, per guest-disk rule, the fio job that shows its
effect on the block tier; the host rules resolve through the host fix plan
(:mod:`kvmtune.fix.host`) to the runtime value the fix writes, and from there
to a namespace experiment (per-namespace network settings) or a host-wide one
(only with ``--apply``). Every other fixable finding gets a one-line reason in
:data:`NOT_MEASURABLE`, so nothing is silently left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from kvmtune.audit.finding import Finding
from kvmtune.host.root import HostRoot
from kvmtune.model.guest import Disk, Guest
from kvmtune.qemu.image import DiskImage
from kvmtune.runner import Runner
from kvmtune.verify.block import FioJob
from kvmtune.verify.measure import Judgement

GUEST_TIER = "needs the guest tier (a booted guest); KVM does not boot guests here and TCG would measure the emulator"

# the job that shows each disk fix; "discard" measures space returned instead of speed
CACHE_JOB = FioJob("cache", "randwrite", "4k", 16, fsync=32)
DISK_EXPERIMENTS: dict[str, FioJob | str] = {
    "KVM-STO-002": CACHE_JOB,  # writethrough → none + native
    "KVM-STO-003": CACHE_JOB,  # default → none + native
    "KVM-STO-004": CACHE_JOB,  # unsafe → none + native
    "KVM-STO-005": CACHE_JOB,  # writeback → none + native
    "KVM-STO-006": FioJob("aio", "randrw", "4k", 32, rwmixread=70),  # threads → native
    "KVM-STO-021": FioJob("aio", "randrw", "4k", 32, rwmixread=70),  # io_uring → native (old host kernels)
    "KVM-STO-007": CACHE_JOB,  # native + cached → cache none
    "KVM-STO-014": CACHE_JOB,  # directsync → none
    "KVM-STO-008": FioJob("format", "randwrite", "4k", 16, fsync=32),  # qcow2 → raw (by hand)
    "KVM-STO-010": "discard",  # discard ignore → unmap
    "KVM-IMG-002": FioJob("prealloc", "randwrite", "4k", 16, fsync=32),  # qcow2 preallocation off → metadata
    "KVM-IMG-003": FioJob("prealloc", "randwrite", "4k", 16, fsync=32),  # sparse raw → falloc
}
# fixes that are not XML edits: the layout change they make, and who makes it
MANUAL_DISK_CHANGES: dict[str, tuple[dict[str, str], str]] = {
    "KVM-STO-008": ({"format": "raw"}, "by hand: qemu-img convert -O raw with the guest stopped"),
    "KVM-IMG-002": ({"preallocation": "metadata"}, "kvmtune fix --images"),
    "KVM-IMG-003": ({"preallocation": "falloc"}, "kvmtune fix --images"),
}

# fixes made for data safety, not speed: a slower measurement is the expected price, not a reason to skip them
SAFETY_FIRST: dict[str, str] = {
    "KVM-STO-004": "a safety fix: cache=unsafe drops the guest's flushes, so a host crash loses data the guest "
    "was told is on disk; expect it to measure slower, and apply it anyway",
}

NOT_MEASURABLE: dict[str, str] = {
    "KVM-STO-001": "bus change " + GUEST_TIER,
    "KVM-STO-009": "an IOThread takes disk I/O off QEMU's main loop, which only a running guest keeps busy; " + GUEST_TIER,
    "KVM-STO-015": "a virtio-scsi controller's IOThread takes its disks' I/O off QEMU's main loop; " + GUEST_TIER,
    "KVM-STO-011": "virtio-blk queues are per vCPU inside the guest; " + GUEST_TIER,
    "KVM-STO-012": "controller model change " + GUEST_TIER,
    "KVM-NET-001": "NIC model change " + GUEST_TIER,
    "KVM-NET-002": "vhost-net carries a guest NIC's traffic; " + GUEST_TIER,
    "KVM-NET-005": "macvtap bridge vs VEPA needs a physical lower device and an external switch; not measured",
    "KVM-NET-008": "virtio-net multiqueue " + GUEST_TIER,
    "KVM-NET-021": "virtio-net ring sizes act in the guest's driver under line-rate bursts; " + GUEST_TIER,
    "KVM-STO-022": "virtio-blk queues and ring size are the guest's blk-mq contexts; " + GUEST_TIER,
    "KVM-NET-006": "a duplicate MAC is a correctness fault, not a speed setting; nothing to measure",
    "KVM-CPU-002": "vCPU count " + GUEST_TIER,
    "KVM-CPU-001": "CPU model " + GUEST_TIER,
    "KVM-CPU-003": "accelerator change " + GUEST_TIER,
    "KVM-WIN-001": "Hyper-V enlightenments act inside a Windows guest under KVM, which does not boot here",
    "KVM-WIN-002": "hypervclock acts inside a Windows guest under KVM, which does not boot here",
    "KVM-WIN-003": "the HPET's cost is a Windows guest's timer exits; " + GUEST_TIER,
    "KVM-WIN-004": "RTC catch-up is guest timekeeping, not a speed setting",
    "KVM-STO-020": "detect_zeroes='unmap' changes what zero writes leave allocated, not their speed",
    "KVM-MEM-010": "free page reporting returns guest memory to the host; no speed effect to measure",
    "KVM-CPU-025": "migratable='off' changes what may migrate, not speed; invtsc needs KVM, which does not boot here",
    "KVM-MEM-001": "KSM merging of a pinned guest's memory " + GUEST_TIER,
    "KVM-MEM-002": "a balloon device reports and reclaims guest memory; no speed effect to measure",
    "KVM-MEM-004": "hugepages back guest RAM " + GUEST_TIER,
    "KVM-SEC-001": "an RNG device's effect is guest entropy; not a speed setting",
    "KVM-SEC-002": "the RNG backend's effect is guest entropy; not a speed setting",
    "KVM-HST-010": "swappiness acts only under memory pressure; verify does not push this host into swapping",
    "KVM-HST-011": "halt polling acts on KVM vCPUs going idle; KVM does not boot guests here",
    "KVM-HST-023": "netdev_max_backlog is not per namespace and matters only under receive bursts that drop",
}


class Unmeasurable(Exception):
    """This finding's fix cannot be measured here; ``str()`` is the one-line reason."""


@dataclass
class VerifyContext:
    runner: Runner
    host: HostRoot
    root: str
    workdir: Path
    size: int = 1 << 30
    seconds: float = 1.0  # one sample's measuring time
    repeat: int = 3
    threshold: float = 5.0
    deadline: float | None = None  # time.monotonic() by which the run must end
    apply: bool = False
    keep: bool = False
    journal_dir: Path | None = None
    profile: str = "virtual-host"
    notes: list[str] = field(default_factory=list)


@dataclass
class Subject:
    """One finding and the objects it is about."""

    finding: Finding
    guest: Guest | None = None
    disk: Disk | None = None
    image: DiskImage | None = None


@dataclass
class Outcome:
    judgement: Judgement | None
    action: str  # what was kept or undone, or "nothing changed (scratch replicas)"
    notes: list[str] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    cut_short: bool = False


class Experiment(Protocol):
    @property
    def tier(self) -> str: ...  # block | netns | host

    @property
    def change(self) -> str: ...  # the change the fix makes, one line

    @property
    def workload(self) -> str: ...  # what is measured, one line

    def run(self, ctx: VerifyContext) -> Outcome: ...


def seed_figure(rule_id: str) -> str | None:
    """The seed's claim for this rule (its first ``seed:NNN (...)`` reference), if it has one."""
    from kvmtune.audit.rule import all_rules

    for rule in all_rules():
        if rule.id == rule_id:
            for ref in rule.references:
                if ref.startswith("seed:"):
                    return ref
    return None
