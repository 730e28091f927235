from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.rules.common import low

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest

DEFAULT_NAT_BRIDGE = "virbr0"


class NetBackendNat(GuestRule):
    id = "KVM-NET-004"
    slug = "net-backend-nat"
    topic = "net-backend"
    judges_only = "nics"
    severity = Severity.MEDIUM
    title = "NIC is on libvirt's 'default' network, normally NAT behind virbr0"
    why = (
        "libvirt's 'default' network routes guests through NAT: every packet to or from outside the host passes "
        "the host's netfilter connection tracking and address translation, which costs CPU and latency, and "
        "outside systems cannot open connections to the guest without port forwards. Seed 002 lists these "
        "costs for the distribution default; Proxmox calls NAT much slower than bridged and fit for testing."
    )
    fix_kind = "manual"
    fix_description = (
        "For guests that serve traffic, attach them to a host bridge (<interface type='bridge'><source "
        "bridge='br0'/>) or a libvirt network in bridge mode; keep NAT for desktops and labs."
        " Not automatic: which bridge the guest belongs on is a site decision."
    )
    fix_safe = False
    references = (
        "seed:002 (KVM default NAT-based networking: extra overhead, not reachable from outside)",
        "Proxmox pve-docs qm.adoc: NAT much slower than bridged, for testing",
        "libvirt formatnetwork: forward mode='nat'",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        for nic in guest.nics:
            kind, source = low(nic.type), nic.source
            if kind == "network" and source == "default":
                actual = "network 'default' (NAT unless redefined)"
            elif source == DEFAULT_NAT_BRIDGE and kind in ("bridge", "ethernet"):
                actual = f"bridge {DEFAULT_NAT_BRIDGE} (the NAT bridge of network 'default')"
            else:
                continue
            yield self.finding(
                target=self.target(guest, nic.label),
                actual=actual,
                expected="a host bridge or a bridge-mode network for serving guests",
                evidence=nic.where("type"),
                source=guest.origin,
                confidence="likely",
            )
