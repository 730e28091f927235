from __future__ import annotations

import os
from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.rules.host import HostFactsRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.host.facts import HostFacts


class KvmAccelerationUnavailable(HostFactsRule):
    id = "KVM-HST-001"
    slug = "kvm-acceleration-unavailable"
    topic = "kvm-acceleration"
    severity = Severity.CRITICAL
    also_severities = (Severity.HIGH,)  # what some findings are raised or lowered to
    title = "KVM acceleration is not available: guests would run under TCG emulation"
    why = (
        "Without a usable /dev/kvm, QEMU falls back to TCG, translating every guest instruction in software; "
        "virt-host-validate fails this check because 'performance will be significantly limited'."
    )
    fix_kind = "manual"
    fix_description = (
        "Enable VT-x/AMD-V in the firmware, load kvm_intel or kvm_amd, and give the user running QEMU "
        "read-write access to /dev/kvm (group kvm)."
        " Not automatic: firmware settings and module loading are outside what kvmtune fix changes."
    )
    references = (
        "libvirt tools/virt-host-validate-qemu.c: hardware virtualization, /dev/kvm exists, /dev/kvm accessible",
        "Linux Documentation/virt/kvm/api.rst: KVM_GET_API_VERSION, KVM_CREATE_VM",
    )

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        flag = facts.cpu_vendor_virt_flag
        flags_known = facts.cpu_flags is not None
        if not facts.device_exists("/dev/kvm"):
            if flags_known and flag is None:
                cause = "the CPU shows no vmx/svm flag (disabled in firmware, or a guest without nested virtualization)"
            elif flag:
                cause = f"the CPU has '{flag}', so the kvm_intel/kvm_amd module is not loaded"
            else:
                cause = "the CPU flags could not be read"
            yield self.finding(
                target=self.at(ctx, "/dev/kvm"),
                actual=f"/dev/kvm absent; {cause}",
                expected="/dev/kvm present (CPU virtualization extensions on, kvm module loaded)",
                evidence="/dev/kvm, /proc/cpuinfo flags",
            )
            return
        if facts.device_accessible("/dev/kvm") is False:
            yield self.finding(
                target=self.at(ctx, "/dev/kvm"),
                severity=Severity.HIGH,
                actual=f"/dev/kvm not readable and writable by uid {os.getuid()}",
                expected="read-write for the user that runs QEMU (usually group kvm)",
                evidence="access(/dev/kvm, R_OK|W_OK)",
                summary="/dev/kvm exists but this user cannot open it",
            )
            return
        probe = facts.kvm_probe
        if probe is not None and probe.opened and not probe.vm_created:
            yield self.finding(
                target=self.at(ctx, "/dev/kvm"),
                actual=probe.detail,
                expected="KVM_CREATE_VM succeeds",
                evidence="ioctl(/dev/kvm, KVM_GET_API_VERSION / KVM_CREATE_VM)",
                summary="/dev/kvm is present but the kernel refuses to create a VM",
            )
            return
        # /dev/kvm opens, but only a booted guest proves KVM works: the cached `kvmtune guest accel`
        # verdict is the strongest evidence, then the CPU's virtualization flag.
        verdict = facts.accel_verdict
        if verdict is not None and verdict.accel == "tcg":
            yield self.finding(
                target=self.at(ctx, "/dev/kvm"),
                actual=f"'kvmtune guest accel' found KVM unusable: {verdict.reason}",
                expected="a guest boots under KVM",
                evidence=f"{verdict.path} ({verdict.age_s / 3600:.1f} h old; 'kvmtune guest accel --no-cache' asks again)",
                summary="KVM does not boot a guest on this host: guests run under TCG emulation",
            )
        elif verdict is None and flags_known and flag is None:
            yield self.finding(
                target=self.at(ctx, "/dev/kvm"),
                actual="/dev/kvm present, but the CPU shows no vmx/svm flag (no hardware virtualization: "
                "a guest without nested virtualization, or disabled in firmware)",
                expected="vmx (Intel VT-x) or svm (AMD-V) in the CPU flags",
                evidence=f"{facts.where('/proc/cpuinfo')} flags; 'kvmtune guest accel' boots a guest to confirm",
                summary="No hardware virtualization: guests would run under TCG emulation",
            )
