from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.verifyplan import HostFixExperiment
from kvmtune.rules.host import HostFactsRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.host.facts import HostFacts


class TransparentHugePages(HostFactsRule):
    id = "KVM-HST-008"
    slug = "thp-unsuited"
    topic = "thp"
    severity = Severity.MEDIUM
    also_severities = (Severity.LOW,)  # what some findings are raised or lowered to
    title = "Transparent huge pages are off, or defragment on every fault"
    why = (
        "QEMU asks for huge pages for guest RAM with madvise(); with THP 'never' every guest access goes "
        "through 4 KiB host pages and two-level page walks cost more TLB misses. defrag=always makes any "
        "process that faults a page compact memory synchronously, which shows up as latency spikes."
    )
    fix_kind = "sysfs"
    fix_description = (
        "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled (or 'always') and "
        "echo madvise > .../defrag; persist with transparent_hugepage=madvise on the kernel command line."
    )
    fix_safe = True
    references = (
        "Linux Documentation/admin-guide/mm/transhuge.rst",
        "tuned profiles: network-latency sets transparent_hugepages=never only for latency tiers",
        "seed:000 (RHEL 6: guest memory backed by transparent huge pages)",
    )
    verify = HostFixExperiment()

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        thp = facts.thp
        if thp is None:
            return
        if thp.enabled is not None and thp.enabled.current == "never":
            yield self.finding(
                target=self.at(ctx, "thp:enabled"),
                actual="never",
                expected="madvise (QEMU madvises guest RAM) or always",
                evidence=f"{thp.base}/enabled",
            )
        if thp.defrag is not None and thp.defrag.current == "always":
            yield self.finding(
                target=self.at(ctx, "thp:defrag"),
                severity=Severity.LOW,
                actual="always",
                expected="madvise (the kernel default since 4.6) or defer+madvise",
                evidence=f"{thp.base}/defrag",
                summary="THP defragments synchronously on every page fault",
            )
