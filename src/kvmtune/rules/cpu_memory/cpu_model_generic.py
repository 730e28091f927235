from __future__ import annotations

from collections.abc import Iterator

from kvmtune.audit.context import AuditContext
from kvmtune.audit.finding import Finding, Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.audit.verifyplan import GUEST_TIER, NoExperiment
from kvmtune.model.guest import Guest
from kvmtune.proxmox.qmset import PveForm
from kvmtune.rules.common import low

# QEMU's generic and legacy x86 models: none has AVX, AES-NI or x2apic (target/i386/cpu.c builtin_x86_defs)
GENERIC_MODELS = {
    "qemu64", "kvm64", "qemu32", "kvm32", "486", "pentium", "pentium2", "pentium3", "athlon", "phenom",
    "coreduo", "core2duo", "n270",
}


class CpuModelGeneric(GuestRule):
    id = "KVM-CPU-001"
    slug = "cpu-model-generic"
    topic = "cpu-model"
    severity = Severity.MEDIUM
    title = "KVM guest gets a generic or legacy CPU model (qemu64, kvm64, core2duo, ...): no AVX, AES-NI"
    why = (
        "qemu64 and kvm64 describe a 2003-era x86-64 CPU: the guest sees no AVX/AVX2, AES-NI, PCLMUL, "
        "x2apic or newer instructions, so crypto, compression and vectorised code fall back to slow paths. "
        "A domain without <cpu> gets qemu64 too. host-passthrough exposes the real CPU; host-model or a "
        "named model keeps live migration possible across hosts."
    )
    fix_kind = "xml"
    fix_description = (
        "Set <cpu mode='host-passthrough'/> when guests stay on identical hosts, else <cpu mode='host-model'/> "
        "or a named model the whole cluster supports (e.g. x86-64-v3 or a Skylake/EPYC model)."
    )
    fix_safe = False
    # the same fix as 'qm set' (proxmox/qmset.py)
    pve = PveForm("set", "Hardware > Processors > Type: x86-64-v2-AES (or host)", (("cpu", "x86-64-v2-AES"),), guest_visible=True)
    references = (
        "seed:000 (x2apic via -cpu qemu64,+x2apic gave 2-5 % on I/O workloads: the generic model lacks it)",
        "libvirt formatdomain: CPU model and topology (host-passthrough, host-model)",
        "nova [libvirt]cpu_mode default host-model; Proxmox: UI default x86-64-v2-AES instead of kvm64",
    )
    verify = NoExperiment("CPU model " + GUEST_TIER)

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        if not guest.is_x86 or low(guest.virt_type) != "kvm":
            return
        mode, model = low(guest.cpu_mode), low(guest.cpu_model)
        if mode in ("host-passthrough", "host-model", "maximum"):
            return
        if model in GENERIC_MODELS:
            actual = model
        elif model is None:
            actual = "no CPU model (QEMU default: qemu64)"
        else:
            return
        yield self.finding(
            target=self.target(guest, "cpu"),
            actual=actual,
            expected="host-passthrough, host-model or a named modern model",
            evidence=("/domain/cpu/model" if model and guest.origin_kind != "cmdline" else guest.where("cpu")) or "/domain/cpu",
            source=guest.origin,
        )
