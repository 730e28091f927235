"""The fleet report's staged count per host (issue 48, item 2): ``kvmtune audit --staged`` adds ``staged`` (what
``kvmtune fix --status`` lists, counted) to a host's audit JSON; ``kvmtune report`` shows it per host. A host file is
hostile input: ``staged`` is checked for types, bounds and sums, and a key written twice anywhere rejects the file.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from kvmtune import cli

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"
ESC = "\x1b"


def _audit(root: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    assert cli.main(["audit", "--host", "--root", str(root), "--format", "json", "--no-config", *extra]) in (0, 1)
    return dict(json.loads(capsys.readouterr().out))


def _doc(host: str, staged: object = None, *, raw_staged: str | None = None) -> str:
    doc: dict[str, Any] = {"schema_version": 1, "tool": {"name": "kvmtune", "version": "0.1.0"}, "host": host,
                           "generated": "2026-01-01T00:00:00+00:00", "looked_at": [], "scope": ["host"],
                           "summary": {"findings": 0, "by_severity": {}, "errors": 0}, "findings": [], "errors": []}
    if staged is not None:
        doc["staged"] = staged
    text = json.dumps(doc)
    if raw_staged is not None:
        text = text[:-1] + f', "staged": {raw_staged}}}'
    return text


def _report(paths: list[Path], tmp: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str, str]:
    html = tmp / "f.html"
    code = cli.main(["report", *map(str, paths), "--db", str(tmp / "r.db"), "--html", str(html), "--no-config"])
    out = capsys.readouterr()
    return code, out.out, out.err, html.read_text() if html.exists() else ""


def test_a_host_with_staged_drop_ins_reports_them_and_the_fleet_counts_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real path: `fix --host --apply` on a host tree writes drop-ins read at the next boot (host-boot) and
    runtime values (live); `audit --staged` counts the drop-ins as staged; the fleet report shows the count."""
    tree = tmp_path / "tree"
    shutil.copytree(FIXTURES / "rhel6-old", tree, symlinks=True)
    assert _audit(tree, capsys, "--staged")["staged"] == {
        "changes": 0, "by_takes_effect": {}, "cannot_tell": 0, "journals": 0, "refused_journals": 0}
    assert cli.main(["fix", "--host", "--root", str(tree), "--apply", "--yes", "--no-config"]) == 0
    capsys.readouterr()
    assert cli.main(["fix", "--status", "--root", str(tree), "--no-config", "--format", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)["staged"]
    doc = _audit(tree, capsys, "--staged")
    assert doc["staged"]["changes"] == len(listed) > 0
    assert doc["staged"]["by_takes_effect"] == {"host-boot": len(listed)}
    assert doc["staged"]["journals"] == 1
    assert "staged" not in _audit(tree, capsys)  # only when asked: reading journals is not what audit does
    fleet = tmp_path / "collected"
    fleet.mkdir()
    doc["host"] = "hv1"
    (fleet / "hv1.json").write_text(json.dumps(doc))
    (fleet / "hv2.json").write_text(_doc("hv2"))  # an older role's audit: no staged
    (fleet / "hv3.json").write_text(_doc("hv3", {"changes": 0, "by_takes_effect": {}}))
    code, out, _err, html = _report([fleet], tmp_path, capsys)
    assert code in (0, 1), out
    table = out.split("Worst hosts")[1].split("\n\n")[0].splitlines()
    assert table[1].split()[-2:] == ["ERRORS", "STAGED"]
    assert {r.split()[0]: r.split()[-1] for r in table[2:]} == {"hv1": str(len(listed)), "hv2": "-", "hv3": "0"}
    assert f"  hv1: {len(listed)} ({len(listed)} host-boot)" in out
    assert "1 host(s) with none staged; 1 host(s) did not report it (an audit without --staged)" in out
    assert "<th>staged fixes</th>" in html and f'title="{len(listed)} host-boot">{len(listed)}</td>' in html


def test_without_any_staged_host_the_table_is_as_before(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fleet = tmp_path / "collected"
    fleet.mkdir()
    (fleet / "hv1.json").write_text(_doc("hv1"))
    _code, out, _err, html = _report([fleet], tmp_path, capsys)
    assert "STAGED" not in out and "Staged fixes" not in out and "staged fixes" not in html


GOOD = {"changes": 3, "by_takes_effect": {"restart": 2, "host-boot": 1}, "cannot_tell": 1, "journals": 2,
        "refused_journals": 0}


@pytest.mark.parametrize(
    ("staged", "raw", "problem"),
    [
        ([3], None, "staged: expected an object, found an array; rejected"),
        ("3", None, "staged: expected an object, found a string"),
        ({"by_takes_effect": {}}, None, "staged.changes: missing; rejected"),
        ({**GOOD, "changes": True}, None, "staged.changes: expected a whole number, found true/false"),
        ({**GOOD, "changes": 3.0}, None, "staged.changes: expected a whole number, found a number"),
        ({**GOOD, "changes": "3"}, None, "staged.changes: expected a whole number, found a string"),
        ({**GOOD, "changes": -1}, None, "staged.changes: -1 is not between 0 and 10000000"),
        ({"changes": 10**12, "by_takes_effect": {"restart": 10**12}}, None, "is not between 0 and 10000000"),
        ({**GOOD, "by_takes_effect": [2, 1]}, None, "staged.by_takes_effect: expected an object, found an array"),
        ({**GOOD, "by_takes_effect": {"restart": 2, "soon": 1}}, None, "'soon' is not one of live, restart"),
        ({**GOOD, "by_takes_effect": {"restart\u2028": 3}}, None, "'restart\\u2028' is not one of"),
        ({**GOOD, "by_takes_effect": {"restart*": 3}}, None, "'restart*' is not one of"),
        ({**GOOD, "by_takes_effect": {"\x1b[2J": 3}}, None, "'\\x1b[2J' is not one of"),
        ({**GOOD, "by_takes_effect": {"restart": 2, "host-boot": -1}}, None, "host-boot: -1 is not between"),
        ({**GOOD, "by_takes_effect": {"restart": 2}}, None, "by_takes_effect adds up to 2, not the 3 changes"),
        ({**GOOD, "by_takes_effect": {"restart": 2, "host-boot": 2}}, None, "adds up to 4, not the 3 changes"),
        ({**GOOD, "cannot_tell": 4}, None, "staged.cannot_tell: 4 is not between 0 and 3"),
        ({**GOOD, "journals": None}, None, "staged.journals: expected a whole number, found null"),
        (None, '{"changes": 1, "by_takes_effect": {"restart": 1}, "changes": 0}',
         "key 'changes' written twice in one object"),
        (None, '{"changes": 2, "by_takes_effect": {"restart": 1, "restart": 1}}',
         "key 'restart' written twice in one object"),
        (GOOD, '{"changes": 0, "by_takes_effect": {}}', "key 'staged' written twice in one object"),
        (None, "1" + "0" * 5000, "not JSON"),
        # round five (no hole found): JSON's non-numbers, a float past any count, a string of control characters
        (None, '{"changes": NaN, "by_takes_effect": {}}', "staged.changes: expected a whole number, found a number"),
        (None, '{"changes": Infinity, "by_takes_effect": {}}', "staged.changes: expected a whole number, found a"),
        (None, '{"changes": 1, "by_takes_effect": {"restart": -Infinity}}', "restart: expected a whole number"),
        (None, '{"changes": 1e308, "by_takes_effect": {}}', "staged.changes: expected a whole number, found a"),
        ({**GOOD, "changes": "3\x1b[2J\u202e"}, None, "staged.changes: expected a whole number, found a string"),
        ({**GOOD, "by_takes_effect": {"restart": 2, "host-boot": 1.5}}, None, "host-boot: expected a whole number"),
    ],
)
def test_a_hostile_staged_field_rejects_that_host_only(
    staged: object, raw: str | None, problem: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = tmp_path / "collected"
    fleet.mkdir()
    (fleet / "evil.json").write_text(_doc("evil", staged, raw_staged=raw))
    (fleet / "hv1.json").write_text(_doc("hv1", GOOD))
    code, out, err, html = _report([fleet], tmp_path, capsys)
    assert code == 2
    (line,) = [x for x in err.splitlines() if "evil.json" in x]
    assert problem in line, line
    assert f"  REJECTED {fleet / 'evil.json'}: " in out
    table = out.split("Worst hosts")[1].split("\n\n")[0].splitlines()
    assert [r.split()[0] for r in table[2:]] == ["hv1"] and table[2].split()[-1] == "3"
    assert ESC not in out and ESC not in err and ESC not in html


def test_a_duplicate_key_in_a_finding_rejects_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Python's json keeps the last of two keys: a finding saying "critical" to one reader and "info" to this one."""
    fleet = tmp_path / "collected"
    fleet.mkdir()
    text = _doc("hv1").replace('"findings": []', '"findings": [{"rule": "KVM-HST-043", "severity": "critical", '
                                                 '"severity": "info", "target": {}}]')
    (fleet / "hv1.json").write_text(text)
    code, _out, err, _html = _report([fleet], tmp_path, capsys)
    assert code == 2 and "key 'severity' written twice in one object; rejected" in err
