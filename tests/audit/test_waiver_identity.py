"""Issue 43 item 3, through the CLI: a guest's <metadata> waiver is bound to that guest, not to a pattern made
of its UUID or name. A definition with <uuid>*</uuid> or <name>*</name> waives no other guest's finding, and
--fail-on still fails on the other guest; a waiver naming less than a rule group is ignored with one line; every
waived finding says where its waiver was written, in all four formats."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LEGACY = (REPO / "src" / "kvmtune" / "examples" / "web01-legacy.xml").read_text()
MAC = "52:54:00:6b:3c:01"
WAIVERS = """<metadata>
    <k:waiver xmlns:k="urn:kvmtune:1" rule="KVM-" reason="everything, everywhere"/>
    <k:waiver xmlns:k="urn:kvmtune:1" rule="KVM-STO" reason="my own disks"/>
    <k:waiver xmlns:k="urn:kvmtune:1" rule="KVM-NET" reason="my own NIC"/>
  </metadata>
  <memory"""
VICTIM_HIGH = {"KVM-STO-001", "KVM-STO-002", "KVM-NET-001"}


def kvmtune(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    env.pop("KVMTUNE_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "kvmtune", *argv], capture_output=True, text=True, env=env,
                          timeout=120, check=False)


def hostile(name: str, uuid: str | None) -> str:
    """web01-legacy again, as another guest (its own MAC) carrying waivers in its <metadata>."""
    xml = LEGACY.replace("<name>web01-legacy</name>", f"<name>{name}</name>" + (f"<uuid>{uuid}</uuid>" if uuid else ""))
    return xml.replace(MAC, "52:54:00:aa:bb:01").replace("<memory", WAIVERS, 1)


def fleet(tmp_path: Path, name: str, uuid: str | None) -> Path:
    d = tmp_path / "domains"
    d.mkdir()
    (d / "victim.xml").write_text(LEGACY)
    (d / "hostile.xml").write_text(hostile(name, uuid))
    return d


CASES = {"uuid-star": ("hostile", "*"), "name-star": ("*", None), "same-name": ("web01-legacy", None),
         "same-name-and-uuid-glob": ("web01-legacy", "*")}


@pytest.mark.parametrize("case", CASES)
def test_a_metadata_waiver_waives_no_other_guest(tmp_path: Path, case: str) -> None:
    name, uuid = CASES[case]
    d = fleet(tmp_path, name, uuid)
    gate = kvmtune("audit", "--no-config", "--fail-on", "high", str(d))
    assert gate.returncode == 1, gate.stdout + gate.stderr  # the victim's high findings count
    done = kvmtune("audit", "--no-config", "--format", "json", str(d))
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["errors"] == []
    victim = [f for f in doc["findings"] if f["source"].endswith("victim.xml")]
    own = [f for f in doc["findings"] if f["source"].endswith("hostile.xml")]
    assert {f["rule"] for f in victim if f["severity"] == "high"} >= VICTIM_HIGH
    assert [f["rule"] for f in victim if "waiver" in f] == []
    # its own disk and NIC findings are waived, by the group waivers, bound to it
    assert {f["rule"] for f in own if "waiver" in f} >= VICTIM_HIGH
    w = next(f["waiver"] for f in own if f["rule"] == "KVM-STO-002")
    assert w["origin"] == f"<metadata> of {name}" and w["guest"] == name
    assert w["guest_source"] == str(d / "hostile.xml")
    # rule="KVM-" is ignored, in one line naming the guest; it is no input error
    ignored = [n for n in doc["waiver_notes"] if "names less than a rule group" in n]
    assert ignored == [f"{d / 'hostile.xml'}: <metadata> waiver 1 of guest {name}: rule 'KVM-' names less than a "
                       "rule group (KVM-STO, KVM-NET, …); ignored"]
    assert sum(1 for line in done.stderr.splitlines() if "names less than a rule group" in line) == 1
    if uuid == "*":
        assert f"{d / 'hostile.xml'}: guest {name}'s UUID '*' is not a UUID; audited without one" in doc["looked_at"]
        assert all("uuid" not in f["target"] for f in doc["findings"])


def test_every_format_says_where_a_waiver_was_written(tmp_path: Path) -> None:
    d = fleet(tmp_path, "hostile", "*")
    text = kvmtune("audit", "--no-config", str(d))
    waived = [line for line in text.stdout.splitlines() if line.lstrip().startswith("WAIVED")]
    assert waived and all(line.endswith(" [<metadata> of hostile]") for line in waived), text.stdout
    assert "note: " in text.stdout and "rule 'KVM-' names less than a rule group" in text.stdout
    sarif = json.loads(kvmtune("audit", "--no-config", "--format", "sarif", str(d)).stdout)
    suppressions = [r["suppressions"][0] for r in sarif["runs"][0]["results"] if r.get("suppressions")]
    assert suppressions and all(s["justification"].endswith(" [<metadata> of hostile]") for s in suppressions)
    assert all(s["properties"]["guest_source"] == str(d / "hostile.xml") for s in suppressions)
    prom = kvmtune("audit", "--no-config", "--format", "prometheus", str(d)).stdout
    series = [line for line in prom.splitlines() if line.startswith("kvmtune_audit_waived_findings{")]
    assert series and all('waiver="<metadata> of hostile"' in line for line in series)
    # and a settings file's waiver says FILE:LINE
    config = tmp_path / "k.toml"
    config.write_text('[[waiver]]\nrule = "KVM-STO-002"\nguest = "web01-*"\nreason = "until the SAN move"\n')
    config.chmod(0o644)
    text = kvmtune("audit", "--config", str(config), str(d / "victim.xml"))
    assert "WAIVED   KVM-STO-002" in text.stdout and f"until the SAN move [{config}:1]" in text.stdout


def test_a_metadata_waiver_takes_a_slug_as_a_settings_file_does(tmp_path: Path) -> None:
    """Issue 46 item 7: rule="disk-cache-writethrough" in <metadata> waives KVM-STO-002 of that guest (the waiver
    keeps the id); a slug prefix naming several rules is an error line with their ids, as in a settings file."""
    xml = LEGACY.replace("<memory", """<metadata>
    <k:waiver xmlns:k="urn:kvmtune:1" rule="disk-cache-writethrough" reason="a scratch guest"/>
    <k:waiver xmlns:k="urn:kvmtune:1" rule="disk-" reason="too wide"/>
  </metadata>
  <memory""", 1)
    path = tmp_path / "web01.xml"
    path.write_text(xml)
    done = kvmtune("audit", "--no-config", "--format", "json", str(path))
    report = json.loads(done.stdout)
    waived = {f["rule"] for f in report["findings"] if f.get("waiver")}
    assert waived == {"KVM-STO-002"}, waived
    assert "slug prefix 'disk-' names" in done.stdout + done.stderr and "KVM-STO-001" in done.stdout + done.stderr
