from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.kubevirt.form import KubevirtForm
from kvmtune.kubevirt.guest import dedicated_cpus, spec_of

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest

MIB = 1024 * 1024
# kubevirt/kubevirt pkg/hypervisor/kvm/hypervisorbackend.go GetMemoryOverhead: the resident size of
# virt-launcher-monitor 25Mi, virt-launcher 100Mi, virtlogd 25Mi, virtqemud 40Mi and QEMU 50Mi beside its guest
PROCESSES_MIB = 25 + 100 + 25 + 40 + 50
PER_VCPU_MIB = 8  # "8 MiB per vCPU"
IOTHREAD_MIB = 8  # "static overhead for IOThread"
VIDEO_MIB = 32  # unless autoattachGraphicsDevice is false
DEDICATED_MIB = 100  # dedicated CPUs or guaranteed QoS


def overhead_mib(guest: Guest) -> float:
    """KubeVirt's own estimate of what virt-launcher needs beside the guest's memory (the parts a manifest tells)."""
    spec = spec_of(guest)
    assert spec is not None
    mib = (guest.memory_kib or 0) / 1024 / 512  # page tables: one byte for every 512 of guest memory
    mib += PROCESSES_MIB + PER_VCPU_MIB * max(1, guest.vcpus or 1) + IOTHREAD_MIB
    if spec.get("domain.devices.autoattachGraphicsDevice") is not False:
        mib += VIDEO_MIB
    if dedicated_cpus(spec):
        mib += DEDICATED_MIB
    return mib


class GuestOverheadNotRequested(GuestRule):
    id = "KVM-KUB-011"
    slug = "kubevirt-guest-overhead-not-requested"
    topic = "memory-overcommit"
    severity = Severity.MEDIUM
    title = "KubeVirt VM's pod does not request virt-launcher's memory overhead (overcommitGuestOverhead)"
    why = (
        "Every VMI's pod needs memory beside the guest's: virt-launcher, virtqemud, virtlogd, QEMU itself, page "
        "tables, vCPU and video memory (KubeVirt's estimate: about 240 MiB plus 8 MiB per vCPU). KubeVirt adds it "
        "to the pod's memory request, unless resources.overcommitGuestOverhead is true: the node is then "
        "overcommitted by that much for each such VM, and a guest that uses all its memory pushes the node into "
        "reclaim and the VM's pod towards eviction or the OOM killer."
    )
    fix_kind = "manual"
    fix_description = "KubeVirt: drop resources.overcommitGuestOverhead (or set it false) unless density is the plan."
    fix_safe = True
    kubevirt = KubevirtForm("domain.resources.overcommitGuestOverhead", "false",
                            "or remove it: KubeVirt then requests the overhead")
    references = (
        "KubeVirt user guide, compute/node_overcommit.md (Overcommit the Guest Overhead): long-lived or "
        "memory-intensive VMIs 'will use all memory they are granted sooner or later'",
        "KubeVirt user guide, compute/resources_requests_and_limits.md (Memory overhead)",
        "kubevirt/kubevirt pkg/virt-controller/services/renderresources.go WithMemoryOverhead: the overhead is added "
        "to the request unless OvercommitGuestOverhead, and always to a memory limit",
        "kubevirt/kubevirt pkg/hypervisor/kvm/hypervisorbackend.go GetMemoryOverhead: the estimate",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        spec = spec_of(guest)
        if spec is None or spec.get("domain.resources.overcommitGuestOverhead") is not True:
            return
        yield self.finding(
            target=self.target(guest),
            actual=f"overcommitGuestOverhead: true (about {overhead_mib(guest):.0f} MiB of KubeVirt's estimated "
                   "overhead not requested)",
            expected="the overhead requested (overcommitGuestOverhead unset or false)",
            evidence=spec.path("domain.resources.overcommitGuestOverhead"),
            source=guest.origin,
        )
