"""JSON, SARIF and text output."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jsonschema
import pytest

from kvmtune.cli import main

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "src" / "kvmtune" / "examples"
SARIF_SCHEMA = Path(sys.prefix) / "share" / "sarif" / "sarif-2.1.0-rtm.5.json"
FINDING_KEYS = {"rule", "slug", "topic", "severity", "confidence", "target", "actual", "expected",
                "evidence", "summary", "why", "fix", "references", "source"}


def test_sarif_validates_against_official_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert SARIF_SCHEMA.is_file(), f"{SARIF_SCHEMA} missing: scripts/install.sh fetches it"
    assert main(["audit", "--format", "sarif", str(EXAMPLES)]) == 0
    doc = json.loads(capsys.readouterr().out)
    schema = json.loads(SARIF_SCHEMA.read_text())
    jsonschema.validate(doc, schema, cls=jsonschema.Draft4Validator)
    run = doc["runs"][0]
    assert run["results"], "examples must produce results"
    rules = run["tool"]["driver"]["rules"]
    for res in run["results"]:
        assert rules[res["ruleIndex"]]["id"] == res["ruleId"]


def test_sarif_schema_check_is_not_vacuous() -> None:
    schema = json.loads(SARIF_SCHEMA.read_text())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"version": "2.1.0", "runs": [{"results": []}]}, schema, cls=jsonschema.Draft4Validator)


def test_json_findings_follow_design_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "--format", "json", str(EXAMPLES / "web01-legacy.xml")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema_version"] == 1
    f = next(f for f in doc["findings"] if f["rule"] == "KVM-STO-002")
    assert set(f) == FINDING_KEYS
    assert f["target"] == {"host": "localhost", "domain": "web01-legacy", "device": "disk:hda"}
    assert f["severity"] == "high" and f["topic"] == "disk-cache"
    assert f["evidence"] == "/domain/devices/disk[1]/driver/@cache"
    assert set(f["fix"]) == {"kind", "description", "safe", "takes_effect"}
    assert f["fix"]["takes_effect"] == "new-instances"  # a domain file: domains defined from it


def test_text_report_groups_and_summarises(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "--color", "never", str(EXAMPLES / "web01-legacy.xml")]) == 0
    out = capsys.readouterr().out
    assert "== web01-legacy" in out and "  disk:hda" in out
    assert "\033[" not in out
    last = out.strip().splitlines()[-1]
    assert last.startswith(tuple(f"{n} findings" for n in range(1, 200)))
    assert "1 guest(s) audited" in last
    assert main(["audit", "--color", "always", str(EXAMPLES / "web01-legacy.xml")]) == 0
    assert "\033[1;31mHIGH" in capsys.readouterr().out
