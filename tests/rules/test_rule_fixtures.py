"""Every guest rule fires on each of its bad fixtures and stays silent on its good ones.

Fixtures live in ``tests/rules/<RULE-ID>/{bad,good}/``: domain XML (``*.xml``),
QEMU command lines (``*.args``) or KubeVirt manifests (``*.yaml``, read by kubevirt/ as
``audit`` reads them). A directory holding several files is audited as
one run (for rules that compare guests, e.g. duplicate MACs). A ``<name>.agent.json``
beside ``<name>.xml`` holds a guest agent's answers (``ReplayAgent``): the guest is
audited as running, with its inside read from them by the same code as a live agent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from case_guests import case_guest
from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import run_rules
from kvmtune.audit.rule import GuestRule, RunRule, all_rules, rule_by_id
from kvmtune.host.root import HostRoot
from kvmtune.kubevirt.guest import guests_from_objects
from kvmtune.kubevirt.load import read_file
from kvmtune.model.guest import Guest

HERE = Path(__file__).parent
FIXTURE_HOST = HERE.parent / "fixtures" / "hosts" / "rules-default"


def load(path: Path) -> list[Guest]:
    """The fixtures are audited as ``--assume-this-host`` would: host-relative rules judge them too."""
    files = sorted(path.iterdir()) if path.is_dir() else [path]
    guests = []
    for f in files:
        if f.suffix == ".yaml":
            guests.extend(guests_from_objects(read_file(str(f)))[0])
        elif (guest := case_guest(f)) is not None:
            guests.append(guest)
    for guest in guests:
        guest.on_audited_host = True
    return guests


def cases(kind: str) -> list[tuple[str, Path]]:
    out = []
    for rule_dir in sorted(HERE.iterdir()):
        if rule_dir.is_dir() and (rule_dir / kind).is_dir():
            out.extend((rule_dir.name, case) for case in sorted((rule_dir / kind).iterdir()))
    return out


def audit(rule_id: str, case: Path) -> list[str]:
    rule = rule_by_id(rule_id)
    assert rule is not None, f"fixture directory for unknown rule {rule_id}"
    ctx = AuditContext(host=HostRoot(str(FIXTURE_HOST)))
    return [f.rule for f in run_rules(ctx, load(case), rules=[rule])]


@pytest.mark.parametrize(("rule_id", "case"), cases("bad"), ids=lambda v: v if isinstance(v, str) else v.name)
def test_rule_fires_on_bad(rule_id: str, case: Path) -> None:
    assert rule_id in audit(rule_id, case)


@pytest.mark.parametrize(("rule_id", "case"), cases("good"), ids=lambda v: v if isinstance(v, str) else v.name)
def test_rule_silent_on_good(rule_id: str, case: Path) -> None:
    assert audit(rule_id, case) == []


@pytest.mark.parametrize("rule", [r for r in all_rules() if issubclass(r, (GuestRule, RunRule))], ids=lambda r: r.id)
def test_guest_rule_has_fixtures(rule: type) -> None:
    d = HERE / rule.id
    assert any((d / "bad").glob("*")), f"{rule.id} needs at least one bad fixture in {d}/bad"
    assert any((d / "good").glob("*")), f"{rule.id} needs at least one good fixture in {d}/good"


@pytest.mark.parametrize(("rule_id", "case"), cases("bad") + cases("good"), ids=lambda v: v if isinstance(v, str) else v.name)
def test_rule_evaluates_its_fixtures_without_raising(rule_id: str, case: Path) -> None:
    """The engine turns a rule that raises into one error line and no finding, which a good fixture would
    pass as 'silent': so the errors are checked on their own (KVM-CPU-023 once raised on floating vCPUs)."""
    rule = rule_by_id(rule_id)
    assert rule is not None
    ctx = AuditContext(host=HostRoot(str(FIXTURE_HOST)))
    run_rules(ctx, load(case), rules=[rule])
    assert ctx.errors == []
