from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest


class NotKvmGuest(GuestRule):
    id = "KVM-GST-001"
    slug = "not-kvm-guest"
    topic = "kvm-acceleration"
    severity = Severity.INFO
    title = "not a KVM/QEMU guest: not audited"
    why = (
        "kvmtune's rules describe QEMU and KVM: cache modes, virtio devices, vhost-net, IOThreads. An LXC "
        "container, a Xen, bhyve, OpenVZ, Hyper-V or hvf guest, or a domain of libvirt's test driver has none of "
        "them, so no other rule judges it."
    )
    fix_kind = "manual"
    fix_description = "Nothing to change; audit this guest with its own hypervisor's tools."
    references = ("libvirt formatdomain: domain type attribute (kvm, qemu, lxc, xen, bhyve, ...)",)
    any_hypervisor = True

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        if guest.is_kvm_or_qemu:
            return
        yield self.finding(
            target=self.target(guest),
            actual=f"domain type '{guest.virt_type}'",
            expected="type 'kvm' or 'qemu'",
            evidence=guest.where("virt_type") or "/domain/@type",
            source=guest.origin,
        )
