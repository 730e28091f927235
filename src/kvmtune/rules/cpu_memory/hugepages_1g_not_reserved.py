from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.rules.host import gib

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest

GIB_PAGE_KIB = 1024 * 1024


def _page(kib: int) -> str:
    return f"{kib // GIB_PAGE_KIB} GiB" if kib >= GIB_PAGE_KIB else f"{kib // 1024} MiB" if kib >= 1024 else f"{kib} KiB"


class Hugepages1gNotReserved(GuestRule):
    id = "KVM-MEM-012"
    slug = "hugepages-1g-not-reserved"
    topic = "hugepages"
    judges_only = "on_audited_host"
    severity = Severity.HIGH
    title = "Guest backed by 1 GiB hugepages on a host that reserves none: it will not start"
    why = (
        "1 GiB pages exist only where the host reserved them, in practice at boot (hugepagesz=1G hugepages=N; "
        "at run time the buddy allocator rarely finds 1 GiB of contiguous free memory). QEMU maps the guest's "
        "memory from hugetlbfs and fails when the pool is empty: libvirt reports 'unable to map backing store "
        "for guest RAM' or cannot find a hugetlbfs mount for that size, and the guest does not start."
    )
    fix_kind = "manual"
    fix_description = (
        "Reserve the pages at boot (kernel command line default_hugepagesz=1G hugepagesz=1G hugepages=N, N >= "
        "the guest's GiB, on each NUMA node it uses) and mount hugetlbfs with pagesize=1G, or back the guest "
        "with 2 MiB pages (<page size='2' unit='M'/>) that can be reserved at run time."
    )
    fix_safe = False
    references = (
        "Linux Documentation/admin-guide/mm/hugetlbpage.rst: /sys/kernel/mm/hugepages/hugepages-1048576kB/"
        "nr_hugepages; gigantic pages are best reserved on the kernel command line",
        "libvirt formatdomain 'Memory Backing': <hugepages><page size='1' unit='G'/>",
        "RHEL 9 Optimizing virtual machine performance: configuring huge pages (1 GiB pages at boot time)",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        if not guest.on_audited_host or GIB_PAGE_KIB not in guest.hugepage_sizes_kib:
            return
        reserved = ctx.facts.hugepages_reserved
        if not reserved:
            return  # this host's hugepage pools are unknown (no /sys/kernel/mm/hugepages)
        pages = reserved.get(GIB_PAGE_KIB, 0)
        if pages:
            return
        sizes = ", ".join(f"{n} x {_page(size)}" for size, n in sorted(reserved.items()) if n) or "none of any size"
        yield self.finding(
            target=self.target(guest, "memoryBacking"),
            actual=f"<page size='1' unit='G'/> for {gib(guest.memory_kib or 0)}; this host reserves no 1 GiB pages "
            f"(reserved: {sizes})",
            expected="hugepages-1048576kB/nr_hugepages >= the guest's memory in GiB",
            evidence="/domain/memoryBacking/hugepages/page/@size; "
                     "/sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages",
            source=guest.origin,
            confidence="certain" if guest.origin_kind == "libvirt" else "likely",
        )
