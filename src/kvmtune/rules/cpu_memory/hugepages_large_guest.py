from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.audit.verifyplan import NoExperiment

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest

LARGE_KIB = 16 * 1024 * 1024  # 16 GiB


class HugepagesLargeGuest(GuestRule):
    id = "KVM-MEM-004"
    slug = "hugepages-large-guest"
    topic = "hugepages"
    severity = Severity.LOW
    title = "Large guest (>= 16 GiB) without static hugepages"
    why = (
        "With 4 KiB pages a guest's memory needs millions of second-level (EPT/NPT) translations, and every "
        "TLB miss walks two page tables. Transparent hugepages recover much of this when the host can find "
        "free 2 MiB blocks, but not guaranteed and not for the whole guest; static hugepages (2 MiB or 1 GiB) "
        "make it deterministic and keep the memory out of KSM and swap."
    )
    fix_kind = "manual"
    fix_description = (
        "Reserve hugepages on the host (vm.nr_hugepages or hugepagesz=1G at boot) and add "
        "<memoryBacking><hugepages/></memoryBacking>; the memory is then dedicated to the guest."
        " Not automatic: the host must reserve the pages first, or the guest no longer starts."
    )
    fix_safe = False
    references = (
        "libvirt formatdomain: memoryBacking hugepages",
        "Linux Documentation/admin-guide/mm/hugetlbpage.rst",
        "tuned: network-latency sets transparent_hugepages=never (latency guests rely on static pages)",
    )
    verify = NoExperiment("hugepage backing needs hugetlbfs pages reserved on the host, which verify does not change, and its "
                          "gain (fewer TLB misses) shows with large working sets, not in a 512 MiB probe guest")

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        if guest.hugepages or not guest.memory_kib or guest.memory_kib < LARGE_KIB:
            return
        gib = guest.memory_kib / (1024 * 1024)
        yield self.finding(
            target=self.target(guest, "memory"),
            actual=f"{gib:.0f} GiB on 4 KiB pages (THP at best)",
            expected="<memoryBacking><hugepages/>",
            evidence=guest.where("memory") or "/domain/memory",
            source=guest.origin,
        )
