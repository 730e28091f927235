"""The rule contract: ids, topics and docs with the agreed headings."""

from __future__ import annotations

import re

import pytest

from kvmtune.audit.finding import TOPICS
from kvmtune.audit.rule import all_rules
from kvmtune.cli import main

HEADINGS = ["What it does", "Why it matters", "Example", "Use instead", "Fix safety", "Evidence read", "References"]


def test_enough_rules() -> None:
    assert len(all_rules()) >= 25


@pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.id)
def test_rule_metadata(rule: type) -> None:
    assert re.fullmatch(r"KVM-[A-Z]{3}-\d{3}", rule.id)
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", rule.slug)
    assert rule.topic in TOPICS
    assert rule.title and rule.why and rule.references


@pytest.mark.parametrize("rule", all_rules(), ids=lambda r: r.id)
def test_rule_doc_has_headings_in_order(rule: type) -> None:
    doc = rule.doc_path().read_text(encoding="utf-8")
    assert doc.startswith(f"# {rule.id} {rule.slug}\n"), "doc title must be '# ID slug'"
    found = re.findall(r"^## (.+)$", doc, flags=re.M)
    assert found == HEADINGS, f"{rule.doc_path().name}: headings {found}"
    for section in re.split(r"^## .+$", doc, flags=re.M)[1:]:
        assert section.strip(), f"{rule.id}: empty section"


def test_explain_prints_doc(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules", "explain", "KVM-STO-002"]) == 0
    assert "## Why it matters" in capsys.readouterr().out
    assert main(["rules", "explain", "disk-cache-writethrough"]) == 0
    assert main(["rules", "explain", "NOPE-001"]) == 2


def test_sto_004_advises_a_per_guest_waiver_not_a_skip_or_a_baseline(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 46 item 7: disposable guests' unsafe cache is accepted per guest and disk, with a reason and an end date."""
    assert main(["rules", "explain", "KVM-STO-004"]) == 0
    text = capsys.readouterr().out
    use_instead = text.split("## Use instead", 1)[1].split("## Fix safety", 1)[0]
    assert "[[waiver]]" in use_instead and "<metadata>" in use_instead and "expires" in use_instead
    assert "--skip KVM-STO-004" not in use_instead and "baseline" not in use_instead
