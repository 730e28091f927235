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


class NetBackendUser(GuestRule):
    id = "KVM-NET-003"
    slug = "net-backend-user"
    topic = "net-backend"
    judges_only = "nics"
    severity = Severity.HIGH
    also_severities = (Severity.MEDIUM,)  # what some findings are raised or lowered to
    title = "NIC uses user-mode networking (SLIRP or passt): a TCP/IP stack in userspace, not a real link"
    why = (
        "User-mode networking re-terminates every guest connection in a userspace TCP/IP stack and replays it "
        "with host sockets. It needs no privileges, but it is slow and the guest cannot be reached without "
        "port forwards. libslirp carried about 1.07 Gbit/s at MTU 1500 in slirp4netns' own benchmark, where a "
        "tap with vhost-net reaches tens of Gbit/s. passt is much faster than SLIRP but still translates "
        "every flow in userspace."
    )
    fix_kind = "manual"
    fix_description = (
        "Attach the NIC to a bridge (<interface type='bridge'>), a libvirt network or macvtap; for unprivileged "
        "guests prefer passt over SLIRP, ideally with the vhost-user backend."
        " Not automatic: which bridge or network the guest belongs on is a site decision."
    )
    fix_safe = False
    references = (
        "seed:000 (user networking: QEMU as gateway and firewall; use tap for full networking)",
        "rootless-containers/slirp4netns#20 (libslirp 1.07 Gbit/s at MTU 1500)",
        "libvirt formatdomain: userspace connection (SLIRP or passt backend)",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        for nic in guest.nics:
            if low(nic.type) != "user":
                continue
            passt = low(nic.backend) == "passt"
            yield self.finding(
                target=self.target(guest, nic.label),
                actual="user-mode, passt backend" if passt else "user-mode, SLIRP",
                expected="tap on a bridge/network or macvtap, with vhost-net",
                evidence=nic.where("type"),
                source=guest.origin,
                severity=Severity.MEDIUM if passt else None,
                summary="NIC uses passt user-mode networking: every flow is translated in userspace" if passt else None,
            )
