from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.kubevirt.guest import spec_of

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest

# a tuning field -> where KubeVirt reads it (relative to the VMI spec) and the topic it is about
HOME = {
    "ioThreadsPolicy": ("domain", "iothreads"),
    "blockMultiQueue": ("domain.devices", "iothreads"),
    "networkInterfaceMultiqueue": ("domain.devices", "net-multiqueue"),
    "dedicatedCpuPlacement": ("domain.cpu", "vcpu-pinning"),
    "isolateEmulatorThread": ("domain.cpu", "vcpu-pinning"),
    "hugepages": ("domain.memory", "hugepages"),
    "dedicatedIOThread": ("domain.devices.disks[]", "iothreads"),
}
# the places looked in: the VMI spec and its domain's mappings a misplaced field lands in
PLACES = ("", "domain", "domain.cpu", "domain.devices", "domain.memory", "domain.resources")


class MisplacedField(GuestRule):
    id = "KVM-KUB-004"
    slug = "kubevirt-misplaced-field"
    topic = "iothreads"  # each finding carries the topic of the setting it was meant to be
    severity = Severity.HIGH
    title = "KubeVirt tuning field written where KubeVirt does not read it: the setting never applies"
    why = (
        "A VirtualMachine's tuning fields are read at one place each (ioThreadsPolicy under domain, "
        "blockMultiQueue under domain.devices, dedicatedCpuPlacement under domain.cpu, hugepages under "
        "domain.memory). Written one level off, the API server may prune it or keep it unread, and the VM "
        "runs without it while the manifest reads as tuned."
    )
    fix_kind = "manual"
    fix_description = "KubeVirt: move the field to where KubeVirt reads it (restart)."
    fix_safe = True
    references = (
        "KubeVirt API reference: DomainSpec (ioThreadsPolicy), Devices (blockMultiQueue, "
        "networkInterfaceMultiqueue), CPU (dedicatedCpuPlacement, isolateEmulatorThread), Memory (hugepages)",
        "KubeVirt user guide, storage/disks_and_volumes.md and compute/dedicated_cpu_resources.md",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        spec = spec_of(guest)
        if spec is None:
            return
        for place in PLACES:
            here: Any = spec.vmi if not place else spec.get(place)
            if not isinstance(here, dict):
                continue
            for key, (home, topic) in HOME.items():
                if key not in here or home == place:
                    continue
                finding = self.finding(
                    target=self.target(guest),
                    actual=f"{key} under {spec.path(place)}",
                    expected=f"{key} under {spec.path(home)}",
                    evidence=f"{spec.path(place)}.{key}" if place else f"{spec.base}.{key}",
                    source=guest.origin,
                )
                finding.topic = topic
                yield finding
