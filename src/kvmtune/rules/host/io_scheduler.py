from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.verifyplan import HostFixExperiment
from kvmtune.host.settings import SCHED_GOOD, SCHED_GOOD_LEGACY
from kvmtune.rules.host import HostFactsRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.host.facts import BlockDevice, HostFacts

# What it says it expects per device kind; what it accepts is the host settings table's SCHED_GOOD.
EXPECTED = {
    "nvme": "none",
    "ssd": "mq-deadline or none",
    "hdd": "mq-deadline (bfq for interactive hosts)",
    "virtual": "none (or mq-deadline)",
}
LEGACY_MAP = "seed advice maps to blk-mq as deadline → mq-deadline, cfq → bfq, noop → none"


class IoSchedulerMismatch(HostFactsRule):
    id = "KVM-HST-004"
    slug = "io-scheduler-mismatch"
    topic = "io-scheduler"
    severity = Severity.MEDIUM
    also_severities = (Severity.LOW,)  # what some findings are raised or lowered to
    title = "Block device uses an I/O scheduler that does not suit its kind"
    why = (
        "Seed 000 measured FFSB large-file creation with 16 threads at 104.0 MB/s with Deadline against 18.9 MB/s "
        "with default CFQ. On today's blk-mq kernels the equivalents are mq-deadline for disks with seek cost, "
        "none for NVMe and virtual disks, and bfq where fairness matters more than throughput."
    )
    fix_kind = "udev"
    fix_description = (
        "Set the scheduler per device kind with a udev rule, e.g. ACTION==\"add|change\", KERNEL==\"nvme*n*\", "
        "ATTR{queue/scheduler}=\"none\" in /etc/udev/rules.d/90-kvmtune.rules."
    )
    fix_safe = True
    references = (
        "seed:000 (Deadline 104.0 MB/s vs CFQ 18.9 MB/s, FFSB large file creation, 16 threads)",
        "Red Hat, RHEL 9 Monitoring and managing system status and performance: Setting the disk scheduler",
        "tuned commit ef339e1 (2013): elevator=deadline dropped from the profiles",
    )
    verify = HostFixExperiment()

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        for dev in facts.block_devices:
            yield from self._check(dev, ctx)

    def _check(self, dev: BlockDevice, ctx: AuditContext) -> Iterator[Finding]:
        cur = dev.scheduler
        if dev.legacy:
            if cur in SCHED_GOOD_LEGACY[dev.kind]:
                return
            sev = Severity.MEDIUM if cur in ("cfq", "anticipatory") else Severity.LOW
            expected = "deadline" if dev.kind == "hdd" else "deadline or noop"
            yield self.finding(
                target=self.at(ctx, f"block:{dev.name}"),
                severity=sev,
                actual=f"{cur} on a {dev.kind} (single-queue kernel)",
                expected=f"{expected}; on a blk-mq kernel: {EXPECTED[dev.kind]} ({LEGACY_MAP})",
                evidence=dev.path,
            )
            return
        if cur in SCHED_GOOD[dev.kind]:
            return
        if dev.kind == "hdd" and cur == "none":
            sev = Severity.MEDIUM  # no merging or sorting in front of a seeking disk
        elif cur == "bfq" and dev.kind in ("nvme", "virtual"):
            sev = Severity.MEDIUM  # bfq's per-request work caps fast devices
        else:
            sev = Severity.LOW
        yield self.finding(
            target=self.at(ctx, f"block:{dev.name}"),
            severity=sev,
            actual=f"{cur} on a {dev.kind} device",
            expected=EXPECTED[dev.kind],
            evidence=dev.path,
        )
