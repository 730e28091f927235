from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.kubevirt.form import KubevirtForm
from kvmtune.kubevirt.guest import dedicated_cpus, quantity, resources, spec_of

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest

# KubeVirt's default cpuAllocationRatio: with no CPU request a VMI's pod requests 1/10 of a CPU per vCPU
DEFAULT_ALLOCATION_RATIO = 10


class CpuRequestFarBelowVcpus(GuestRule):
    id = "KVM-KUB-005"
    slug = "kubevirt-cpu-request-below-vcpus"
    topic = "vcpu-overcommit"
    severity = Severity.MEDIUM
    title = "KubeVirt VM requests far less CPU than its vCPUs: the scheduler packs it where its vCPUs wait"
    why = (
        "The CPU request is what the scheduler reserves for the VM's pod and what its CFS weight follows under "
        "contention. KubeVirt's own default asks for a tenth of a CPU per vCPU (cpuAllocationRatio 10); a request "
        "below that (10m for 2 vCPUs) lets the scheduler put the VM on a node that is already full, where its "
        "vCPUs wait for CPU time behind every other pod and steal time shows up in the guest."
    )
    fix_kind = "manual"
    fix_description = "KubeVirt: raise spec.template.spec.domain.resources.requests.cpu (or remove it for KubeVirt's default)."
    fix_safe = True
    kubevirt = KubevirtForm("domain.resources.requests.cpu", "the vCPU count / 10 at least",
                            "or remove it: KubeVirt then requests vCPUs / cpuAllocationRatio",
                            compute="cpu-request")
    references = (
        "KubeVirt user guide, operations/node_overcommit.md: node CPU allocation ratio (default 10)",
        "kubevirt/kubevirt PR 6374: the default CPU request of a VMI's pod is vCPUs / cpuAllocationRatio",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        spec = spec_of(guest)
        if spec is None or not spec.vcpus_stated or not guest.vcpus or dedicated_cpus(spec):
            return
        request = quantity(resources(spec, "requests", "cpu"))
        floor = guest.vcpus / DEFAULT_ALLOCATION_RATIO
        if request is None or request >= floor:
            return
        yield self.finding(
            target=self.target(guest),
            actual=f"requests.cpu {request * 1000:g}m for {guest.vcpus} vCPUs",
            expected=f"at least {floor * 1000:g}m (KubeVirt's default: vCPUs / {DEFAULT_ALLOCATION_RATIO})",
            evidence=spec.path("domain.resources.requests.cpu"),
            source=guest.origin,
        )
