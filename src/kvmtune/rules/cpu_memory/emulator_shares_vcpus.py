from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.domain.cputune import cpu_layout
from kvmtune.host.parsers import format_cpu_list

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest


class EmulatorSharesVcpus(GuestRule):
    id = "KVM-CPU-021"
    slug = "emulatorpin-on-vcpu-cpus"
    topic = "vcpu-pinning"
    judges_only = "vcpu_pinned"
    severity = Severity.MEDIUM
    title = "emulatorpin or iothreadpin puts QEMU's own threads on the pinned vCPUs' CPUs"
    why = (
        "A guest's emulator thread (device emulation, QMP, migration) and its I/O threads do real work for every "
        "disk and network request. Pinned onto the same CPUs as the vCPUs, they preempt the vCPUs they serve; "
        "libvirt's emulatorpin/iothreadpin exist to keep them on separate housekeeping CPUs, as Nova's "
        "hw:emulator_threads_policy=isolate|share does."
    )
    fix_kind = "manual"
    fix_description = (
        "Pin <emulatorpin>/<iothreadpin> to host CPUs no vCPU is pinned to (housekeeping CPUs), or drop them so "
        "the threads float. Not automatic: the spare CPUs are the host's CPU plan."
    )
    fix_safe = False
    references = (
        "libvirt formatdomain 'CPU Tuning': emulatorpin, iothreadpin",
        "OpenStack Nova hw:emulator_threads_policy (isolate, share)",
        "RHEL 9 Optimizing virtual machine performance: vCPU pinning, I/O threads",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        layout = cpu_layout(guest) if guest.vcpu_pinned else None
        if layout is None or not layout.vcpupins:
            return
        vcpu_cpus = layout.vcpu_cpus
        threads = [("emulatorpin", layout.emulatorpin)] + [
            (f"iothreadpin {n}", cpus) for n, cpus in sorted(layout.iothreadpins.items())
        ]
        for what, cpus in threads:
            shared = cpus & vcpu_cpus
            if not cpus or not shared:
                continue
            yield self.finding(
                target=self.target(guest, what.replace(" ", ":")),
                actual=f"{what} cpuset {format_cpu_list(cpus)} overlaps vCPU pins on {format_cpu_list(shared)}",
                expected=f"CPUs outside the vCPUs' {format_cpu_list(vcpu_cpus)}",
                evidence="/domain/cputune/" + what.split()[0],
                source=guest.origin,
            )
