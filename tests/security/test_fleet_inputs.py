"""Issue 29 items 3, 4, 5: fleet host files are untrusted. A file cannot speak for another host (the fleet
directory's file name is the identity), one host's hostile JSON cannot stop the fleet report, and nothing a
host file says reaches the terminal raw. Each test runs the real CLI (`python -m kvmtune report`)."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
ESC = "\x1b"


def finding(rule: str = "KVM-HST-043", severity: str = "critical", topic: str = "cpu-governor",
            summary: str = "scaling governor is powersave", domain: str | None = None) -> dict[str, Any]:
    """One finding as `kvmtune audit --format json` writes it (Finding.to_json)."""
    return {"rule": rule, "slug": "cpu-governor-not-performance", "topic": topic, "severity": severity,
            "confidence": "certain", "target": {"host": "x", "domain": domain, "device": None}, "actual": "powersave",
            "expected": "performance", "evidence": "", "summary": summary, "why": "",
            "fix": {"kind": "sysfs", "description": "", "safe": True}, "references": [], "source": ""}


def audit_doc(host: object, *findings: object) -> dict[str, Any]:
    return {"schema_version": 1, "tool": {"name": "kvmtune", "version": "0.1.0"}, "host": host,
            "generated": "2025-01-01T00:00:00+00:00", "looked_at": [],
            "summary": {"findings": len(findings), "by_severity": {}, "errors": 0}, "findings": list(findings),
            "errors": []}


def put(path: Path, doc: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def report(*args: str | Path, db: Path, html: Path | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "kvmtune", "report", *map(str, args), "--db", str(db)]
    if html is not None:
        argv += ["--html", str(html)]
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    run = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert "Traceback" not in run.stderr, run.stderr
    assert ESC not in run.stdout and ESC not in run.stderr  # nothing a host file says reaches the terminal raw
    return run


def worst(out: str) -> dict[str, list[str]]:
    """The "Worst hosts" table: host -> [score, critical, high, medium, low, info, errors]."""
    rows = out.split("Worst hosts")[1].split("\n\n")[0].splitlines()[2:]
    return {" ".join(r.split()[:-7]): r.split()[-7:] for r in rows}


def stored(db: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    with sqlite3.connect(db) as c:
        hosts = c.execute("SELECT host, status, claimed FROM fleet_hosts ORDER BY collection, host").fetchall()
        found = c.execute("SELECT host, rule, severity FROM fleet_findings ORDER BY host, rule").fetchall()
    return hosts, found


def test_a_file_claiming_another_hosts_name_is_rejected_and_the_real_host_reported(tmp_path: Path) -> None:
    """Issue 29 item 3: `aaa-evil.json` saying "web01" came first in path order and web01's own file, with its
    critical finding, was skipped: the report and the history showed web01 clean."""
    fleet = tmp_path / "collected"
    put(fleet / "aaa-evil.json", audit_doc("web01"))
    put(fleet / "web01.json", audit_doc("web01", finding()))
    db, html = tmp_path / "r.db", tmp_path / "fleet.html"
    run = report(fleet, db=db, html=html)
    assert run.returncode == 2
    line = (f"{fleet / 'aaa-evil.json'}: the document says host 'web01', its file name says 'aaa-evil' "
            "(a fleet directory's files are named after their inventory host); rejected")
    assert run.stderr == f"kvmtune: {line}\n"
    head = run.stdout.splitlines()[:2]
    assert head == ["fleet: 1 host(s), 1 audited, 0 failed, 1 file(s) rejected (their hosts are not in this report); "
                    "stored as collection 1", f"  REJECTED {line}"]
    assert worst(run.stdout) == {"web01": ["100", "1", "0", "0", "0", "0", "0"]}
    page = html.read_text()
    assert page.index("1 file(s) rejected") < page.index("Worst hosts")  # at the top of the HTML report too
    assert "aaa-evil.json: the document says host &#x27;web01&#x27;" in page
    assert stored(db) == ([("web01", "ok", 0)], [("web01", "KVM-HST-043", "critical")])


def test_a_host_read_twice_rejects_every_file_of_it(tmp_path: Path) -> None:
    one, two = tmp_path / "monday", tmp_path / "tuesday"
    put(one / "web01.json", audit_doc("web01", finding()))
    put(two / "web01.json", audit_doc("web01"))
    put(two / "web02.json", audit_doc("web02", finding(severity="low")))
    put(two / "web03.json", audit_doc("web03"))
    loose = put(tmp_path / "loose.json", audit_doc("WEB02"))  # named on the command line: a claim, the same host
    db, html = tmp_path / "r.db", tmp_path / "fleet.html"
    run = report(one, two, loose, db=db, html=html)
    assert run.returncode == 2
    assert run.stdout.splitlines()[0] == ("fleet: 1 host(s), 1 audited, 0 failed, 4 file(s) rejected (their hosts are "
                                          "not in this report); stored as collection 1")
    rejected = [r for r in run.stdout.splitlines() if r.startswith("  REJECTED ")]
    assert rejected == [
        f"  REJECTED {loose}: host 'WEB02' comes from {two / 'web02.json'} too; every file of this host is rejected",
        f"  REJECTED {one / 'web01.json'}: host 'web01' comes from {two / 'web01.json'} too; every file of this host "
        "is rejected",
        f"  REJECTED {two / 'web01.json'}: host 'web01' comes from {one / 'web01.json'} too; every file of this host "
        "is rejected",
        f"  REJECTED {two / 'web02.json'}: host 'web02' comes from {loose} too; every file of this host is rejected",
    ]
    assert run.stdout.splitlines()[1:5] == rejected  # right under the first line
    assert len(run.stderr.splitlines()) == 4
    assert html.read_text().count("every file of this host is rejected") == 4
    assert list(worst(run.stdout)) == ["web03"]
    assert stored(db) == ([("web03", "ok", 0)], [])


def test_a_report_of_duplicates_only_stores_nothing(tmp_path: Path) -> None:
    put(tmp_path / "a" / "web01.json", audit_doc("web01"))
    put(tmp_path / "b" / "web01.json", audit_doc("web01", finding()))
    db = tmp_path / "r.db"
    run = report(tmp_path / "a", tmp_path / "b", db=db)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.splitlines()[-1] == "kvmtune: no host's result could be read"
    assert not db.exists()  # nothing stored: no collection of no host


def test_a_file_named_on_the_command_line_is_marked_claimed_and_kept_apart_in_history(tmp_path: Path) -> None:
    claimed = put(tmp_path / "from-a-mail.json", audit_doc("db07", finding(), finding("KVM-HST-015", "medium")))
    db, html = tmp_path / "r.db", tmp_path / "fleet.html"
    run = report(claimed, "--save", "--label", "db", db=db, html=html)  # a file named alone is kept only when asked
    assert run.returncode == 0, run.stderr
    assert worst(run.stdout) == {"db07 (claimed)": ["103", "1", "0", "1", "0", "0", "0"]}
    assert "<td>db07<em> (claimed)</em></td>" in html.read_text()
    assert stored(db)[0] == [("db07", "ok", 1)]
    # the fleet's own db07 (its directory file) is not compared with what a claim said: nothing "resolved"
    put(tmp_path / "collected" / "db07.json", audit_doc("db07"))
    run = report(tmp_path / "collected", "--label", "db", db=db)
    assert run.returncode == 0, run.stderr
    assert "Since collection 1 (" in run.stdout and "): 0 new, 0 resolved, 2 not audited this time" in run.stdout
    assert worst(run.stdout) == {"db07": ["0", "0", "0", "0", "0", "0", "0"]}
    assert stored(db)[0] == [("db07", "ok", 1), ("db07", "ok", 0)]


def test_status_documents_and_fqdn_inventory_names_are_accepted(tmp_path: Path) -> None:
    fleet = tmp_path / "collected"
    put(fleet / "web01.example.com.json", audit_doc("web01", finding(severity="high")))  # hostname: the short name
    put(fleet / "down.json", {"kind": "kvmtune-fleet-status", "host": "down", "problem": "unreachable"})
    put(fleet / "liar.json", {"kind": "kvmtune-fleet-status", "host": "web01.example.com", "problem": "x"})
    run = report(fleet, db=tmp_path / "r.db")
    assert run.returncode == 2
    assert f"  REJECTED {fleet / 'liar.json'}: the document says host 'web01.example.com', its file name says 'liar'" \
        in run.stdout
    assert "  FAILED down: unreachable" in run.stdout
    assert worst(run.stdout) == {"web01.example.com": ["10", "0", "1", "0", "0", "0", "0"]}


def test_deeply_nested_json_is_one_line_and_the_fleet_is_still_reported(tmp_path: Path) -> None:
    """Issue 29 item 4: one host's deeply nested JSON was a RecursionError traceback, no host reported."""
    fleet = tmp_path / "collected"
    depth = 200_000
    put(fleet / "deep.json", json.dumps(audit_doc("deep"))[:-1] + ', "extra": ' + "[" * depth + "]" * depth + "}")
    put(fleet / "web01.json", audit_doc("web01", finding()))
    db = tmp_path / "r.db"
    run = report(fleet, db=db)
    assert run.returncode == 2
    assert run.stderr == f"kvmtune: {fleet / 'deep.json'}: JSON nested too deeply to read\n"
    assert f"  REJECTED {fleet / 'deep.json'}: JSON nested too deeply to read" in run.stdout
    assert worst(run.stdout) == {"web01": ["100", "1", "0", "0", "0", "0", "0"]}
    assert stored(db)[0] == [("web01", "ok", 0)]


WRONG_TYPES = {
    "errors-not-array": ({**audit_doc("bad"), "errors": 5}, "errors: expected an array, found a number; rejected"),
    "error-not-string": ({**audit_doc("bad"), "errors": [{"a": 1}]},
                         "errors[0]: expected a string, found an object; rejected"),
    "findings-not-array": ({**audit_doc("bad"), "findings": {"rule": "KVM-HST-043"}},
                           "findings: expected an array, found an object; rejected"),
    "finding-not-object": (audit_doc("bad", 5), "findings[0]: expected an object, found a number; rejected"),
    "target-not-object": (audit_doc("bad", {**finding(), "target": "vm1"}),
                          "findings[0].target: expected an object, found a string; rejected"),
    "domain-not-string": (audit_doc("bad", {**finding(), "target": {"domain": ["vm1"]}}),
                          "findings[0].target.domain: expected a string or null, found an array; rejected"),
    "summary-not-string": (audit_doc("bad", {**finding(), "summary": 1}),
                           "findings[0].summary: expected a string or null, found a number; rejected"),
    "rule-missing": (audit_doc("bad", {k: v for k, v in finding().items() if k != "rule"}),
                     "findings[0].rule: missing; rejected"),
    "host-not-string": (audit_doc(["bad"]), "host: expected a string, found an array; rejected"),
    "status-problem-not-string": ({"kind": "kvmtune-fleet-status", "host": "bad", "problem": True},
                                  "problem: expected a string or null, found true/false; rejected"),
}


@pytest.mark.parametrize("case", sorted(WRONG_TYPES))
def test_a_wrong_json_type_anywhere_is_one_line_naming_the_file(case: str, tmp_path: Path) -> None:
    doc, problem = WRONG_TYPES[case]
    fleet = tmp_path / "collected"
    put(fleet / "bad.json", doc)
    put(fleet / "web01.json", audit_doc("web01", finding()))
    run = report(fleet, db=tmp_path / "r.db")
    assert run.returncode == 2
    assert run.stderr == f"kvmtune: {fleet / 'bad.json'}: {problem}\n"
    assert f"  REJECTED {fleet / 'bad.json'}: {problem}" in run.stdout
    assert worst(run.stdout) == {"web01": ["100", "1", "0", "0", "0", "0", "0"]}


BAD_FINDINGS = {
    "rule-osc-title": (finding(rule=f"{ESC}]0;owned{ESC}\\KVM-HST-043"),
                       "findings[1].rule: '\\x1b]0;owned\\x1b\\\\KVM-HST-043' is not a kvmtune rule id (KVM-XXX-NNN)"),
    "rule-trailing-newline": (finding(rule="KVM-HST-043\n0 findings"),
                              "findings[1].rule: 'KVM-HST-043\\n0 findings' is not a kvmtune rule id (KVM-XXX-NNN)"),
    "rule-arabic-digits": (finding(rule="KVM-HST-\u0661\u0662\u0663"),
                           "findings[1].rule: 'KVM-HST-\u0661\u0662\u0663' is not a kvmtune rule id (KVM-XXX-NNN)"),
    "severity-clear-screen": (finding(severity=f"{ESC}[2J"),
                              "findings[1].severity: '\\x1b[2J' is not one of critical, high, medium, low, info"),
    "severity-made-up": (finding(severity="Critical"),
                         "findings[1].severity: 'Critical' is not one of critical, high, medium, low, info"),
}


@pytest.mark.parametrize("case", sorted(BAD_FINDINGS))
def test_a_finding_outside_the_catalogue_rejects_its_file_visibly(case: str, tmp_path: Path) -> None:
    """Issue 29 item 5: rule and severity were printed raw; now a rule id outside KVM-XXX-NNN or a severity
    outside the five is a problem with that host file (reported, not silently dropped)."""
    bad, problem = BAD_FINDINGS[case]
    fleet = tmp_path / "collected"
    put(fleet / "evil.json", audit_doc("evil", finding(severity="low"), bad))
    put(fleet / "web01.json", audit_doc("web01", finding()))
    db = tmp_path / "r.db"
    run = report(fleet, db=db)
    assert run.returncode == 2
    assert f"  REJECTED {fleet / 'evil.json'}: {problem}; rejected" in run.stdout
    assert run.stderr == f"kvmtune: {fleet / 'evil.json'}: {problem}; rejected\n"
    assert list(worst(run.stdout)) == ["web01"]
    assert stored(db)[0] == [("web01", "ok", 0)]


def test_every_string_from_a_host_file_is_escaped_in_text(tmp_path: Path) -> None:
    fleet = tmp_path / "collected"
    name = f"web{ESC}[2J01"
    put(fleet / f"{name}.json", audit_doc(name, finding(topic=f"cpu{ESC}]0;t{ESC}\\", domain=f"vm{ESC}[1A")))
    put(fleet / "down.json", {"kind": "kvmtune-fleet-status", "host": "down", "problem": f"no{ESC}[31m route"})
    db = tmp_path / "r.db"
    # an earlier collection, as an older kvmtune stored it: a rule id with an escape sequence
    assert report(put(tmp_path / "old.json", audit_doc(name)), "--save", "--label", "other", db=db).returncode == 0
    with sqlite3.connect(db) as c:  # named as the directory's collection is by default (its path)
        c.execute("INSERT INTO fleet_collections (id, created, label) VALUES (2, 0, ?)", (str(fleet.resolve()),))
        c.execute("INSERT INTO fleet_hosts (collection, host, status, problem) VALUES (2, ?, 'ok', '')", (name,))
        c.execute("INSERT INTO fleet_findings (collection, host, rule, severity, topic, domain, device, summary) "
                  "VALUES (2, ?, ?, ?, 'x', 'vm', '', 's')", (name, f"KVM-{ESC}[2J", f"hi{ESC}[8m"))
    run = report(fleet, db=db)  # report() asserts no ESC in stdout or stderr
    assert run.returncode == 0, run.stderr
    assert "  FAILED down: no\\x1b[31m route" in run.stdout
    assert "web\\x1b[2J01" in worst(run.stdout)
    assert "cpu\\x1b]0;t\\x1b\\" in run.stdout
    assert "  - web\\x1b[2J01 KVM-\\x1b[2J hi\\x1b[8m vm" in run.stdout
    assert "  + web\\x1b[2J01 KVM-HST-043 critical vm\\x1b[1A" in run.stdout


def test_a_results_database_from_before_claimed_names_is_used_and_upgraded(tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    with sqlite3.connect(db) as c:  # the fleet tables as the previous kvmtune created them
        c.executescript("""
CREATE TABLE fleet_collections (id INTEGER PRIMARY KEY, created REAL NOT NULL, label TEXT NOT NULL);
CREATE TABLE fleet_hosts (collection INTEGER NOT NULL REFERENCES fleet_collections(id),
    host TEXT NOT NULL, status TEXT NOT NULL, problem TEXT NOT NULL, PRIMARY KEY (collection, host));
CREATE TABLE fleet_findings (collection INTEGER NOT NULL REFERENCES fleet_collections(id),
    host TEXT NOT NULL, rule TEXT NOT NULL, severity TEXT NOT NULL, topic TEXT NOT NULL, domain TEXT NOT NULL,
    device TEXT NOT NULL, summary TEXT NOT NULL);
INSERT INTO fleet_collections VALUES (1, 0, 'old');
INSERT INTO fleet_hosts VALUES (1, 'web01', 'ok', '');
INSERT INTO fleet_findings VALUES (1, 'web01', 'KVM-HST-015', 'medium', 'x', '', '', 's');
""")
    put(tmp_path / "collected" / "web01.json", audit_doc("web01", finding()))
    run = report(tmp_path / "collected", "--label", "old", db=db)  # the old collection's name; no scope either side
    assert run.returncode == 0, run.stderr
    assert "): 1 new, 1 resolved" in run.stdout and "  - web01 KVM-HST-015 medium" in run.stdout
    assert stored(db)[0] == [("web01", "ok", 0), ("web01", "ok", 0)]


def test_a_hostile_results_database_is_refused_by_the_fleet_report_and_left_as_it_is(tmp_path: Path) -> None:
    """The fleet history opens --db through the results store's check: a view is refused before anything is written."""
    db = tmp_path / "r.db"
    with sqlite3.connect(db) as c:
        c.executescript("CREATE VIEW fleet_hosts AS WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) "
                        "SELECT x AS collection, '' AS host, '' AS status, '' AS problem, 0 AS claimed FROM n;")
    before = db.read_bytes()
    put(tmp_path / "collected" / "web01.json", audit_doc("web01", finding()))
    run = report(tmp_path / "collected", db=db)
    assert run.returncode == 2
    assert "not a kvmtune results database" in run.stderr and len(run.stderr.strip().splitlines()) == 1
    assert db.read_bytes() == before
