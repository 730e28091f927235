"""`kvmtune audit --format json -o A --also prometheus=B`: one audit, written in several formats, so the audit
service's JSON and textfile describe the same moment (issue 46 item 7)."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def kvmtune(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run([sys.executable, "-m", "kvmtune", *argv], capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=120, check=False)


def test_one_audit_is_written_as_json_and_as_prometheus_text(tmp_path: Path) -> None:
    done = kvmtune("audit", "--examples", "--no-images", "--no-config", "--format", "json", "-o", "audit.json",
                   "--also", "prometheus=kvmtune.prom", "--also", "sarif=audit.sarif", cwd=tmp_path)
    assert done.returncode == 0 and done.stdout == "", done.stderr
    doc = json.loads((tmp_path / "audit.json").read_text())
    prom = (tmp_path / "kvmtune.prom").read_text()
    (stamp,) = re.findall(r"^kvmtune_audit_timestamp_seconds\{[^}]*\} (\S+)$", prom, flags=re.M)
    # one audit, one moment (the textfile's gauges carry 9 significant digits: a Unix time to 10 s)
    assert abs(float(stamp) - dt.datetime.fromisoformat(doc["generated"]).timestamp()) < 10
    counted = sum(int(v) for v in re.findall(r"^kvmtune_audit_findings\{[^}]*\} (\d+)$", prom, flags=re.M))
    assert counted == doc["summary"]["findings"]
    assert json.loads((tmp_path / "audit.sarif").read_text())["version"] == "2.1.0"


def test_also_takes_a_known_format_and_a_file(tmp_path: Path) -> None:
    for bad in ("bogus=x", "prometheus", "prometheus=", "json=-"):
        done = kvmtune("audit", "--examples", "--no-config", "--also", bad, cwd=tmp_path)
        assert done.returncode == 2 and f"argument --also: {bad!r}: expected FORMAT=FILE" in done.stderr
    assert list(tmp_path.iterdir()) == []
