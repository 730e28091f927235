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


def _host_ksm_moot(ctx: AuditContext) -> bool:
    """KSM off, or told to keep merges within a NUMA node, on the audited host."""
    ksm = ctx.facts.ksm
    return ksm is not None and (ksm.run == 0 or ksm.merge_across_nodes == 0)


class PinnedWithoutNosharepages(GuestRule):
    id = "KVM-MEM-001"
    slug = "pinned-without-nosharepages"
    topic = "ksm-per-guest"
    severity = Severity.MEDIUM
    title = "Pinned/NUMA-placed guest still lets KSM merge its memory across NUMA nodes"
    why = (
        "Pinning vCPUs or binding memory to a NUMA node is done for locality. KSM then merges identical pages "
        "of this guest with pages of guests on other nodes into one shared copy, which may live on the far "
        "node: the guest's memory accesses become remote again. Seed 000 gives exactly this reason to exclude "
        "performance-critical pinned guests from KSM with <nosharepages/>."
    )
    fix_kind = "xml"
    fix_description = (
        "Add <memoryBacking><nosharepages/></memoryBacking> (needs a guest restart). The host then needs the "
        "memory KSM was saving; alternatively set /sys/kernel/mm/ksm/merge_across_nodes=0 host-wide."
    )
    fix_safe = False
    references = (
        "seed:000 (controlling KSM per guest: pinned guests and remote shared pages; <nosharepages/>)",
        "libvirt formatdomain: memoryBacking nosharepages",
        "Linux Documentation/admin-guide/mm/ksm.rst: merge_across_nodes",
        "RHEL 7 Virtualization Tuning Guide 9.4: KSM and NUMA",
    )
    verify = NoExperiment("KSM merges identical pages of several guests over minutes (ksmd's scan rate); two probe guests "
                          "measured for seconds share too little for its cost or saving to show")

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        if not (guest.vcpu_pinned or guest.numatune) or guest.nosharepages or guest.hugepages:
            return  # hugetlbfs pages are never scanned by KSM
        what = " and ".join(w for w, on in (("vCPUs pinned", guest.vcpu_pinned), ("numatune", guest.numatune)) if on)
        yield self.finding(
            target=self.target(guest, "memory"),
            actual=f"{what}, memory shareable by KSM",
            expected="<memoryBacking><nosharepages/>",
            evidence=guest.where("memoryBacking") or "/domain/memoryBacking",
            source=guest.origin,
            confidence="possible" if _host_ksm_moot(ctx) else "likely",
        )
