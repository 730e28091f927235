"""The verify plan contract: every fixable rule says, in its own file, what `kvmtune verify` measures for its
fix (``verify = BlockExperiment(...)`` / ``HostFixExperiment()``) or why nothing (``NoExperiment("...")``);
verify/ reads it from the rule and keeps no table of rule ids."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

import kvmtune.verify
from kvmtune.audit.finding import TOPICS, Finding, Target
from kvmtune.audit.rule import GuestRule, HostRule, ImageRule, Rule, all_rules, rule_by_id
from kvmtune.audit.verifyplan import BlockExperiment, FioJob, GuestExperiment, HostFixExperiment, NetJob, NoExperiment
from kvmtune.fix.registry import all_fixers
from kvmtune.host.root import HostRoot
from kvmtune.lab.replica import Layout
from kvmtune.runner import Runner
from kvmtune.verify.engine import Planned, VerifyResult, execute_one, plan_all
from kvmtune.verify.experiments import Outcome, Subject, VerifyContext
from kvmtune.verify.planner import plan_for

VERIFY_SRC = Path(kvmtune.verify.__file__).resolve().parent


def missing_plans(rules: tuple[type[Rule], ...] | list[type[Rule]]) -> list[str]:
    """Rules whose fix kvmtune carries out (a fix_kind other than manual, or an XML fixer) but that declare no plan."""
    fixers = all_fixers()
    return [r.id for r in rules if (r.fix_kind != "manual" or r.id in fixers) and r.verify is None]


def test_every_fixable_rule_has_a_verify_plan_or_a_reason() -> None:
    assert missing_plans(all_rules()) == []


def test_the_contract_sees_a_fixable_rule_without_a_plan() -> None:
    class NewRule(GuestRule):
        id = "KVM-TST-999"
        fix_kind = "xml"

    class Declared(NewRule):
        verify = NoExperiment("not measured")

    class Manual(GuestRule):
        id = "KVM-TST-998"

    assert missing_plans([NewRule, Declared, Manual]) == ["KVM-TST-999"]


@pytest.mark.parametrize("rule", [r for r in all_rules() if r.verify is not None], ids=lambda r: r.id)
def test_each_plan_fits_its_rule(rule: type[Rule]) -> None:
    plan = rule.verify
    if isinstance(plan, NoExperiment):
        assert plan.reason.strip() and "\n" not in plan.reason
    elif isinstance(plan, HostFixExperiment):
        assert issubclass(rule, HostRule) and rule.fix_kind != "manual", "the host fix plan must write a value for it"
    elif isinstance(plan, GuestExperiment):  # two probe guests: side B is what the rule's own fixer writes
        assert issubclass(rule, GuestRule) and rule.id in all_fixers()
        assert plan.part in ("disk", "controller", "nic", "cpu", "memory")
        assert isinstance(plan.job, NetJob if plan.part == "nic" else FioJob)
    else:
        assert isinstance(plan, BlockExperiment)
        assert issubclass(rule, (GuestRule, ImageRule)), "the block tier replicates a guest disk or an image"
        if plan.layout:  # not an XML edit: the layout change is named, and who makes it
            assert set(plan.layout) <= {f.name for f in dataclasses.fields(Layout)} and plan.by != "kvmtune fix"
        else:  # side B is what the rule's own fixer writes
            assert rule.id in all_fixers()


def test_verify_names_no_rule_id() -> None:
    """The central table of rule ids is gone: verify/ finds each rule's plan through the rule registry."""
    ids = {p.name: re.findall(r"KVM-[A-Z]{3}-\d{3}", p.read_text(encoding="utf-8")) for p in VERIFY_SRC.glob("*.py")}
    assert {name: found for name, found in ids.items() if found} == {}


def _finding(rule_id: str, device: str | None = None) -> Finding:
    rule = rule_by_id(rule_id)
    assert rule is not None
    return rule().finding(target=Target("localhost", "g", device), actual="a", expected="b", evidence="/x")


def test_verify_gives_the_rules_own_reason(tmp_path: Path) -> None:
    vctx = VerifyContext(runner=Runner(), host=HostRoot("/"), root="/", workdir=tmp_path)
    for rule_id in ("KVM-WIN-003", "KVM-NET-006", "KVM-HST-023"):  # an XML fix, a manual rule, a host setting
        plan = plan_for(rule_id)
        assert isinstance(plan, NoExperiment)
        (p,) = plan_all([Subject(_finding(rule_id))], vctx)
        assert p.experiment is None and p.result.reason == plan.reason


def test_a_safety_note_comes_from_the_rule(tmp_path: Path) -> None:
    plan = plan_for("KVM-STO-004")
    assert isinstance(plan, BlockExperiment) and plan.note

    class Done:
        tier, change, workload = "block", "cache unsafe → none", "fio"

        def run(self, ctx: VerifyContext) -> Outcome:
            return Outcome(None, "nothing changed")

    vctx = VerifyContext(runner=Runner(), host=HostRoot("/"), root="/", workdir=tmp_path)
    for rule_id, expect in (("KVM-STO-004", [plan.note]), ("KVM-STO-002", [])):
        p = Planned(VerifyResult(_finding(rule_id, "disk:vda")), Subject(_finding(rule_id, "disk:vda")), Done())
        execute_one(p, vctx)
        assert p.result.notes == expect



# --------------------------------------------------------------------------- issue 37, item 5: the guest tier exists

# what the guest tier measures: bus, NIC model, vhost, queues, IOThreads, named by the rules' own topics (audit/finding.py)
GUEST_VISIBLE_TOPICS = {"disk-bus": "bus", "nic-model": "NIC model", "vhost-net": "vhost", "net-multiqueue": "queues",
                        "iothreads": "IOThreads and disk queues"}


def guest_visible_without_experiment(rules: tuple[type[Rule], ...] | list[type[Rule]]) -> list[str]:
    """Rules about bus, NIC model, vhost, queues or IOThreads that still declare NoExperiment."""
    return [r.id for r in rules if r.topic in GUEST_VISIBLE_TOPICS and isinstance(r.verify, NoExperiment)]


def test_the_contract_sees_a_guest_visible_rule_with_only_a_reason() -> None:
    class Bus(GuestRule):
        id, topic, fix_kind = "KVM-TST-997", "disk-bus", "xml"
        verify = NoExperiment("needs a booted guest")

    class Measured(GuestRule):
        id, topic, fix_kind = "KVM-TST-996", "disk-bus", "xml"
        verify = GuestExperiment("disk", FioJob("bus", "randwrite"))

    class Cache(Bus):
        id, topic = "KVM-TST-995", "disk-cache"

    assert guest_visible_without_experiment([Bus, Measured, Cache]) == ["KVM-TST-997"]


def test_the_guest_visible_topics_are_real_topics_with_rules() -> None:
    assert set(GUEST_VISIBLE_TOPICS) <= TOPICS
    assert {r.topic for r in all_rules()} >= set(GUEST_VISIBLE_TOPICS)


@pytest.mark.parametrize("rule", [r for r in all_rules() if r.topic in GUEST_VISIBLE_TOPICS], ids=lambda r: r.id)
def test_no_guest_visible_rule_declares_no_experiment(rule: type[Rule]) -> None:
    """After issue 37 "needs a booted guest" is no reason for bus, NIC model, vhost, queue or IOThread fixes: each
    fixable one is measured on the guest tier (or its block tier)."""
    assert guest_visible_without_experiment([rule]) == [], f"{rule.id} ({rule.topic}): {rule.verify}"


BOOT_EXCUSE = re.compile(r"booted guest|does not boot|doesn't boot|cannot boot|would measure the emulator", re.I)


@pytest.mark.parametrize("rule", [r for r in all_rules() if isinstance(r.verify, NoExperiment)], ids=lambda r: r.id)
def test_no_reason_says_guests_cannot_be_booted(rule: type[Rule]) -> None:
    """The guest tier boots probe guests (under KVM, or TCG with --allow-tcg): a reason that blames booting is
    false on a KVM host; each names why the probe guest cannot show that effect."""
    assert isinstance(rule.verify, NoExperiment)
    assert not BOOT_EXCUSE.search(rule.verify.reason), rule.verify.reason
