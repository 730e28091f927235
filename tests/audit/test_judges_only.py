"""``GuestRule.judges_only``: a rule that only reports about a guest's disks (NICs, RNGs), about what
its guest agent answered (``inside``) or about a guest on the audited host is not called for guests
without them. The engine trusts the declaration, so each declaring rule is held to it here: on every
guest of its own fixtures, of the bundled examples and of the corpus, with that part emptied (no
devices, no agent answers, not on this host), it reports nothing. And the engine does skip those guests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import pytest

from case_guests import case_guest
from kvmtune.audit.collect import EXAMPLES
from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import run_rules
from kvmtune.audit.finding import Finding
from kvmtune.audit.rule import DeviceList, GuestRule, all_rules
from kvmtune.errors import InputError
from kvmtune.host.root import HostRoot
from kvmtune.model.guest import Guest

TESTS = Path(__file__).resolve().parents[1]
HOST = TESTS / "fixtures" / "hosts" / "rules-default"
DECLARING = [r for r in all_rules() if issubclass(r, GuestRule) and r.judges_only is not None]
# each judged part as a guest without it has it
ABSENT: dict[str, Any] = {"disks": [], "nics": [], "rngs": [], "hostdevs": 0, "vcpu_pinned": False, "inside": None,
                          "on_audited_host": False}


def load(files: list[Path]) -> list[Guest]:
    """As tests/rules/test_rule_fixtures.py reads them (tests/case_guests.py): a case directory's files, an
    ``.agent.json`` beside an XML file as that guest's agent answers, every guest on the audited host."""
    files = [g for f in files for g in (sorted(f.iterdir()) if f.is_dir() else [f])]
    guests = []
    for f in files:
        try:
            guest = case_guest(f)
        except InputError:
            continue
        if guest is not None:
            guests.append(guest)
    for guest in guests:
        guest.on_audited_host = True  # host-relative checks judge them too
    return guests


def silent_without_devices(rule: type[GuestRule], guests: list[Guest]) -> list[str]:
    """The guests on which ``rule`` still reports something once their judged devices are gone."""
    assert rule.judges_only is not None
    ctx = AuditContext(host=HostRoot(str(HOST)))
    loud = []
    without: dict[str, Any] = {rule.judges_only: ABSENT[rule.judges_only]}
    for guest in guests:
        if not getattr(guest, rule.judges_only):
            continue
        stripped = dataclasses.replace(guest, **without)
        if list(rule().check(stripped, ctx)):
            loud.append(f"{guest.origin} ({guest.name})")
    return loud


def test_some_rules_declare_it() -> None:
    assert {r.judges_only for r in DECLARING} == set(ABSENT) == set(get_args(DeviceList))


@pytest.mark.parametrize("rule", DECLARING, ids=lambda r: r.id)
def test_a_declaring_rule_reports_nothing_on_its_fixtures_without_those_devices(rule: type[GuestRule]) -> None:
    files = sorted((TESTS / "rules" / rule.id).glob("*/*")) + sorted(EXAMPLES.glob("*.xml"))
    guests = load(files)
    assert rule.judges_only is not None
    assert any(getattr(g, rule.judges_only) for g in guests), f"{rule.id}: no fixture guest has {rule.judges_only}"
    assert silent_without_devices(rule, guests) == []


def test_every_declaring_rule_reports_nothing_on_the_corpus_without_those_devices(corpus: Path) -> None:
    guests = load(sorted((corpus / "domains").glob("*.xml")))
    loud = {r.id: silent_without_devices(r, guests) for r in DECLARING}
    assert {rule: where[:3] for rule, where in loud.items() if where} == {}


def test_the_engine_passes_only_guests_that_have_the_judged_devices() -> None:
    seen: list[str] = []

    class NicsOnly(GuestRule):
        id = "TEST-NIC-001"
        judges_only = "nics"

        def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
            seen.append(guest.name)
            yield from ()

    guests = load(sorted(EXAMPLES.glob("*.xml")))
    without_nics = dataclasses.replace(guests[0], name="no-nics", nics=[])
    ctx = AuditContext(host=HostRoot(str(HOST)))
    run_rules(ctx, [*guests, without_nics], rules=[NicsOnly])
    assert seen == [g.name for g in guests if g.nics]
    assert "no-nics" not in seen and len(seen) >= 1
