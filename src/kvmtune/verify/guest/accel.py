"""The guest tier's accelerator: decided once a run, and what a finding says when it needs KVM.

The probe-guest pair (:class:`kvmtune.lab.probe.pair.ProbePair`) boots under what :func:`pair_accel` decides; without
``--allow-tcg`` a finding whose pair would run under TCG is :class:`~kvmtune.verify.experiments.Unmeasurable`, and a
result measured under TCG says :data:`EMULATION`.
"""

from __future__ import annotations

from kvmtune.host.root import HostRoot
from kvmtune.lab.accel import AccelChoice, detect_accel
from kvmtune.lab.accel_cache import read_cached_verdict
from kvmtune.lab.guest import GuestBuilder
from kvmtune.lab.workdir import default_workdir
from kvmtune.verify.experiments import Unmeasurable, VerifyContext

ALLOW_TCG = "--allow-tcg"
NEEDS_KVM = "needs KVM: the guest tier boots two probe guests, and KVM does not boot guests here ({why})"
EMULATION = "emulation: not evidence for a KVM host"


# --------------------------------------------------------------------------- the accelerator, once a run


def pair_accel(ctx: VerifyContext) -> AccelChoice:
    """The accelerator the probe guests get on this machine, decided once a run and kept on ``ctx``: ``tcg`` without a
    usable /dev/kvm, else ``kvm`` only if a probe guest really boots under it (``kvmtune guest accel``'s verdict,
    from its cache when it is there: a day old at most)."""
    if ctx.guest_accel is None:
        ctx.guest_accel = _decide_accel(ctx)
    return ctx.guest_accel


def _decide_accel(ctx: VerifyContext) -> AccelChoice:
    host = HostRoot()  # the probe guests run on this machine, whatever --root names
    if not host.exists("/dev/kvm"):
        return AccelChoice("tcg", "/dev/kvm is absent", 0.0)
    if not host.access("/dev/kvm", 6):  # R_OK | W_OK
        return AccelChoice("tcg", "/dev/kvm is not readable and writable by this user", 0.0)
    osrel = (host.read_optional("/proc/sys/kernel/osrelease") or "").strip()
    for workdir in dict.fromkeys((ctx.workdir, default_workdir())):
        cached = read_cached_verdict(workdir, osrel)
        if cached is not None:
            return AccelChoice(cached.accel, cached.reason, 0.0, cached=True)
    guest = GuestBuilder(ctx.workdir, ctx.runner, host, kernel=ctx.guest_kernel, modules_dir=ctx.guest_modules).build()
    return detect_accel(guest, ctx.workdir, ctx.runner, host)


def require_accel(rule_id: str, ctx: VerifyContext) -> AccelChoice:
    """The accelerator for this finding's pair; under TCG without ``--allow-tcg``, :class:`Unmeasurable` with the
    "needs KVM" line and the command that measures it under emulation."""
    choice = pair_accel(ctx)
    if choice.accel == "tcg" and not ctx.allow_tcg:
        command = " ".join(x for x in ("kvmtune verify", ctx.inputs_hint, f"--only {rule_id}", ALLOW_TCG) if x)
        raise Unmeasurable(f"{NEEDS_KVM.format(why=choice.reason)}; to measure it under emulation: {command}")
    return choice
