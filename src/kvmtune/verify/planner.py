"""Which experiment measures a finding's fix: the guest-disk table first, then the host fix plan."""

from __future__ import annotations

from kvmtune.verify.disk import plan_disk
from kvmtune.verify.experiments import DISK_EXPERIMENTS, NOT_MEASURABLE, Experiment, Subject, Unmeasurable, VerifyContext
from kvmtune.verify.hostside import plan_host_finding


def plan_experiment(subject: Subject, ctx: VerifyContext) -> Experiment:
    """The experiment for ``subject``'s finding; raises :class:`Unmeasurable` with the reason."""
    rule = subject.finding.rule
    if rule in DISK_EXPERIMENTS:
        return plan_disk(subject, ctx)
    if rule.startswith("KVM-HST-") and rule not in NOT_MEASURABLE:
        return plan_host_finding(subject, ctx)
    if rule in NOT_MEASURABLE:
        raise Unmeasurable(NOT_MEASURABLE[rule])
    raise Unmeasurable("no experiment measures this rule's fix")
