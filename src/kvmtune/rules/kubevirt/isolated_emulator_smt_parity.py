from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.kubevirt.form import KubevirtForm
from kvmtune.kubevirt.guest import dedicated_cpus, isolated_emulator, spec_of

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest


class IsolatedEmulatorSmtParity(GuestRule):
    id = "KVM-KUB-007"
    slug = "kubevirt-isolated-emulator-odd-cpus"
    topic = "vcpu-pinning"
    severity = Severity.INFO  # a rejection only on nodes with full-pcpus-only, which the manifest does not show
    title = "KubeVirt VM with an even vCPU count and an isolated emulator thread asks for an odd number of CPUs"
    why = (
        "isolateEmulatorThread adds one dedicated CPU to the pod, so an even vCPU count becomes an odd CPU request. "
        "On nodes whose kubelet CPU manager runs with the full-pcpus-only policy (whole SMT cores only) such a pod "
        "is rejected with an SMT alignment error and the VM does not start; on other nodes the emulator thread "
        "shares a core with another pod's CPU."
    )
    fix_kind = "manual"
    fix_description = "KubeVirt: make the vCPU count odd, or check the nodes' CPU manager policy options."
    fix_safe = False
    kubevirt = KubevirtForm("domain.cpu.cores", "an odd count (vCPUs + the emulator thread fill whole cores)")
    references = (
        "KubeVirt user guide, compute/dedicated_cpu_resources.md: isolateEmulatorThread with the full-pcpus-only "
        "CPU manager policy option",
        "Kubernetes documentation, CPU management policies: full-pcpus-only (SMTAlignmentError)",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        spec = spec_of(guest)
        if spec is None or not spec.vcpus_stated or not guest.vcpus or guest.vcpus % 2:
            return
        if not (dedicated_cpus(spec) and isolated_emulator(spec)):
            return
        yield self.finding(
            target=self.target(guest),
            actual=f"{guest.vcpus} vCPUs + 1 emulator thread = {guest.vcpus + 1} dedicated CPUs",
            expected="an even number of dedicated CPUs on SMT nodes with full-pcpus-only",
            evidence=spec.path("domain.cpu.isolateEmulatorThread"),
            source=guest.origin,
            confidence="possible",  # the nodes' CPU manager policy is not in the manifest
        )
