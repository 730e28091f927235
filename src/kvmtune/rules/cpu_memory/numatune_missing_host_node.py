from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.domain.cputune import cpu_layout
from kvmtune.host.parsers import format_cpu_list

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest


class NumatuneMissingHostNode(GuestRule):
    id = "KVM-CPU-029"
    slug = "numatune-missing-host-node"
    topic = "numa"
    judges_only = "on_audited_host"
    severity = Severity.HIGH
    title = "<numatune> binds the guest's memory strictly to a NUMA node this host does not have: it will not start"
    why = (
        "mode='strict' confines the guest's memory to the nodeset through the cgroup's cpuset.mems and the "
        "memory backend's host-nodes. A node the host does not have cannot be set: libvirt refuses to start "
        "the guest ('NUMA node … is unavailable', or the cgroup write fails). Definitions copied from a "
        "two-socket host to a one-socket one do this."
    )
    fix_kind = "manual"
    fix_description = (
        "Bind to nodes this host has (/sys/devices/system/node), use placement='auto' (numad) or "
        "mode='preferred'/'interleave' where the guest may move between hosts of different shape."
    )
    fix_safe = False
    references = (
        "libvirt formatdomain 'NUMA Node Tuning': <memory mode='strict' nodeset=…>, placement='auto'",
        "Linux Documentation/admin-guide/cgroup-v2.rst: cpuset.mems must be a subset of the online memory nodes",
        "RHEL 9 Optimizing virtual machine performance: configuring NUMA in a virtual machine",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        if not guest.on_audited_host or not guest.numatune:
            return  # a file from elsewhere is bound to its own host's nodes
        layout = cpu_layout(guest)
        if layout is None or layout.numatune_mode != "strict" or not layout.numatune_nodeset:
            return
        nodes = set(ctx.facts.numa_nodes)
        if not nodes:
            return  # the host's nodes are unknown (no /sys/devices/system/node)
        missing = layout.numatune_nodeset - nodes
        if not missing:
            return
        yield self.finding(
            target=self.target(guest, "numatune"),
            actual=f"strict nodeset {format_cpu_list(layout.numatune_nodeset)}: node(s) {format_cpu_list(missing)} "
            f"not on this host (nodes {format_cpu_list(nodes)})",
            expected="a nodeset of this host's nodes",
            evidence="/domain/numatune/memory/@nodeset; /sys/devices/system/node",
            source=guest.origin,
            confidence="certain" if guest.origin_kind == "libvirt" or guest.active else "likely",
        )
