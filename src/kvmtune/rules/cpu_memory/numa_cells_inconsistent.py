from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.domain.cputune import cpu_layout
from kvmtune.host.parsers import format_cpu_list
from kvmtune.rules.host import gib

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.domain.cputune import CpuLayout
    from kvmtune.model.guest import Guest


def cpu_problems(layout: CpuLayout) -> list[str]:
    """vCPUs in no cell, in two cells, or beyond <vcpu>; none without cells or with a cpus= that is not a
    CPU list (the reader cannot judge it)."""
    cells = layout.cells
    if not cells or any(c.cpus_text and not c.cpus for c in cells):
        return []
    out: list[str] = []
    seen: set[int] = set()
    twice: set[int] = set()
    for cell in cells:
        twice |= seen & cell.cpus
        seen |= cell.cpus
    if layout.max_vcpus:
        every = set(range(layout.max_vcpus))
        if missing := every - seen:
            out.append(f"vCPUs {format_cpu_list(missing)} in no cell (of {layout.max_vcpus})")
        if beyond := seen - every:
            out.append(f"cells name vCPUs {format_cpu_list(beyond)}, beyond <vcpu> {layout.max_vcpus}")
    if twice:
        out.append(f"vCPUs {format_cpu_list(twice)} in two cells")
    return out


# libvirt rounds guest memory (1 MiB on x86, 256 MiB on ppc64): differences below this are its own rounding
MEMORY_SLACK_KIB = 256 * 1024


def memory_problem(guest: Guest, layout: CpuLayout) -> str | None:
    """<memory> against the cells' sum, which libvirt uses instead. Guests with memory devices (DIMMs,
    NVDIMMs, virtio-mem: ``guest.memory_kib`` then exceeds the cells) are not judged: their <memory> also
    counts devices whose size libvirt aligns and, for NVDIMM labels, trims."""
    sizes = [c.memory_kib for c in layout.cells]
    stated = layout.memory_stated_kib
    if not sizes or not stated or any(s is None for s in sizes):
        return None
    total = sum(s for s in sizes if s is not None)
    if guest.memory_kib != total or guest.device_memory_kib:
        return None  # memory devices on top of the cells (nvdimm: in <memory>, never in the guest's RAM)
    if abs(total - stated) <= max(MEMORY_SLACK_KIB, stated // 20):
        return None
    return f"cells hold {gib(total)}, <memory> says {gib(stated)}"


class NumaCellsInconsistent(GuestRule):
    id = "KVM-CPU-027"
    slug = "numa-cells-inconsistent"
    topic = "numa"
    severity = Severity.MEDIUM
    also_severities = (Severity.LOW,)
    title = "Guest NUMA cells do not cover every vCPU once, or their memory does not add up to <memory>"
    why = (
        "The guest kernel builds its scheduler and memory domains from the cells. A vCPU in no cell is put on "
        "node 0 by QEMU (with a warning; partial assignment is deprecated), so that "
        "node's CPUs are over-counted and the topology the cells were meant to mirror is lost; a vCPU in two "
        "cells is refused. libvirt sizes a guest with cells by their sum and ignores <memory>, so cells that do "
        "not add up give the guest another amount of RAM than the definition claims."
    )
    fix_kind = "manual"
    fix_description = (
        "List every vCPU 0..N-1 in exactly one <cell cpus=…>, and make the cells' memory add up to the guest's "
        "memory; mirror the host nodes the guest is bound to with <numatune><memnode>."
    )
    fix_safe = False
    references = (
        "libvirt formatdomain 'CPU model and topology' <numa><cell id cpus memory>: "
        "'memory … the total memory is the sum of the cells' (<memory> is then overridden)",
        "QEMU -numa node,cpus=: vCPUs left out are put on node 0 with the warning 'CPU(s) not present in any "
        "NUMA nodes' (partial assignment is deprecated)",
        "RHEL 9 Optimizing virtual machine performance: configuring NUMA in a virtual machine",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        layout = cpu_layout(guest)
        if layout is None or not layout.cells:
            return
        cpus, memory = cpu_problems(layout), memory_problem(guest, layout)
        problems = cpus + ([memory] if memory else [])
        if not problems:
            return
        yield self.finding(
            target=self.target(guest, "numa"),
            actual="; ".join(problems),
            expected="each vCPU in exactly one cell; the cells' memory adds up to <memory>",
            evidence="/domain/cpu/numa/cell/@cpus, /domain/cpu/numa/cell/@memory, /domain/vcpu, /domain/memory",
            source=guest.origin,
            # vCPUs outside the cells change the guest's topology; a <memory> the cells override only misleads
            severity=Severity.MEDIUM if cpus else Severity.LOW,
        )
