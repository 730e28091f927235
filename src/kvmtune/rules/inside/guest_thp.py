from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest


class GuestThpNever(GuestRule):
    id = "KVM-INS-004"
    slug = "guest-thp-never"
    topic = "thp"
    judges_only = "inside"
    severity = Severity.LOW
    title = "Transparent huge pages are off inside the guest"
    why = (
        "A guest's memory access walks two page tables (guest and host, EPT/NPT). Huge pages on both levels "
        "cut the TLB misses of that two-dimensional walk; with THP 'never' inside, even a guest backed by host "
        "huge pages keeps 4 KiB translations on its own level."
    )
    fix_kind = "manual"
    fix_description = (
        "Inside the guest: echo madvise (or always) > /sys/kernel/mm/transparent_hugepage/enabled, made lasting "
        "with transparent_hugepage= on its kernel command line or tuned's virtual-guest profile. Keep 'never' only "
        "where the guest's database vendor asks for it. kvmtune never writes inside a guest."
    )
    references = (
        "tuned profiles: virtual-guest includes throughput-performance, whose [vm] transparent_hugepages=always",
        "Linux Documentation/admin-guide/mm/transhuge.rst",
        "RHEL 9 'Monitoring and managing system status and performance': 'Configuring huge pages'",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        inside = guest.inside
        if inside is None or inside.thp_enabled != "never":
            return
        yield self.finding(
            target=self.target(guest, "guest-thp"),
            actual="never",
            expected="madvise or always",
            evidence=f"guest agent ({inside.via}): /sys/kernel/mm/transparent_hugepage/enabled",
            source=guest.origin,
        )
