from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.audit.verifyplan import NIC_MQ_JOB, GuestExperiment
from kvmtune.kubevirt.form import no_field
from kvmtune.rules.common import low

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest

RING = 1024  # the largest virtio-net ring QEMU accepts, and what Nova and the NFV tuning guides set


class VirtioNetRingSize(GuestRule):
    id = "KVM-NET-021"
    slug = "virtio-net-ring-size"
    topic = "net-multiqueue"
    judges_only = "nics"
    severity = Severity.LOW
    title = "Throughput NIC (multiqueue or vhost-user) keeps virtio-net's default 256-entry rings"
    why = (
        "A virtio-net ring of 256 descriptors fills in a few tens of microseconds at 10 Gbit/s: a vCPU or the "
        "vhost thread that is scheduled out that long drops packets. rx_queue_size=1024 (and tx_queue_size=1024 "
        "on vhost-user, the only backend QEMU lets go above 256 for tx) absorbs those bursts for a little memory."
    )
    fix_kind = "xml"
    fix_description = (
        "<driver rx_queue_size='1024'/> (vhost-user: also tx_queue_size='1024'); guest-visible ring size, takes "
        "effect at the next guest start."
    )
    fix_safe = True
    references = (
        "libvirt formatdomain 'Setting NIC driver-specific options': rx_queue_size (2.3.0), tx_queue_size (3.7.0)",
        "OpenStack Nova configuration: [libvirt] rx_queue_size, tx_queue_size (256, 512, 1024)",
        "QEMU hw/net/virtio-net.c: tx_queue_size above 256 only with a vhost-user peer",
        "RHEL 9 'Configuring and managing virtualization': 'Optimizing virtual machine network performance'",
    )
    kubevirt = no_field("a VirtualMachine has no field for virtio-net ring sizes")
    verify = GuestExperiment("nic", NIC_MQ_JOB, note="larger rings absorb line-rate bursts; a tap in a namespace seldom "
                             "fills 256 entries, so a probe guest may show no effect where a loaded host would")

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        for nic in guest.nics:
            if low(nic.model) != "virtio":
                continue
            vhost_user = nic.type == "vhostuser"
            if not vhost_user and (nic.queues or 1) < 2:
                continue  # a single-queue NIC does not ask for throughput
            rx_small = (nic.rx_queue_size or 256) < RING
            tx_small = vhost_user and (nic.tx_queue_size or 256) < RING
            if not rx_small and not tx_small:
                continue
            actual = [f"rx_queue_size={nic.rx_queue_size or 'unset (256)'}"]
            if vhost_user:
                actual.append(f"tx_queue_size={nic.tx_queue_size or 'unset (256)'}")
            yield self.finding(
                target=self.target(guest, nic.label),
                actual=", ".join(actual) + (" on vhost-user" if vhost_user else f" on {nic.queues} queues"),
                expected=f"rx_queue_size={RING}" + (f", tx_queue_size={RING}" if vhost_user else ""),
                evidence=nic.where("rx_queue_size" if rx_small else "tx_queue_size"),
                source=guest.origin,
            )
