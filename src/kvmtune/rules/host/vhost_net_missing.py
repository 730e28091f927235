from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.rules.host import HostFactsRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.host.facts import HostFacts


class VhostNetMissing(HostFactsRule):
    id = "KVM-HST-002"
    slug = "vhost-net-missing"
    topic = "vhost-net"
    severity = Severity.MEDIUM
    title = "/dev/vhost-net is missing: virtio-net runs its data path in QEMU userspace"
    why = (
        "Without vhost-net every packet of a virtio NIC crosses into the QEMU process; libvirt silently falls "
        "back to that userspace path. Seed 000 recommends vhost-net for high-bandwidth guests."
    )
    fix_kind = "manual"
    fix_description = (
        "modprobe vhost_net (and list it in /etc/modules-load.d/ so it loads at boot)."
        " Not automatic: kvmtune fix writes files and values it can put back; it does not load kernel modules."
    )
    fix_safe = True
    references = (
        "seed:000 (Best practice: use vhost-net for high-bandwidth applications)",
        "libvirt tools/virt-host-validate-qemu.c: \"Load the 'vhost_net' module to improve performance of virtio networking\"",
        "libvirt formatdomain: interface driver name='vhost' falls back silently to 'qemu'",
    )

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        if facts.device_exists("/dev/vhost-net"):
            return
        yield self.finding(
            target=self.at(ctx, "/dev/vhost-net"),
            actual="absent",
            expected="/dev/vhost-net present (vhost_net module)",
            evidence="/dev/vhost-net",
        )
