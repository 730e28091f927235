"""Golden pairs: ``golden/<RULE>/<case>.in.xml`` fixed for that rule must give ``<case>.out.xml``
byte for byte (comments, namespaces, <metadata>, unknown elements, quoting and line ends
untouched); ``golden/ALL`` is fixed for every rule at once with --allow-bus-change."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fixhelpers import FIXTURE_HOST, GOLDEN

from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import run_rules, select_rules
from kvmtune.audit.rule import Rule, all_rules, rule_by_id
from kvmtune.domain.xml import guest_from_tree, parse_xml_bytes
from kvmtune.fix.domains import fix_guest
from kvmtune.fix.registry import FixOptions, all_fixers
from kvmtune.host.root import HostRoot

CASES = sorted(GOLDEN.glob("*/*.in.xml"))


def _rules(case: Path) -> list[type[Rule]]:
    if case.parent.name == "ALL":
        return list(select_rules())
    rule = rule_by_id(case.parent.name)
    assert rule is not None, f"golden directory for unknown rule {case.parent.name}"
    return [rule]


def _options(bus: bool = True) -> FixOptions:
    # the golden pairs are fixed as `fix --allow-bus-change --allow-cpu-change --assume-this-host` plans them
    return FixOptions(allow_bus_change=bus, allow_cpu_change=bus, assume_this_host=True, host=HostRoot(str(FIXTURE_HOST)))


def _findings(data: bytes, rules: list[type[Rule]]) -> list[str]:
    guest = guest_from_tree(parse_xml_bytes(data, "x"), "x")
    guest.on_audited_host = True  # as kvmtune fix sees the definitions it fixes
    ctx = AuditContext(host=HostRoot(str(FIXTURE_HOST)))
    return [f.rule for f in run_rules(ctx, [guest], rules=rules)]


def _id(p: Path) -> str:
    return f"{p.parent.name}/{p.name.removesuffix('.in.xml')}"


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_golden_output(case: Path) -> None:
    out = case.with_name(case.name.replace(".in.xml", ".out.xml"))
    _guest, result = fix_guest(case.read_bytes(), str(case), "xml", _rules(case), _options())
    assert result.after is not None, result.skipped
    every = " (every fixer at once: a new fixer that fires on the input edits this output too)" * (case.parent.name == "ALL")
    assert result.after == out.read_bytes(), f"{out.parent.name}/{out.name} is not what the fixers write{every}"


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_golden_fixed_and_idempotent(case: Path) -> None:
    rules = _rules(case)
    before = case.read_bytes()
    out = case.with_name(case.name.replace(".in.xml", ".out.xml")).read_bytes()
    fixable = set(all_fixers())
    fixed = {r for r in _findings(before, rules) if r in fixable}
    assert fixed, "the input should have a fixable finding"
    assert not fixed & set(_findings(out, rules)), "the fixed findings are gone on re-audit"
    _guest, again = fix_guest(out, str(case), "xml", rules, _options())
    assert again.after is None, "fixing the output again plans nothing"


UNTOUCHABLE = re.compile(
    rb"<!--.*?-->|xmlns:\w+=(['\"]).*?\1|<metadata>.*?</metadata>|<qemu:commandline>.*?</qemu:commandline>"
    rb"|<vendor-extension.*?</vendor-extension>|<\?xml.*?\?>",
    re.S,
)


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_untouched_parts_survive(case: Path) -> None:
    """Comments, namespace declarations, <metadata>, qemu:commandline and unknown elements come out
    byte for byte, and every line the fix did not touch stays, in order (a rule-free check)."""
    before = case.read_bytes()
    after = case.with_name(case.name.replace(".in.xml", ".out.xml")).read_bytes()
    parts = [m.group(0) for m in UNTOUCHABLE.finditer(before)]
    assert parts
    for part in parts:
        assert part in after, part
    kept = [ln for ln in before.splitlines(keepends=True) if ln in after.splitlines(keepends=True)]
    it = iter(after.splitlines(keepends=True))
    assert all(any(ln == a for a in it) for ln in kept), "kept lines stay in their order"


def test_every_fixer_has_a_rule_and_a_golden_pair() -> None:
    ids = {r.id for r in all_rules()}
    golden = {p.parent.name for p in CASES}
    for rule in all_fixers():
        assert rule in ids, f"fixer for unknown rule {rule}"
        assert rule in golden, f"no golden pair for {rule}"


@pytest.mark.parametrize("rule_id", sorted(r for r, f in all_fixers().items() if f.bus_change))
def test_bus_changes_need_the_flag(rule_id: str) -> None:
    rule = rule_by_id(rule_id)
    assert rule is not None
    for case in sorted((GOLDEN / rule_id).glob("*.in.xml")):
        _guest, result = fix_guest(case.read_bytes(), str(case), "xml", [rule], _options(bus=False))
        assert result.after is None
        assert any("--allow-bus-change" in s for s in result.skipped)


def test_bad_fixtures_of_fixable_rules_get_fixed() -> None:
    """Each rule's own bad fixtures (tests/rules/<ID>/bad/*.xml): fixed, finding gone, idempotent."""
    rules_dir = Path(__file__).resolve().parent.parent / "rules"
    checked = 0
    for rule_id in sorted(all_fixers()):
        rule = rule_by_id(rule_id)
        assert rule is not None
        for case in sorted((rules_dir / rule_id / "bad").glob("*.xml")):
            data = case.read_bytes()
            _guest, result = fix_guest(data, str(case), "xml", [rule], _options())
            if result.after is None:
                assert result.skipped, f"{case}: neither fixed nor said why"
                continue
            checked += 1
            assert rule_id not in _findings(result.after, [rule]), case
            assert fix_guest(result.after, str(case), "xml", [rule], _options())[1].after is None, case
    assert checked >= 1
