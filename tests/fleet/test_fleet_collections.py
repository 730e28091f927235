"""Issue 31 item 10 and issue 33's fleet parts: collections are named and scoped, "resolved" is computed only
between collections of one name and scope, "not audited this time" is its own state, a one-off report of files
stores nothing unless asked, and waivers (each host's own, and a fleet-wide file) are shown apart and counted
in no score. Each test runs the real CLI (`python -m kvmtune report`) on real files."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from datetime import date, timedelta
from pathlib import Path
from typing import Any

import pytest

from kvmtune import cli

SRC = Path(__file__).resolve().parents[2] / "src"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"


def finding(rule: str, severity: str = "high", domain: str | None = None, device: str | None = None,
            waiver: dict[str, Any] | None = None) -> dict[str, Any]:
    f: dict[str, Any] = {"rule": rule, "slug": "x", "topic": "t", "severity": severity, "confidence": "certain",
                         "target": {"host": "x", "domain": domain, "device": device}, "summary": "s"}
    if waiver is not None:
        f["waiver"] = waiver
    return f


def doc(host: str, scope: list[str], *findings: dict[str, Any]) -> dict[str, Any]:
    return {"schema_version": 1, "host": host, "generated": "2026-01-01T00:00:00+00:00", "scope": scope,
            "findings": list(findings), "errors": []}


def write(fleet: Path, docs: dict[str, object], name: str | None = "prod") -> Path:
    fleet.mkdir(parents=True, exist_ok=True)
    for p in fleet.glob("*.json"):
        p.unlink()
    for host, d in docs.items():
        (fleet / f"{host}.json").write_text(json.dumps(d))
    if name is not None:
        (fleet / ".kvmtune-collection").write_text(json.dumps({"name": name}))
    return fleet


def report(*args: str | Path, db: Path, code: int = 0) -> str:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    run = subprocess.run([sys.executable, "-m", "kvmtune", "report", *map(str, args), "--db", str(db), "--no-config"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert "Traceback" not in run.stderr, run.stderr
    assert run.returncode == code, run.stdout + run.stderr
    return run.stdout + run.stderr


H1, H2, G1 = finding("KVM-HST-043"), finding("KVM-HST-015", "medium"), finding("KVM-STO-004", "critical", "vm1", "disk:vda")
BOTH, HOST = ["host", "guests"], ["host"]
DOWN = {"kind": "kvmtune-fleet-status", "host": "web02", "problem": "unreachable"}


def test_a_one_off_report_of_files_stores_nothing_unless_asked(tmp_path: Path) -> None:
    f = tmp_path / "one.json"
    f.write_text(json.dumps(doc("web01", BOTH, H1)))
    db = tmp_path / "r.db"
    out = report(f, db=db)
    assert "collection (unnamed), scope both; not stored (files named one by one: --save keeps them)" in out
    assert not db.exists()  # not even an empty database
    report(f, "--no-save", db=db)  # still accepted
    assert not db.exists()
    out = report(f, "--save", "--label", "mail", db=db)
    assert out.startswith("fleet: 1 host(s), 1 audited, 0 failed; stored as collection 1\n")
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT id, label, scope FROM fleet_collections").fetchall() == [(1, "mail", "both")]
    assert "not allowed with argument" in report(f, "--save", "--no-save", db=db, code=2)


def test_resolved_only_between_collections_of_one_name_and_scope(tmp_path: Path) -> None:
    fleet, db = tmp_path / "collected", tmp_path / "r.db"
    write(fleet, {"web01": doc("web01", BOTH, H1, G1), "web02": doc("web02", BOTH, H2)})
    out = report(fleet, db=db)
    assert "collection 'prod', scope both" in out and "Since" not in out
    # another name: a fresh history, nothing "resolved" against prod
    write(fleet, {"web01": doc("web01", BOTH), "web02": doc("web02", BOTH)})
    assert "Since" not in report(fleet, "--label", "staging", db=db)
    # prod again, host-only: not comparable with the guests-and-host collections
    write(fleet, {"web01": doc("web01", HOST, H1), "web02": doc("web02", HOST, H2)})
    out = report(fleet, db=db)
    assert "collection 'prod', scope host" in out and "Since" not in out
    # prod, both again: vm1's finding is gone (resolved); web02 is down: its finding was not audited, not resolved
    write(fleet, {"web01": doc("web01", BOTH, H1), "web02": DOWN})
    out = report(fleet, db=db)
    assert "Since collection 1 (" in out and "): 0 new, 1 resolved, 1 not audited this time" in out
    assert "  - web01 KVM-STO-004 critical vm1/disk:vda" in out
    assert "  ? web02: 1 finding(s) not audited this time (failed: unreachable)" in out
    assert "- web02" not in out
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT label, scope FROM fleet_collections ORDER BY id").fetchall() == [
            ("prod", "both"), ("staging", "both"), ("prod", "host"), ("prod", "both")]


def test_a_host_audited_without_its_guests_has_their_findings_not_audited(tmp_path: Path) -> None:
    fleet, db = tmp_path / "collected", tmp_path / "r.db"
    write(fleet, {"web01": doc("web01", BOTH, H1, G1), "web02": doc("web02", HOST, H2)})
    assert "scope mixed" in report(fleet, db=db)
    write(fleet, {"web01": doc("web01", HOST, H1), "web02": doc("web02", BOTH, H2, G1 | {"target": {"domain": "vm9"}})})
    out = report(fleet, db=db)
    # web01's guests were not audited this time; web02's guest finding is not "new": its guests were not audited before
    assert "): 0 new, 0 resolved, 1 not audited this time" in out
    assert "  ? web01: 1 finding(s) not audited this time (this audit's scope is host)" in out


def test_waived_findings_are_shown_apart_and_a_fleet_waiver_file_applies(tmp_path: Path) -> None:
    fleet, db = tmp_path / "collected", tmp_path / "r.db"
    own = {"rule": "KVM-STO-004", "reason": "scratch database", "expires": "2099-01-01", "origin": "/etc/kvmtune.toml:3"}
    write(fleet, {"web01": doc("web01", BOTH, H1, finding("KVM-STO-004", "critical", "vm1", "disk:vda", own)),
                  "web02": doc("web02", BOTH, H2)})
    waivers = tmp_path / "fleet.toml"
    yesterday = (date.today() - timedelta(days=1)).isoformat()
    waivers.write_text('[[waiver]]\nrule = "KVM-HST-015"\nhost = "web0*"\nreason = "lab hosts"\n\n'
                       f'[[waiver]]\nrule = "KVM-HST-043"\nreason = "old"\nexpires = {yesterday}\n\n'
                       '[[waiver]]\nrule = "KVM-NET"\nhost = "db*"\nreason = "nothing here"\n')
    waivers.chmod(0o600)
    out = report(fleet, "--waivers", waivers, "--html", tmp_path / "f.html", db=db)
    worst = {r.split()[0]: r.split()[1:] for r in out.split("Worst hosts")[1].split("\n\n")[0].splitlines()[2:]}
    assert worst == {"web01": ["10", "0", "1", "0", "0", "0", "0"], "web02": ["0", "0", "0", "0", "0", "0", "0"]}
    assert "Waived findings (2, counted in no score or column above):" in out
    assert ("  web01 KVM-STO-004 critical vm1/disk:vda: waived: scratch database (until 2099-01-01) "
            "[/etc/kvmtune.toml:3]") in out
    assert f"  web02 KVM-HST-015 medium : waived: lab hosts [fleet {waivers}:1]" in out
    assert f"expired waiver KVM-HST-043 ({waivers}:6): ended {yesterday}; 1 finding(s) it matched count again" in out
    assert f"stale waiver KVM-NET host=db* ({waivers}:11): matched no finding of this fleet; remove it" in out
    rules = out.split("Findings per rule across hosts:")[1].split("\n\n")[0]
    assert "KVM-HST-043" in rules and "KVM-STO-004" not in rules and "KVM-HST-015" not in rules
    page = (tmp_path / "f.html").read_text()
    assert "<h2>Waived findings (2)</h2>" in page and "scratch database" in page
    assert "hosts in score order (waived findings not counted)" in page  # the chart counts open findings only
    with sqlite3.connect(db) as c:
        assert c.execute("SELECT host, rule FROM fleet_findings WHERE waiver != '' ORDER BY host").fetchall() == [
            ("web01", "KVM-STO-004"), ("web02", "KVM-HST-015")]
    # the trend counts open findings only
    out = report(fleet, "--waivers", waivers, db=db)
    assert "Trend (findings per collection): #1: 1 (0 critical)  #2: 1 (0 critical)" in out


def test_a_bad_waiver_in_a_host_file_or_a_bad_collection_name_is_one_line(tmp_path: Path) -> None:
    fleet, db = tmp_path / "collected", tmp_path / "r.db"
    write(fleet, {"web01": doc("web01", BOTH, finding("KVM-HST-043", waiver={"reason": 3})),
                  "web02": doc("web02", ["hosts"])})
    out = report(fleet, db=db, code=2)
    assert f"{fleet / 'web01.json'}: findings[0].waiver.reason: expected a string, found a number; rejected" in out
    assert f"{fleet / 'web02.json'}: scope: expected an array of 'host' and 'guests'; rejected" in out
    (fleet / ".kvmtune-collection").write_text('{"name": ""}')
    out = report(fleet, db=db, code=2)
    assert out.strip().splitlines()[-1].startswith(f"kvmtune: {fleet / '.kvmtune-collection'}: expected")


@pytest.mark.parametrize(("argv", "scope"), [
    (["--host", "--root", str(FIXTURES / "rhel6-old")], ["host"]),
    (["--examples"], ["guests"]),
    (["--root", str(FIXTURES / "rhel6-old")], ["host", "guests"]),  # no input: the host and what it runs
])
def test_audit_json_says_what_it_was_asked_to_audit(argv: list[str], scope: list[str], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "a.json"
    assert cli.main(["audit", *argv, "--no-config", "--format", "json", "-o", str(out)]) in (0, 1)
    capsys.readouterr()
    assert json.loads(out.read_text())["scope"] == scope
