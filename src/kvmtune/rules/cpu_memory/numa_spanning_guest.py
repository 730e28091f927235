from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.domain.cputune import cpu_layout
from kvmtune.rules.host import gib

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest


class NumaSpanningGuest(GuestRule):
    id = "KVM-CPU-022"
    slug = "guest-larger-than-numa-node"
    topic = "numa"
    severity = Severity.MEDIUM
    title = "Guest bigger than one host NUMA node without <numatune> and a guest NUMA topology"
    why = (
        "A guest with more vCPUs or memory than one host node has must span nodes. Without a guest NUMA "
        "topology (<cpu><numa>) its kernel believes all memory is equally near and places tasks and pages "
        "blindly; without <numatune> the host places the memory as it likes. Half the accesses go remote. "
        "Nova's hw:numa_nodes and the RHEL guide give the guest one virtual node per host node it uses."
    )
    fix_kind = "manual"
    fix_description = (
        "Give the guest one <cell> per host node it spans under <cpu><numa> and bind them with "
        "<numatune><memory mode='strict' nodeset=…/><memnode cellid=… nodeset=…/></numatune>, with vCPUs pinned "
        "to the matching nodes. Not automatic: the split depends on the host's free CPUs and memory per node."
    )
    fix_safe = False
    references = (
        "libvirt formatdomain 'NUMA Node Tuning' (numatune, memnode) and 'CPU model and topology' (<numa><cell>)",
        "OpenStack Nova hw:numa_nodes",
        "RHEL 9 Optimizing virtual machine performance: configuring NUMA in a virtual machine",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        nodes = ctx.facts.numa_nodes
        if len(nodes) < 2:
            return
        node_cpus = max(len(c) for c in nodes.values())
        total = ctx.facts.mem_total_kib
        node_kib = total // len(nodes) if total else None
        over = []
        if guest.vcpus and guest.vcpus > node_cpus:
            over.append(f"{guest.vcpus} vCPUs > {node_cpus} CPUs per node")
        if guest.memory_kib and node_kib and guest.memory_kib > node_kib:
            over.append(f"{gib(guest.memory_kib)} > {gib(node_kib)} per node")
        if not over:
            return
        layout = cpu_layout(guest)
        if layout is not None and layout.numa_cells >= 2 and layout.numatune_mode is not None:
            return
        missing = [w for w, ok in (("<numatune>", layout is not None and layout.numatune_mode is not None),
                                   ("guest NUMA cells", layout is not None and layout.numa_cells >= 2)) if not ok]
        yield self.finding(
            target=self.target(guest, "numa"),
            actual=f"{'; '.join(over)} on a {len(nodes)}-node host, without {' and '.join(missing)}",
            expected="one guest NUMA cell per host node used, bound with <numatune>",
            evidence="/domain/vcpu, /domain/memory, /domain/cpu/numa, /domain/numatune; "
                     "/sys/devices/system/node/node*/cpulist, /proc/meminfo",
            source=guest.origin,
        )
