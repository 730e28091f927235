from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.audit.verifyplan import NIC_MQ_JOB, GuestExperiment
from kvmtune.kubevirt.form import KubevirtForm
from kvmtune.proxmox.qmset import PveForm
from kvmtune.rules.common import is_virtio_model, on_tap, vhost_off

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest


class NetMultiqueueMissing(GuestRule):
    id = "KVM-NET-008"
    slug = "net-multiqueue-missing"
    topic = "net-multiqueue"
    judges_only = "nics"
    severity = Severity.LOW
    title = "virtio NIC queues do not match the vCPUs (single queue on a multi-vCPU guest, or more queues than vCPUs)"
    why = (
        "A single-queue virtio-net NIC handles all receive and transmit work of the guest on one vCPU and one "
        "vhost thread; with queues = vCPUs each vCPU gets its own queue pair and interrupt. Queues beyond the "
        "vCPU count cannot be used and cost memory and interrupt vectors. Today's practice (nova, Proxmox) is "
        "queues = vCPUs; seed 002's era relied on RPS and bigger txqueuelen instead."
    )
    fix_kind = "xml"
    fix_description = (
        "Set <driver name='vhost' queues='N'/> with N = vCPUs (tap devices allow up to 256); guests with "
        "Linux >= 4.x enable all queues themselves, older ones need 'ethtool -L eth0 combined N'."
    )
    fix_safe = True
    kubevirt = KubevirtForm("domain.devices.networkInterfaceMultiqueue", "true", "queues = vCPUs", setting=True)
    pve = PveForm("queues", "Hardware > Network Device ({}) > Multiqueue")  # the same fix as 'qm set' (proxmox/qmset.py)
    references = (
        "libvirt formatdomain: interface driver queues (virtio-net multiqueue since 1.0.6)",
        "nova vif._get_virtio_mq_settings (queues = min(vCPUs, max tap queues))",
        "Proxmox qm.adoc: queues = vCPUs",
        "seed:002 (RPS and txqueuelen tuning for single-queue devices)",
    )
    verify = GuestExperiment("nic", NIC_MQ_JOB, note="several streams over the queue pairs; Linux guests spread them over "
                             "the vCPUs by themselves, older Windows guests may not (published figures differ in sign)")

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        vcpus = guest.vcpus or 1
        for nic in guest.nics:
            if not is_virtio_model(nic.model) or not on_tap(nic):
                continue
            if vhost_off(nic) and guest.origin_kind != "cmdline":
                continue  # libvirt's driver name='qemu' is a choice; a command line's tap has vhost off by default
                # and takes queues= all the same (-nic tap,model=virtio-net-pci, -netdev tap + -device virtio-net-*)
            queues = nic.queues
            if queues is not None and queues < 1:
                continue  # invalid; libvirt rejects it
            if vcpus >= 2 and (queues or 1) == 1:
                actual = f"1 queue, {vcpus} vCPUs"
            elif queues is not None and queues > vcpus:
                actual = f"{queues} queues, only {vcpus} vCPU(s)"
            else:
                continue
            yield self.finding(
                target=self.target(guest, nic.label),
                actual=actual,
                expected=f"queues={vcpus} (one per vCPU)",
                evidence=nic.where("queues"),
                source=guest.origin,
            )
