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


class RngBackendRandom(GuestRule):
    id = "KVM-SEC-002"
    slug = "rng-backend-random"
    topic = "entropy"
    judges_only = "rngs"
    severity = Severity.LOW
    title = "virtio-rng reads the host's /dev/random: can block and drain on older host kernels"
    why = (
        "On host kernels before 5.6, /dev/random blocks whenever the kernel's entropy estimate runs low, so a "
        "guest asking for randomness can stall itself and starve the host's other readers. /dev/urandom is "
        "the same cryptographic generator without the blocking; libvirt recommends it, and since libvirt 6.1 "
        "the 'builtin' backend uses getrandom(). QEMU's default for a random backend without a path is "
        "/dev/random."
    )
    fix_kind = "xml"
    fix_description = "Use <backend model='random'>/dev/urandom</backend> or <backend model='builtin'/>."
    fix_safe = True
    references = (
        "libvirt formatdomain: rng backend (QEMU default /dev/random, /dev/urandom recommended)",
        "Linux 5.6 random: /dev/random no longer blocks after CRNG initialisation",
        "seed:000 (seed /dev/urandom in guests: the 2012 alternative to a virtual RNG)",
    )
    verify = NoExperiment("the RNG backend's effect is guest entropy; not a speed setting")

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        for rng in guest.rngs:
            if low(rng.backend_model) != "random":
                continue
            source = (rng.backend_source or "").strip()
            if source not in ("", "/dev/random"):
                continue
            yield self.finding(
                target=self.target(guest, guest.rng_label(rng)),
                actual="/dev/random" if source else "random backend without a path (QEMU default: /dev/random)",
                expected="/dev/urandom or builtin",
                evidence=f"{rng.locator}/backend" if guest.origin_kind != "cmdline" else rng.locator,
                source=guest.origin,
            )
