"""Which accelerator really works here: KVM only if a probe guest boots under it.

``/dev/kvm`` existing proves little (a nested, paravirtual KVM can accept the
ioctl and then never run a guest), so the probe boots the real probe guest
with ``-accel kvm`` and a short timeout, and asks QEMU over QMP whether KVM is
enabled. Until the guest's init announces itself, QMP's run state is read too:
a guest QEMU stopped in ``internal-error`` (a KVM emulation failure: a stock
kernel on a ``kvm_pvm`` host) or ``guest-panicked`` ends the probe at once, with
the KVM error and the instruction QEMU reports. Anything else means TCG, with
the reason kept for the warning. The answer is cached in the work directory per
(probe guest, QEMU, host kernel).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from kvmtune.host.facts import HostFacts
from kvmtune.host.root import HostRoot
from kvmtune.lab.accel_cache import CACHE_NAME, CACHE_TTL_S
from kvmtune.lab.guest import ProbeGuest
from kvmtune.lab.qemu import GuestRun, VmSpec, qemu_version
from kvmtune.runner import Runner


@dataclass(frozen=True)
class AccelChoice:
    accel: str  # "kvm" | "tcg"
    reason: str
    probe_s: float
    cached: bool = False

    @property
    def warning(self) -> str | None:
        if self.accel == "kvm":
            return None
        return (
            f"KVM is not usable here ({self.reason}); running under TCG emulation: "
            "numbers are emulation numbers and are never compared with KVM runs"
        )


KVM_PVM_MODULE = "/sys/module/kvm_pvm"
KVM_PVM_MEANING = ("this host's KVM is kvm_pvm (PVM: a KVM on shadow page tables, without VMX/SVM, for hosts that are "
                   "virtual machines themselves); it runs the guest kernel deprivileged and emulates its privileged "
                   "code, so only a kernel built as a PVM guest boots, and a stock kernel stops in "
                   "'KVM internal error ... emulation failure'")


def kvm_pvm_note(host: HostRoot) -> str | None:
    """What a kvm_pvm host means for guests, or None where the module is not loaded."""
    return KVM_PVM_MEANING if host.is_dir(KVM_PVM_MODULE) else None


def kvm_probe(guest: ProbeGuest, workdir: Path, runner: Runner, timeout: float = 8.0) -> AccelChoice:
    """Boot the probe guest under KVM; return kvm only if it booted and QMP says KVM is on."""
    start = time.monotonic()
    spec = VmSpec(guest=guest, accel="kvm", memory_mb=256)
    with GuestRun(spec, workdir / "run", runner, name="kvm-probe") as vm:
        vm.start()
        out = vm.follow(timeout, boot_timeout=timeout)
    took = time.monotonic() - start
    booted = any(ln.startswith("KVMTUNE-POWEROFF") for ln in out.lines)
    if out.stopped:  # QMP's run state: KVM refused the guest (internal-error) or its kernel panicked
        return AccelChoice("tcg", f"the probe guest failed under KVM after {took:.1f}s: {out.error()}", took)
    if out.timed_out:
        return AccelChoice("tcg", f"a probe guest did not boot under KVM within {timeout:.0f}s", took)
    if not booted:
        err = out.error() or "no output"
        return AccelChoice("tcg", f"the probe guest failed under KVM: {err}", took)
    if out.accel_confirmed == "tcg":
        return AccelChoice("tcg", "QEMU reports KVM disabled for the probe guest", took)
    return AccelChoice("kvm", f"probe guest booted under KVM in {took:.1f}s", took)


def detect_accel(
    guest: ProbeGuest,
    workdir: Path,
    runner: Runner,
    host: HostRoot | None = None,
    timeout: float = 8.0,
    use_cache: bool = True,
) -> AccelChoice:
    host = host or HostRoot()
    if not host.exists("/dev/kvm"):
        return AccelChoice("tcg", "/dev/kvm is absent", 0.0)
    if not host.access("/dev/kvm", 6):  # R_OK | W_OK
        return AccelChoice("tcg", "/dev/kvm is not readable and writable by this user", 0.0)
    osrel = HostFacts(host).kernel_release or ""
    key = f"{guest.key}|{qemu_version(runner)}|{osrel}"
    cache = workdir / CACHE_NAME
    if use_cache:
        try:
            data = json.loads(cache.read_text())
            if data.get("key") == key and time.time() - float(data.get("at", 0)) < CACHE_TTL_S:
                c = data["choice"]
                return AccelChoice(c["accel"], c["reason"], float(c["probe_s"]), cached=True)
        except (OSError, ValueError, KeyError, TypeError):
            pass
    choice = kvm_probe(guest, workdir, runner, timeout)
    if choice.accel == "tcg" and (pvm := kvm_pvm_note(host)):
        choice = AccelChoice(choice.accel, f"{choice.reason}; {pvm}", choice.probe_s)
    try:
        cache.write_text(json.dumps({"key": key, "at": time.time(), "choice": asdict(choice)}))
    except OSError:
        pass
    return choice


def choose_accel(requested: str, guest: ProbeGuest, workdir: Path, runner: Runner, host: HostRoot) -> AccelChoice:
    """``--accel auto|kvm|tcg``: probe for ``auto``; say loudly on stderr when it is not KVM."""
    if requested == "auto":
        choice = detect_accel(guest, workdir, runner, host)
    else:
        choice = AccelChoice(requested, "forced with --accel", 0.0)
    if choice.warning:
        print(f"kvmtune: warning: {choice.warning}", file=sys.stderr)
    return choice
