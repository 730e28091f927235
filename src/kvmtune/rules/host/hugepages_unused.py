from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.rules.host import HostFactsRule, gib

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.host.facts import HostFacts


class HugepagesUnused(HostFactsRule):
    id = "KVM-HST-044"
    slug = "static-hugepages-unused"
    topic = "hugepages"
    severity = Severity.MEDIUM
    title = "Static huge pages are reserved but no running guest uses them"
    why = (
        "Pages reserved with vm.nr_hugepages or hugepages= are taken out of normal memory: no guest without "
        "<memoryBacking><hugepages/> (Nova hw:mem_page_size, Proxmox hugepages) can use them, and the page cache "
        "and THP cannot either. Reserved and idle, they are RAM the host does not have."
    )
    fix_kind = "manual"
    fix_description = (
        "Give the guests meant for them <memoryBacking><hugepages/></memoryBacking>, or lower vm.nr_hugepages "
        "(and hugepages= on the kernel command line). Not automatic: only the operator knows whether a guest "
        "about to start needs the reservation, and pages released now may not be reservable again once memory "
        "fragments."
    )
    fix_safe = False
    references = (
        "Documentation/admin-guide/mm/hugetlbpage.rst: HugePages_Total/HugePages_Free, nr_hugepages",
        "libvirt formatdomain 'Memory Backing': <hugepages/>",
        "OpenStack Nova flavor extra spec hw:mem_page_size; Proxmox VE qm.conf 'hugepages'",
        "RHEL 9 Optimizing virtual machine performance: configuring huge pages",
    )

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        info = facts.meminfo or {}
        total, free = info.get("HugePages_Total", 0), info.get("HugePages_Free", 0)
        size_kib = info.get("Hugepagesize", 2048)
        if total <= 0 or free < total or not facts.guests:
            return
        if any(g.hugepages for g in facts.guests):
            return  # a guest asks for them (QEMU may not have touched the pages yet)
        yield self.finding(
            target=self.at(ctx, "hugepages"),
            actual=(f"{total} x {size_kib} kB pages ({gib(total * size_kib)}) reserved, all free; "
                    f"none of {len(facts.guests)} running guests uses huge pages"),
            expected="a reservation the guests use, or none",
            evidence="/proc/meminfo (HugePages_Total, HugePages_Free); running QEMU command lines (-mem-path, "
                     "memory-backend-file)",
        )
