from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.rules.host import HostFactsRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.host.facts import HostFacts


class TunDeviceMissing(HostFactsRule):
    id = "KVM-HST-003"
    slug = "tun-device-missing"
    topic = "host-devices"
    severity = Severity.HIGH
    title = "/dev/net/tun is missing: guests cannot get tap, bridge or NAT networking"
    why = (
        "QEMU opens /dev/net/tun to create the tap device behind every bridged or NAT guest NIC; without it "
        "only user-mode (SLIRP) networking is left, the slowest backend. virt-host-validate fails this check."
    )
    fix_kind = "manual"
    fix_description = (
        "modprobe tun (and make sure /dev/net/tun exists, e.g. via kmod static-nodes)."
        " Not automatic: kvmtune fix writes files and values it can put back; it does not load kernel modules."
    )
    fix_safe = True
    references = (
        "libvirt tools/virt-host-validate-qemu.c: \"Load the 'tun' module to enable networking for QEMU guests\"",
        "seed:000 (Best practice: use the tap networking option in QEMU)",
    )

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        if facts.device_exists("/dev/net/tun"):
            return
        yield self.finding(
            target=self.at(ctx, "/dev/net/tun"),
            actual="absent",
            expected="/dev/net/tun present (tun module)",
            evidence="/dev/net/tun",
        )
