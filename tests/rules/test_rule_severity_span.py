"""What `rules list` says a rule's severity is matches what its findings carry: every finding
the rule fixtures, the fixture hosts and the corpus produce lies in its rule's listed span."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import run_rules
from kvmtune.audit.finding import Finding
from kvmtune.audit.rule import all_rules, rule_by_id
from kvmtune.cli import main
from kvmtune.domain.xml import load_guest_file
from kvmtune.errors import InputError
from kvmtune.host.root import HostRoot
from kvmtune.model.guest import Guest

HERE = Path(__file__).parent
HOSTS = HERE.parent / "fixtures" / "hosts"
CORPUS = HERE.parents[1].parent / "shared" / "corpus" / "libvirt" / "domains"


def in_span(f: Finding) -> bool:
    rule = rule_by_id(f.rule)
    assert rule is not None
    return f.severity in {rule.severity, *rule.also_severities}


def guests_of(paths: list[Path]) -> list[Guest]:
    out = []
    for p in paths:
        try:
            out.append(load_guest_file(p))
        except InputError:
            continue
    return out


def test_guest_and_host_findings_stay_in_their_rules_span() -> None:
    xmls = sorted(HERE.glob("KVM-*/*/*.xml"))
    if CORPUS.is_dir():
        xmls += sorted(CORPUS.glob("*.xml"))
    guests = guests_of(xmls)
    seen: list[Finding] = []
    for host in sorted(p for p in HOSTS.iterdir() if p.is_dir()):
        ctx = AuditContext(host=HostRoot(str(host)))
        seen += run_rules(ctx, guests, audit_host=True)
    assert len({f.rule for f in seen}) > 30
    assert [f"{f.rule} {f.severity}" for f in seen if not in_span(f)] == []


def test_rules_list_has_a_header_and_shows_the_span(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["ID", "SEVERITY", "SCOPE", "TOPIC"]
    assert len(lines) == len(all_rules()) + 1
    for rid in ("KVM-STO-009", "KVM-STO-011"):
        assert next(ln for ln in lines if ln.startswith(rid)).split()[1] == "low–medium"


def test_unknown_topic_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules", "list", "--topic", "disk-cahce"]) == 2
    assert "did you mean disk-cache" in capsys.readouterr().err
