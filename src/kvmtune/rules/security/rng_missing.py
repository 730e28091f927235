from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.audit.verifyplan import NoExperiment
from kvmtune.kubevirt.form import KubevirtForm
from kvmtune.proxmox.qmset import PveForm

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest


class RngMissing(GuestRule):
    id = "KVM-SEC-001"
    slug = "rng-missing"
    topic = "rng-device"
    severity = Severity.LOW
    title = "No virtio-rng device: the guest must gather its own entropy at boot"
    why = (
        "A fresh guest has few sources of randomness (no keyboard, no disk timings worth the name), so early "
        "in boot its kernel RNG may not be initialised when sshd, TLS or key generation first need it: boots "
        "stall or, on old kernels, keys get weak. virtio-rng feeds it from the host's RNG. Seed 000 warns of "
        "cloned and weak keys on virtual machines for this reason."
    )
    fix_kind = "xml"
    fix_description = (
        "Add <rng model='virtio'><backend model='random'>/dev/urandom</backend></rng> (or <backend model='builtin'/>)."
    )
    fix_safe = True
    # the same fix as 'qm set' (proxmox/qmset.py)
    kubevirt = KubevirtForm("domain.devices.rng", "{}", setting={})
    pve = PveForm("set", "Hardware > Add > VirtIO RNG (source /dev/urandom)", (("rng0", "source=/dev/urandom"),))
    references = (
        "seed:000 (security key strength: entropy on virtual machines, keys or entropy must not be cloned)",
        "libvirt formatdomain: random number generator device",
    )
    verify = NoExperiment("an RNG device's effect is guest entropy; not a speed setting")
    rests_on_absence = True

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        if guest.rngs:
            return
        yield self.finding(
            target=self.target(guest, "rng"),
            actual="no <rng> device",
            expected="<rng model='virtio'> with /dev/urandom or builtin",
            evidence="/domain/devices/rng" if guest.origin_kind != "cmdline" else "-device virtio-rng-*",
            source=guest.origin,
        )
