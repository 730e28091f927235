from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest

LOW_BITS = 200  # as the host rule KVM-HST-006 counts: below this, a blocking read may wait
FIXED_POOL_KERNEL = (5, 18)  # from 5.18 entropy_avail always says 256: the count means nothing


def _kernel(release: str | None) -> tuple[int, int] | None:
    if not release:
        return None
    parts = release.split(".", 2)
    if len(parts) < 2 or not parts[0].isdigit():
        return None
    minor = "".join(ch for ch in parts[1] if ch.isdigit())
    return (int(parts[0]), int(minor)) if minor else None


class GuestEntropySource(GuestRule):
    id = "KVM-INS-003"
    slug = "guest-entropy-source"
    topic = "entropy"
    judges_only = "inside"
    severity = Severity.MEDIUM
    also_severities = (Severity.LOW,)
    title = "The guest's hardware RNG is not bound to virtio-rng"
    why = (
        "A virtio-rng device feeds the guest's entropy pool from the host. Present but not bound (no virtio_rng "
        "driver), it does nothing; absent, a guest kernel older than 5.18 with a starved pool blocks key "
        "generation and TLS at boot."
    )
    fix_kind = "manual"
    fix_description = (
        "Inside the guest: load virtio_rng (modprobe virtio_rng; make it lasting in /etc/modules-load.d) and "
        "check /sys/devices/virtual/misc/hw_random/rng_current. Without a device, add <rng model='virtio'> "
        "(KVM-SEC-001). kvmtune never writes inside a guest."
    )
    references = (
        "seed:000 'Best practice: Assess quantity of kernel entropy available just before generating keys'",
        "libvirt formatdomain 'Random number generator device' (<rng model='virtio'>)",
        "Linux Documentation/admin-guide/hw_random.rst: rng_current, rng_available",
        "Linux 5.18 random.c rework: entropy_avail fixed at 256",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        inside = guest.inside
        if inside is None or not inside.is_linux:
            return
        bound = (inside.rng_current or "").startswith("virtio_rng")
        if bound:
            return
        evidence = f"guest agent ({inside.via}): /sys/devices/virtual/misc/hw_random/rng_current"
        if any((rng.model or "virtio") == "virtio" for rng in guest.rngs):
            yield self.finding(
                target=self.target(guest, "guest-rng"),
                actual=f"virtio-rng device given, guest's rng_current: {inside.rng_current or 'none'}",
                expected="virtio_rng.N",
                evidence=evidence,
                source=guest.origin,
            )
            return
        kernel = _kernel(inside.kernel_release)
        if (inside.entropy_avail is not None and inside.entropy_avail < LOW_BITS
                and kernel is not None and kernel < FIXED_POOL_KERNEL):
            yield self.finding(
                target=self.target(guest, "guest-rng"),
                actual=f"no hardware RNG bound, entropy_avail {inside.entropy_avail} on kernel {inside.kernel_release}",
                expected=f"a virtio-rng device bound to virtio_rng, or ≥ {LOW_BITS} bits",
                evidence=evidence + ", /proc/sys/kernel/random/entropy_avail",
                severity=Severity.LOW,
                source=guest.origin,
            )
