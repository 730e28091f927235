from __future__ import annotations

import re
from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.audit.verifyplan import NoExperiment
from kvmtune.proxmox.qmset import PveForm
from kvmtune.rules.common import low

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest

# QEMU's named x86 CPU models and the instruction-set extensions among their features that decide this rule
# (target/i386/cpu.c builtin_x86_defs; x86-64-vN: the psABI micro-architecture levels). The rule judges a
# model by this table, not by its name: every model without AVX is legacy. Variants (-v2, -IBRS, -noTSX,
# -IBPB) keep their base model's extensions.
_ = frozenset[str]
NONE: _ = frozenset()
SSE42: _ = frozenset({"sse4.2"})
AES: _ = frozenset({"sse4.2", "aes"})
AVX: _ = frozenset({"sse4.2", "aes", "avx"})
AVX2: _ = frozenset({"sse4.2", "aes", "avx", "avx2"})
AVX512: _ = frozenset({"sse4.2", "aes", "avx", "avx2", "avx512f"})
MODEL_FEATURES: dict[str, frozenset[str]] = {
    # generic and pre-x86-64-v2 models: at most SSE3/SSSE3/SSE4.1/SSE4a
    "486": NONE, "pentium": NONE, "pentium2": NONE, "pentium3": NONE, "athlon": NONE, "phenom": NONE,
    "coreduo": NONE, "core2duo": NONE, "n270": NONE, "qemu32": NONE, "kvm32": NONE, "qemu64": NONE,
    "kvm64": NONE, "conroe": NONE, "penryn": NONE, "opteron_g1": NONE, "opteron_g2": NONE,
    "opteron_g3": NONE, "x86-64-v1": NONE,
    # SSE4.2 (and AES-NI), still no AVX
    "nehalem": SSE42, "x86-64-v2": SSE42, "westmere": AES, "x86-64-v2-aes": AES, "snowridge": AES,
    "denverton": AES,
    # AVX and later
    "sandybridge": AVX, "ivybridge": AVX, "opteron_g4": AVX, "opteron_g5": AVX,
    "haswell": AVX2, "broadwell": AVX2, "skylake-client": AVX2, "epyc": AVX2, "epyc-rome": AVX2,
    "epyc-milan": AVX2, "dhyana": AVX2, "sierraforest": AVX2, "clearwaterforest": AVX2, "yongfeng": AVX2,
    "x86-64-v3": AVX2,
    "skylake-server": AVX512, "cascadelake-server": AVX512, "cooperlake": AVX512, "icelake-client": AVX512,
    "icelake-server": AVX512, "sapphirerapids": AVX512, "graniterapids": AVX512, "knightsmill": AVX512,
    "epyc-genoa": AVX512, "epyc-turin": AVX512, "x86-64-v4": AVX512,
}
# the generic models (and QEMU's default): reported by their name alone
GENERIC_MODELS = {
    "qemu64", "kvm64", "qemu32", "kvm32", "486", "pentium", "pentium2", "pentium3", "athlon", "phenom",
    "coreduo", "core2duo", "n270",
}
_VARIANT = re.compile(r"(-v\d+|-ibrs|-ibpb|-notsx)+$")


def model_features(model: str) -> frozenset[str] | None:
    """The table's extensions for a model name or a variant of it (``westmere-ibrs``, ``epyc-rome-v2``)."""
    found = MODEL_FEATURES.get(model)
    return found if found is not None else MODEL_FEATURES.get(_VARIANT.sub("", model))


class CpuModelGeneric(GuestRule):
    id = "KVM-CPU-001"
    slug = "cpu-model-generic"
    topic = "cpu-model"
    severity = Severity.MEDIUM
    title = "KVM guest gets a generic or legacy CPU model (qemu64, kvm64, Westmere, ...): no AVX"
    why = (
        "qemu64 and kvm64 describe a 2003-era x86-64 CPU: the guest sees no AVX/AVX2, AES-NI, PCLMUL, "
        "x2apic or newer instructions, so crypto, compression and vectorised code fall back to slow paths. "
        "A domain without <cpu> gets qemu64 too. Named models of the pre-AVX era (Conroe, Penryn, Nehalem, "
        "Westmere, Opteron_G1-G3) hide the same: the host's AVX units stay unused. host-passthrough exposes "
        "the real CPU; host-model or a named model keeps live migration possible across hosts."
    )
    fix_kind = "xml"
    fix_description = (
        "Set <cpu mode='host-passthrough'/> when guests stay on identical hosts, else <cpu mode='host-model'/> "
        "or a named model the whole cluster supports (e.g. x86-64-v3 or a Skylake/EPYC model)."
    )
    fix_safe = False
    # the same fix as 'qm set' (proxmox/qmset.py)
    # x86-64-v3, never the x86-64-v2-AES this rule flags (proxmox/qmset.py _cpu); needs --allow-cpu-change
    pve = PveForm("cpu", "Hardware > Processors > Type: x86-64-v3 (or host)")
    references = (
        "seed:000 (x2apic via -cpu qemu64,+x2apic gave 2-5 % on I/O workloads: the generic model lacks it)",
        "libvirt formatdomain: CPU model and topology (host-passthrough, host-model)",
        "QEMU target/i386/cpu.c builtin_x86_defs: each named model's features (AVX from SandyBridge and "
        "Opteron_G4 on); QEMU docs/system/cpu-models-x86: x86-64-v2/v3/v4 ABI levels",
        "nova [libvirt]cpu_mode default host-model; Proxmox: UI default x86-64-v2-AES instead of kvm64",
    )
    verify = NoExperiment("the CPU model decides which host CPU features (AVX, AES-NI, …) the guest's own code may use; "
                          "the probe guest's fio and netload barely use them, and TCG emulates a CPU of its own")

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        if not guest.is_x86 or low(guest.virt_type) != "kvm":
            return
        mode, model = low(guest.cpu_mode), low(guest.cpu_model)
        if mode in ("host-passthrough", "host-model", "maximum"):
            return
        if model is None:
            actual = "no CPU model (QEMU default: qemu64)"
        elif (features := model_features(model)) is None or "avx" in features:
            return  # a model the table does not know, or one with AVX
        elif model in GENERIC_MODELS:
            actual = model
        else:
            has = ", ".join(sorted(f.upper() for f in features)) or "no SSE4.2"
            actual = f"{model}: a legacy named model ({has}; no AVX)"
        yield self.finding(
            target=self.target(guest, "cpu"),
            actual=actual,
            expected="host-passthrough, host-model or a named modern model",
            evidence=("/domain/cpu/model" if model and guest.origin_kind != "cmdline" else guest.where("cpu")) or "/domain/cpu",
            source=guest.origin,
        )
