from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.rules.host import HostFactsRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.host.facts import HostFacts

LOW_BITS = 200


class EntropyLow(HostFactsRule):
    id = "KVM-HST-017"
    slug = "entropy-low"
    topic = "entropy"
    severity = Severity.MEDIUM
    also_severities = (Severity.INFO,)  # what some findings are raised or lowered to
    title = "The host's entropy pool is nearly empty"
    why = (
        "On kernels with the old blocking /dev/random (a 4096-bit pool), reads block when entropy_avail runs "
        "low. A virtio-rng device backed by /dev/random (QEMU's default) then stalls guests that wait for "
        "randomness, typically at boot when generating SSH and TLS keys; seed 000 advises checking "
        "entropy_avail before keys are generated."
    )
    fix_kind = "manual"
    fix_description = (
        "Run rngd (rng-tools) fed by the CPU's RDRAND or a hardware RNG on the host, and back guest virtio-rng "
        "devices with /dev/urandom or the builtin backend."
    )
    fix_safe = True
    references = (
        "seed:000 (Assess the quantity of kernel entropy available: /proc/sys/kernel/random/entropy_avail)",
        "libvirt formatdomain: rng backend (default /dev/random, /dev/urandom recommended)",
        "Linux 5.6: /dev/random no longer blocks after CRNG init; 5.18 random.c rework: entropy_avail fixed at 256",
    )

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        avail = facts.entropy_avail
        pool = facts.entropy_poolsize
        if avail is None or avail >= LOW_BITS:
            return
        if pool is not None and pool <= 256 and (facts.kernel_version or (0, 0)) >= (5, 18):
            return  # new random driver: the count is not a blocking threshold
        kv = facts.kernel_version
        # 5.6 made /dev/random stop blocking once the CRNG is initialised: low counts matter little then
        sev = Severity.INFO if kv is not None and kv >= (5, 6) else Severity.MEDIUM
        yield self.finding(
            target=self.at(ctx, "entropy"),
            severity=sev,
            actual=f"{avail} bits available" + (f" of a {pool}-bit pool" if pool else ""),
            expected=f"≥ {LOW_BITS} bits (an rngd feeding the pool)",
            evidence="/proc/sys/kernel/random/entropy_avail, /proc/sys/kernel/random/poolsize",
        )
