from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.rules.common import low
from kvmtune.rules.host import gib

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest

# a guest started with less than this share of its memory left by the balloon is "far below"
FAR_BELOW = 0.5


class BalloonFarBelowMemory(GuestRule):
    id = "KVM-MEM-011"
    slug = "balloon-far-below-memory"
    topic = "balloon"
    severity = Severity.MEDIUM
    title = "Definition starts the guest with the balloon holding most of its memory (currentMemory far below memory)"
    why = (
        "<currentMemory> is the balloon's target at boot. QEMU gives the guest all of <memory>, and the balloon "
        "driver then takes back the difference as soon as it loads: a guest defined with 2 of 16 GiB sees 16 GiB "
        "in its firmware and early boot, sizes its caches and hugepage pools for that, and then runs in 2 GiB, "
        "swapping or killing processes. In a stored definition this is rarely meant; a balloon is for taking "
        "memory back from a running guest under pressure, not for defining its size."
    )
    fix_kind = "manual"
    fix_description = (
        "Make <currentMemory> equal to <memory> (or lower <memory> to what the guest should have and use "
        "<maxMemory> with memory hot-plug for growth); deflate a running guest with virsh setmem."
    )
    fix_safe = False
    references = (
        "libvirt formatdomain 'Memory Allocation': currentMemory is 'the actual allocation of memory for the "
        "guest … less than the maximum allocation, to allow for ballooning up the guests memory on the fly'",
        "libvirt formatdomain 'Memory balloon device'",
        "Proxmox VE qm.adoc 'Memory': the minimum memory a guest is ballooned down to, versus its memory",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        current, memory = guest.current_memory_kib, guest.memory_kib
        if not current or not memory or current >= memory * FAR_BELOW:
            return
        if guest.active or low(guest.memballoon) == "none":
            return  # a running guest's currentMemory is where its balloon is now; without a balloon it is ignored
        yield self.finding(
            target=self.target(guest, "memory"),
            actual=f"currentMemory {gib(current)} of {gib(memory)} ({current / memory:.0%})",
            expected="currentMemory equal to memory in a stored definition",
            evidence=guest.where("current_memory") or "/domain/currentMemory",
            source=guest.origin,
        )
