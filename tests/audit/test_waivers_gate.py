"""Issue 33's gate, end to end through the CLI: a fleet with 3 waived findings, an expired and a stale
waiver, and one finding new since a baseline report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "src" / "kvmtune" / "examples"
SARIF_SCHEMA = Path(sys.prefix) / "share" / "sarif" / "sarif-2.1.0-rtm.5.json"

SETTINGS = """\
# the fleet's waivers
[[waiver]]
rule = "KVM-STO-004"
guest = "app02-*"
target = "disk:vda"
reason = "scratch database: cache=unsafe on purpose"
expires = 2099-12-31
by = "dba team"

[[waiver]]
rule = "KVM-NET-004"
guest = "web01-legacy"
reason = "lab guest behind NAT"

[[waiver]]
rule = "KVM-STO-002"
guest = "web01-legacy"
reason = "until the SAN move"
expires = 2020-01-01

[[waiver]]
rule = "KVM-STO-003"
guest = "gone-*"
reason = "a guest deleted long ago"
"""

METADATA = """<metadata>
    <kvmtune:waiver xmlns:kvmtune="urn:kvmtune:1" rule="KVM-CPU-024" reason="cluster of identical hosts"/>
  </metadata>
  <memory"""


def kvmtune(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    env.pop("KVMTUNE_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "kvmtune", *argv], capture_output=True, text=True, env=env,
                          timeout=120, check=False)


def fleet(root: Path, *, e1000: bool) -> Path:
    """web01 (its NIC e1000 or virtio), db01 carrying a waiver in its <metadata>, app02."""
    root.mkdir()
    web = (EXAMPLES / "web01-legacy.xml").read_text()
    (root / "web01-legacy.xml").write_text(web if e1000 else web.replace("<model type='e1000'/>", "<model type='virtio'/>"))
    db = (EXAMPLES / "db01-tuned.xml").read_text()
    assert "<memory" in db
    (root / "db01-tuned.xml").write_text(db.replace("<memory", METADATA, 1))
    app = (EXAMPLES / "app02-clone.xml").read_text().replace("52:54:00:6b:3c:01", "52:54:00:6b:3c:09")
    (root / "app02-clone.xml").write_text(app)  # a clone of web01 with its own MAC
    return root


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("gate")
    before = fleet(tmp / "before", e1000=False)
    now = fleet(tmp / "now", e1000=True)
    config = tmp / "kvmtune.toml"
    config.write_text(SETTINGS)
    config.chmod(0o644)
    baseline = tmp / "baseline.json"
    done = kvmtune("audit", "--config", str(config), "--format", "json", "-o", str(baseline), str(before))
    assert done.returncode == 0, done.stderr
    return {"now": now, "before": before, "config": config, "baseline": baseline}


def test_the_gate_fails_on_exactly_the_new_finding(setup: dict[str, Path]) -> None:
    done = kvmtune("audit", "--config", str(setup["config"]), "--fail-on", "high", "--new-since", str(setup["baseline"]),
                   "--format", "json", str(setup["now"]))
    assert done.returncode == 1, done.stderr
    doc = json.loads(done.stdout)
    failing = [(f["rule"], f["target"]["domain"]) for f in doc["findings"]
               if not f.get("waiver") and f["new"] and f["severity"] in ("high", "critical")]
    assert failing == [("KVM-NET-001", "web01-legacy")]
    assert [f["rule"] for f in doc["findings"] if f["new"]] == ["KVM-NET-001"]
    assert doc["baseline"]["new"] == 1
    # the old high findings (KVM-STO-001, and KVM-STO-002 whose waiver expired) are there but do not fail it
    old_high = {f["rule"] for f in doc["findings"] if f["severity"] == "high" and not f["new"]}
    assert {"KVM-STO-001", "KVM-STO-002"} <= old_high
    # the same fleet without the new finding passes the same gate
    same = kvmtune("audit", "--config", str(setup["config"]), "--fail-on", "high", "--new-since", str(setup["baseline"]),
                   str(setup["before"]))
    assert same.returncode == 0, same.stdout + same.stderr
    # and without the baseline, the gate fails on the old findings too
    assert kvmtune("audit", "--config", str(setup["config"]), "--fail-on", "high", str(setup["before"])).returncode == 1


def test_three_waived_findings_still_shown_and_counted_apart(setup: dict[str, Path]) -> None:
    done = kvmtune("audit", "--config", str(setup["config"]), "--format", "json", str(setup["now"]))
    doc = json.loads(done.stdout)
    waived = sorted((f["rule"], f["target"]["domain"], f["waiver"]["reason"]) for f in doc["findings"] if f.get("waiver"))
    assert waived == [
        ("KVM-CPU-024", "db01-tuned", "cluster of identical hosts"),
        ("KVM-NET-004", "web01-legacy", "lab guest behind NAT"),
        ("KVM-STO-004", "app02-clone", "scratch database: cache=unsafe on purpose"),
    ]
    assert doc["summary"]["waived"] == 3
    assert doc["summary"]["findings"] == len(doc["findings"]) - 3
    # the CRITICAL cache=unsafe finding is waived: --fail-on critical passes
    assert kvmtune("audit", "--config", str(setup["config"]), "--fail-on", "critical", str(setup["now"])).returncode == 0
    assert kvmtune("audit", "--config", str(setup["config"]), "--no-waivers", "--fail-on", "critical",
                   str(setup["now"])).returncode == 1


def test_sarif_validates_and_carries_three_suppressions(setup: dict[str, Path]) -> None:
    done = kvmtune("audit", "--config", str(setup["config"]), "--format", "sarif", "--new-since", str(setup["baseline"]),
                   str(setup["now"]))
    doc = json.loads(done.stdout)
    jsonschema.validate(doc, json.loads(SARIF_SCHEMA.read_text()), cls=jsonschema.Draft4Validator)
    suppressed = [r for r in doc["runs"][0]["results"] if r.get("suppressions")]
    assert len(suppressed) == 3
    assert all(r["suppressions"][0]["kind"] == "external" and r["suppressions"][0]["justification"] for r in suppressed)
    assert [r["ruleId"] for r in doc["runs"][0]["results"] if r["baselineState"] == "new"] == ["KVM-NET-001"]


def test_expired_and_stale_waivers_are_one_line_each(setup: dict[str, Path]) -> None:
    config = str(setup["config"])
    done = kvmtune("audit", "--config", config, str(setup["now"]))
    notes = [line for line in done.stdout.splitlines() if line.startswith("note: ")]
    assert len(notes) == 2, done.stdout
    expired, stale = notes
    assert expired.startswith("note: expired waiver KVM-STO-002 guest=web01-legacy") and "ended 2020-01-01" in expired
    assert f"{config}:15" in expired
    assert stale.startswith("note: stale waiver KVM-STO-003 guest=gone-*") and f"{config}:21" in stale
    # the expired waiver no longer waives: its finding is shown as a finding
    assert "HIGH     KVM-STO-002" in done.stdout
    # waived findings: one line each, with the reason and the end date
    assert "WAIVED   KVM-STO-004" in done.stdout and "waived: scratch database: cache=unsafe on purpose (until 2099-12-31)" \
        in done.stdout
    assert ", 3 waived;" in done.stdout or ", 3 waived" in done.stdout
    # machine formats carry the notes and say them on stderr
    js = kvmtune("audit", "--config", config, "--format", "json", str(setup["now"]))
    assert len(json.loads(js.stdout)["waiver_notes"]) == 2
    assert sum(1 for line in js.stderr.splitlines() if "waiver" in line) == 2


def test_show_waived_prints_them_in_full_and_no_waivers_applies_none(setup: dict[str, Path]) -> None:
    shown = kvmtune("audit", "--config", str(setup["config"]), "--show-waived", str(setup["now"]))
    assert "CRITICAL KVM-STO-004" in shown.stdout
    assert "waived: scratch database: cache=unsafe on purpose (until 2099-12-31) by dba team" in shown.stdout
    none = kvmtune("audit", "--config", str(setup["config"]), "--no-waivers", str(setup["now"]))
    assert "waived" not in none.stdout and "note:" not in none.stdout


def test_prometheus_counts_waived_findings_in_their_own_series(setup: dict[str, Path]) -> None:
    done = kvmtune("audit", "--config", str(setup["config"]), "--format", "prometheus", str(setup["now"]))
    waived = [line for line in done.stdout.splitlines() if line.startswith("kvmtune_audit_waived_findings{")]
    assert len(waived) == 3 and all(line.endswith(" 1") for line in waived)
    assert not any(line.startswith("kvmtune_audit_findings{") and 'rule="KVM-STO-004"' in line
                   for line in done.stdout.splitlines())
    assert 'kvmtune_audit_waiver_notes{host=' in done.stdout


def test_the_baseline_can_be_a_fleet_collection(setup: dict[str, Path], tmp_path: Path) -> None:
    """`--new-since db:LABEL`: the newest fleet collection of that name stands in for the earlier report."""
    doc = json.loads(setup["baseline"].read_text())
    collected = tmp_path / "collected"
    collected.mkdir()
    (collected / f"{doc['host']}.json").write_text(json.dumps(doc))  # what the role fetches: one file per host
    db = tmp_path / "r.db"
    stored = kvmtune("report", str(collected), "--db", str(db), "--label", "prod")
    assert stored.returncode == 0, stored.stdout + stored.stderr
    done = kvmtune("audit", "--config", str(setup["config"]), "--fail-on", "high", "--new-since", "db:prod",
                   "--db", str(db), "--format", "json", str(setup["now"]))
    assert done.returncode == 1, done.stderr
    assert [f["rule"] for f in json.loads(done.stdout)["findings"] if f["new"]] == ["KVM-NET-001"]
    same = kvmtune("audit", "--config", str(setup["config"]), "--fail-on", "high", "--new-since", "db:prod",
                   "--db", str(db), str(setup["before"]))
    assert same.returncode == 0, same.stdout + same.stderr
    missing = kvmtune("audit", "--new-since", "db:staging", "--db", str(db), str(setup["before"]))
    assert missing.returncode == 2 and "no fleet collection named 'staging'" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1


def test_a_new_finding_says_new_in_its_header(setup: dict[str, Path]) -> None:
    """Issue 46 item 7: with --new-since, the text report marks a new finding in its header line, not only below it."""
    done = kvmtune("audit", "--config", str(setup["config"]), "--new-since", str(setup["baseline"]), "--color", "never",
                   str(setup["now"]))
    headers = [ln for ln in done.stdout.splitlines() if ln.startswith("    ") and " KVM-" in ln[:30]]
    new = [ln for ln in headers if " NEW " in ln]
    assert len(new) == 1 and new[0].split()[1:3] == ["KVM-NET-001", "NEW"], new
    assert "             new: not in " in done.stdout
    assert all(" NEW " not in ln for ln in headers if "KVM-NET-001" not in ln)
