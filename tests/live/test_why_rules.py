"""``kvmtune why`` takes the rules it names from the catalogue (by topic and slug), never by a written id, and its own
thresholds each cite where their default comes from (issue 44 item 3)."""

from __future__ import annotations

import dataclasses
import importlib
import re
from pathlib import Path

import pytest

import kvmtune.live
from kvmtune.audit.rule import all_rules
from kvmtune.live.why.core import LIMITS, CatalogueRule, WhySettings, rules_of, short_ids

LIVE = Path(kvmtune.live.__file__).resolve().parent
RULE_ID = re.compile(r"KVM-[A-Z]{3}-\d{3}")
PARTS = ("cpu", "disk", "net", "memory")


def rule_id_literals(root: Path) -> list[str]:
    """Every rule id written in a module under ``root``: code, strings, comments and docstrings alike."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            found += [f"{path.relative_to(root)}:{n}: {m}" for m in RULE_ID.findall(line)]
    return found


def test_live_names_no_rule_id_literally() -> None:
    assert rule_id_literals(LIVE) == []


def test_the_literal_check_sees_an_id_in_code_and_in_a_comment(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text('RULE = "KVM-CPU-021"\n# see KVM-HST-005/006\nok = "KVM-CPU"\n')
    assert rule_id_literals(tmp_path) == ["a.py:1: KVM-CPU-021", "a.py:2: KVM-HST-005"]


def _catalogue_rules() -> dict[str, CatalogueRule]:
    out = {}
    for part in PARTS:
        module = importlib.import_module(f"kvmtune.live.why.{part}")
        for name, value in vars(module).items():
            for i, v in enumerate(value if isinstance(value, tuple) else (value,)):
                if isinstance(v, CatalogueRule):
                    out[f"{part}.{name}" + (f"[{i}]" if isinstance(value, tuple) else "")] = v
    return out


def test_each_part_names_rules_the_catalogue_has_and_the_same_ones_as_before() -> None:
    """The ids why printed when they were written by hand: a rule renamed or moved to another topic fails here."""
    got = {name: r.id for name, r in _catalogue_rules().items()}
    assert got == {
        "cpu.EMULATOR_ON_VCPUS": "KVM-CPU-021", "cpu.PINNED_SHARED": "KVM-CPU-020", "cpu.OVERCOMMIT": "KVM-HST-019",
        "cpu.NOT_ISOLATED": "KVM-HST-046", "disk.BLK_QUEUES": "KVM-STO-022", "disk.SINGLE_QUEUE_MACHINE": "KVM-STO-011",
        "net.EMULATOR_ON_VCPUS": "KVM-CPU-021", "net.MULTIQUEUE": "KVM-NET-008", "net.USER_NET": "KVM-NET-003",
        "memory.PINNED_MERGED": "KVM-MEM-001", "memory.LARGE_SMALL_PAGES": "KVM-MEM-004", "memory.SWAP": "KVM-HST-009",
        "memory.KSM_HOST[0]": "KVM-HST-005", "memory.KSM_HOST[1]": "KVM-HST-006",
    }
    for name, r in _catalogue_rules().items():
        assert r.rule() in rules_of(r.topic), name


def test_a_rule_not_in_the_catalogue_is_a_clear_error_not_a_silent_none() -> None:
    with pytest.raises(LookupError, match="no rule 'no-such-rule' in topic 'swap'"):
        _ = CatalogueRule("swap", "no-such-rule").id
    assert rules_of("swap") == sorted((r for r in all_rules() if r.topic == "swap"), key=lambda r: r.id)


def test_short_ids_writes_a_family_once() -> None:
    ksm = (CatalogueRule("ksm", "ksm-without-overcommit"), CatalogueRule("ksm", "ksm-off-with-overcommit"))
    assert short_ids(ksm) == "KVM-HST-005/006"
    assert short_ids(ksm[:1]) == "KVM-HST-005"


def test_every_threshold_of_why_cites_its_default() -> None:
    fields = {f.name for f in dataclasses.fields(WhySettings)}
    assert fields == set(WhySettings.CITES), "a threshold without a cite, or a cite without a threshold"
    assert all(len(c) > 20 for c in WhySettings.CITES.values())
    assert (LIMITS.throttle_near, LIMITS.cpu_cause_min, LIMITS.host_busy, LIMITS.ksm_share, LIMITS.vhost_busy) == (
        0.8, 0.05, 0.8, 0.10, 0.5)
