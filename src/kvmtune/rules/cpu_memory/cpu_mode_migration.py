from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest


class CpuModeMigration(GuestRule):
    id = "KVM-CPU-024"
    slug = "cpu-mode-migration-tradeoff"
    topic = "cpu-model"
    severity = Severity.INFO
    title = "host-passthrough (or maximum) CPU: fastest, but live migration only to identical hosts"
    why = (
        "host-passthrough gives the guest the host CPU exactly: every feature, no masking, best performance. The "
        "guest then relies on that exact CPU (model, stepping, microcode, even the host kernel's view), so live "
        "migration works only to identical hosts and may fail or misbehave elsewhere. host-model gives nearly the "
        "same features and a definition libvirt can migrate; a named model shared by the fleet is the most portable."
    )
    fix_kind = "manual"
    fix_description = (
        "Keep host-passthrough where guests never migrate or hosts are identical (pinned, latency-sensitive "
        "guests); use <cpu mode='host-model'/> (Nova's default) or a named model every host supports "
        "(<cpu mode='custom'><model>…) where guests move between different hosts. Not automatic: kvmtune sees one "
        "host and cannot know where a guest migrates."
    )
    references = (
        "libvirt formatdomain 'CPU model and topology': mode host-passthrough, host-model, custom, maximum",
        "OpenStack Nova configuration: [libvirt] cpu_mode (host-model default), cpu_models",
        "RHEL 9 'Configuring and managing virtualization': 'Live migration limitations' (host-passthrough)",
        "Proxmox VE admin guide 'CPU Type': host vs the default x86-64-v2-AES for migration",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        mode = guest.cpu_mode
        if mode not in ("host-passthrough", "maximum"):
            return
        yield self.finding(
            target=self.target(guest),
            actual=f"cpu mode={mode}",
            expected="host-passthrough only between identical hosts; host-model or a shared named model to migrate",
            evidence=guest.where("cpu") or "/domain/cpu/@mode",
            source=guest.origin,
        )
