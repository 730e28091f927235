"""Which experiment measures a finding's fix: what the finding's rule declares (its ``verify`` attribute)."""

from __future__ import annotations

import importlib
from functools import cache

from kvmtune.audit.rule import all_rules
from kvmtune.audit.verifyplan import BlockExperiment, GuestExperiment, HostFixExperiment, NoExperiment, VerifyPlan
from kvmtune.verify.block.experiment import plan_disk
from kvmtune.verify.experiments import Experiment, Subject, Unmeasurable, VerifyContext
from kvmtune.verify.host.experiment import plan_host_finding

NO_PLAN = "no experiment measures this rule's fix"


@cache
def _plans() -> dict[str, VerifyPlan]:
    return {r.id: r.verify for r in all_rules() if r.verify is not None}


def plan_for(rule_id: str) -> VerifyPlan | None:
    """The verify plan the rule ``rule_id`` declares, or ``None`` (no such rule, or it declares none)."""
    return _plans().get(rule_id)


def plan_experiment(subject: Subject, ctx: VerifyContext) -> Experiment:
    """The experiment for ``subject``'s finding; raises :class:`Unmeasurable` with the reason."""
    plan = plan_for(subject.finding.rule)
    if isinstance(plan, BlockExperiment):
        return plan_disk(subject, ctx, plan)
    if isinstance(plan, HostFixExperiment):
        return plan_host_finding(subject, ctx)
    if isinstance(plan, GuestExperiment):
        return plan_guest(subject, ctx, plan)
    if isinstance(plan, NoExperiment):
        raise Unmeasurable(plan.reason)
    raise Unmeasurable(NO_PLAN)


NIC_NOT_BUILT = "the guest tier's NIC experiments are not built yet (verify/guest/nic.py)"


def plan_guest(subject: Subject, ctx: VerifyContext, plan: GuestExperiment) -> Experiment:
    """The guest tier: the finding's disk or controller (``verify/guest/disk.py``) or its NIC (``verify/guest/nic.py``)."""
    if plan.part in ("disk", "controller"):
        from kvmtune.verify.guest.disk import plan_guest_disk

        return plan_guest_disk(subject, ctx, plan)
    if plan.part == "nic":
        try:
            guestnic = importlib.import_module("kvmtune.verify.guest.nic")
        except ModuleNotFoundError:
            raise Unmeasurable(NIC_NOT_BUILT) from None
        experiment: Experiment = guestnic.plan_nic(subject, ctx, plan)
        return experiment
    raise Unmeasurable(f"the guest tier does not measure a {plan.part} change yet")
