from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.kubevirt.form import KubevirtForm
from kvmtune.kubevirt.guest import quantity, resources, spec_of

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest

MIB = 1024 * 1024


class MemoryRequestBelowGuest(GuestRule):
    id = "KVM-KUB-006"
    slug = "kubevirt-memory-request-below-guest"
    topic = "memory-overcommit"
    severity = Severity.MEDIUM
    title = "KubeVirt VM shows the guest more memory than its pod requests: the node is overcommitted"
    why = (
        "With spec.domain.memory.guest above resources.requests.memory the guest sees memory the scheduler never "
        "reserved for it. When the guest uses it the node runs short: the kernel reclaims and swaps, and the "
        "kubelet evicts pods or the OOM killer ends the VM's virt-launcher. KubeVirt documents it as deliberate "
        "overcommit; where it is not meant, the request should cover the guest."
    )
    fix_kind = "manual"
    fix_description = "KubeVirt: set resources.requests.memory to the guest's memory (or drop memory.guest)."
    fix_safe = True
    kubevirt = KubevirtForm("domain.resources.requests.memory", "the value of memory.guest", compute="memory-guest")
    references = (
        "KubeVirt user guide, operations/node_overcommit.md: overcommitting memory with memory.guest above the request",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        spec = spec_of(guest)
        if spec is None:
            return
        shown = quantity(spec.get("domain.memory.guest"))
        request = quantity(resources(spec, "requests", "memory"))
        if shown is None or request is None or request >= shown or guest.hugepages:
            return  # with hugepages it is no overcommit but a guest the pod cannot back: KVM-KUB-010
        yield self.finding(
            target=self.target(guest),
            actual=f"memory.guest {shown / MIB:g} MiB, requests.memory {request / MIB:g} MiB",
            expected="requests.memory at least memory.guest",
            evidence=spec.path("domain.resources.requests.memory"),
            source=guest.origin,
        )
