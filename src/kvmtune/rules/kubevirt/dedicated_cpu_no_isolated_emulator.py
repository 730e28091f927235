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


class DedicatedCpuNoIsolatedEmulator(GuestRule):
    id = "KVM-KUB-002"
    slug = "kubevirt-dedicated-cpu-shared-emulator"
    topic = "vcpu-pinning"
    severity = Severity.MEDIUM
    title = "KubeVirt VM with dedicated CPUs but its emulator thread on them (isolateEmulatorThread not set)"
    why = (
        "dedicatedCpuPlacement pins each vCPU to a CPU of its own, but without isolateEmulatorThread QEMU's "
        "emulator thread (and, with ioThreadsPolicy auto, its IOThreads) runs on those same CPUs. Device "
        "emulation, I/O completion and timers then steal time from the vCPUs they were meant to have to "
        "themselves: the latency that dedicated CPUs are asked for comes back."
    )
    fix_kind = "manual"
    fix_description = "KubeVirt: set spec.template.spec.domain.cpu.isolateEmulatorThread: true (one more CPU; restart)."
    fix_safe = True
    kubevirt = KubevirtForm("domain.cpu.isolateEmulatorThread", "true",
                            "the pod asks for one more dedicated CPU; IOThreads with policy auto share it",
                            setting=True, instancetype="cpu.isolateEmulatorThread")
    references = (
        "KubeVirt user guide, compute/dedicated_cpu_resources.md: requesting a dedicated CPU for the emulator thread",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        spec = spec_of(guest)
        if spec is None or not dedicated_cpus(spec) or isolated_emulator(spec):
            return
        yield self.finding(
            target=self.target(guest),
            actual="dedicatedCpuPlacement: true, isolateEmulatorThread not set",
            expected="isolateEmulatorThread: true",
            evidence=spec.path("domain.cpu.isolateEmulatorThread") + " (not set)",
            source=guest.origin,
        )
