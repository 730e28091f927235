from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.audit.verifyplan import NoExperiment
from kvmtune.domain.cputune import cpu_layout

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest

WANTED = ("require", "force")


class InvtscMigratable(GuestRule):
    id = "KVM-CPU-025"
    slug = "invtsc-without-migratable-off"
    topic = "cpu-model"
    severity = Severity.LOW
    title = "invtsc is required but the host-passthrough CPU is still declared migratable"
    why = (
        "The invariant TSC flag tells the guest its TSC is a reliable clock source (Windows and latency-sensitive "
        "Linux guests use it). QEMU treats invtsc as non-migratable: with a migratable host-passthrough CPU "
        "(libvirt's default, migratable='on') it is filtered or blocks migration. Saying migratable='off' "
        "states the trade-off the guest has already made: it keeps invtsc and all host features and cannot be "
        "live-migrated."
    )
    fix_kind = "xml"
    fix_description = (
        "<cpu mode='host-passthrough' migratable='off'> (needs a guest restart; the guest can no longer be "
        "live-migrated). Or drop the invtsc feature if the guest must migrate."
    )
    fix_safe = False
    references = (
        "libvirt formatdomain 'CPU model and topology': host-passthrough migratable attribute (since 6.5.0)",
        "QEMU target/i386: invtsc is a migration blocker unless the CPU is not migratable",
        "RHEL 9 Optimizing virtual machine performance: CPU models and live migration",
    )
    verify = NoExperiment("migratable='off' decides whether the guest may migrate (and so may see invtsc), not how "
                          "fast it runs; nothing to measure")

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        if guest.cpu_mode not in ("host-passthrough", "maximum"):
            return
        layout = cpu_layout(guest)
        if layout is None or layout.features.get("invtsc") not in WANTED or layout.migratable == "off":
            return
        yield self.finding(
            target=self.target(guest, "cpu"),
            actual=f"mode={guest.cpu_mode}, migratable={layout.migratable or 'on (default)'}, invtsc required",
            expected="migratable='off' (or no invtsc if the guest must migrate)",
            evidence="/domain/cpu/@migratable, /domain/cpu/feature[@name='invtsc']",
            source=guest.origin,
        )
