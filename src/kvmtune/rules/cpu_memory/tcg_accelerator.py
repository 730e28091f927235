from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.audit.verifyplan import NoExperiment
from kvmtune.rules.common import low

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest


class TcgAccelerator(GuestRule):
    id = "KVM-CPU-003"
    slug = "tcg-accelerator"
    topic = "kvm-acceleration"
    severity = Severity.HIGH
    title = "Guest runs under TCG (software emulation), not KVM"
    why = (
        "With domain type='qemu' (or -accel tcg, or no accelerator on the command line) QEMU translates every "
        "guest instruction in software instead of running it on the CPU through KVM. Expect an order of "
        "magnitude: a VM test suite that took ~52 s under KVM timed out at 600 s under TCG. Seed 001 warns to "
        "expect far less without VT-x/AMD-V. This holds for every guest architecture; a guest of another "
        "architecture than the host's can only run under TCG, which is worth knowing as well."
    )
    fix_kind = "xml"
    fix_description = (
        "Set <domain type='kvm'> (on the command line: -accel kvm); the host needs VT-x/AMD-V enabled in "
        "firmware and /dev/kvm. Check first that the guest's architecture matches the host's."
    )
    fix_safe = False
    references = (
        "seed:001 (KVM without VT-x or AMD-V relies mostly on the software emulator)",
        "tailscale/tailscale#20731 (VM test: ~52 s with KVM, 600 s timeout with TCG)",
        "libvirt virt-host-validate: hardware virtualization, /dev/kvm",
    )
    verify = NoExperiment("TCG against KVM is software emulation against hardware virtualisation; the guest tier runs both "
                          "its sides under one accelerator, so it cannot put them side by side")

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        if low(guest.virt_type) != "qemu":
            return
        yield self.finding(
            target=self.target(guest),
            actual="TCG (domain type='qemu')" if guest.origin_kind != "cmdline" else "TCG (no KVM accelerator)",
            expected="KVM (domain type='kvm', -accel kvm)",
            evidence=guest.where("virt_type") or "/domain/@type",
            source=guest.origin,
        )
