"""fix and waivers (issue 33): a waived finding is left alone unless its rule is named on the command line;
the settings file's journal_dir is where fix --apply journals."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LEGACY = REPO / "src" / "kvmtune" / "examples" / "web01-legacy.xml"
WAIVER = '[[waiver]]\nrule = "KVM-STO-002"\nguest = "web01-*"\ntarget = "disk:hda"\nreason = "until the SAN move"\n'


def kvmtune(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    env.pop("KVMTUNE_CONFIG", None)
    env.pop("KVMTUNE_JOURNAL_DIR", None)
    return subprocess.run([sys.executable, "-m", "kvmtune", *argv], capture_output=True, text=True, env=env,
                          timeout=120, check=False)


def settings(tmp_path: Path, text: str) -> str:
    path = tmp_path / "kvmtune.toml"
    path.write_text(text)
    path.chmod(0o644)
    return str(path)


def test_fix_leaves_a_waived_finding_alone_unless_its_rule_is_named(tmp_path: Path) -> None:
    config = settings(tmp_path, WAIVER)
    done = kvmtune("fix", "--config", config, str(LEGACY))
    assert done.returncode == 0, done.stderr
    assert "cache writethrough → none" not in done.stdout
    assert "KVM-STO-010" in done.stdout  # the rest is still fixed
    skipped = [line for line in done.stdout.splitlines() if "not fixed: waived" in line]
    assert len(skipped) == 1 and skipped[0].startswith("skipped: web01-legacy: KVM-STO-002 disk:hda: ")
    assert f"waived (until the SAN move; {tmp_path}/kvmtune.toml:1); name the rule (--only KVM-STO-002)" in skipped[0]
    named = kvmtune("fix", "--config", config, "--only", "KVM-STO-002", str(LEGACY))
    assert "cache writethrough → none" in named.stdout and "waived" not in named.stdout
    unwaived = kvmtune("fix", "--config", config, "--no-waivers", str(LEGACY))
    assert "cache writethrough → none" in unwaived.stdout


def test_fix_honours_a_waiver_in_the_domains_metadata(tmp_path: Path) -> None:
    xml = LEGACY.read_text().replace(
        "<memory", '<metadata><k:waiver xmlns:k="urn:kvmtune:1" rule="KVM-STO-002" reason="vendor says so"/></metadata>\n'
        "  <memory", 1)
    domain = tmp_path / "web01.xml"
    domain.write_text(xml)
    done = kvmtune("fix", "--no-config", str(domain))
    assert "cache writethrough → none" not in done.stdout and "not fixed: waived (vendor says so;" in done.stdout


def test_an_expired_waiver_does_not_stop_fix(tmp_path: Path) -> None:
    config = settings(tmp_path, WAIVER + "expires = 2020-01-01\n")
    assert "cache writethrough → none" in kvmtune("fix", "--config", config, str(LEGACY)).stdout


def test_fix_apply_journals_in_the_settings_journal_dir(tmp_path: Path) -> None:
    journals = tmp_path / "journals"
    config = settings(tmp_path, f'journal_dir = "{journals}"\n')
    domain = tmp_path / "web01.xml"
    domain.write_text(LEGACY.read_text())
    done = kvmtune("fix", "--config", config, "--apply", "--yes", str(domain))
    assert done.returncode == 0, done.stderr
    assert len(list(journals.glob("*.json"))) == 1
    listed = kvmtune("undo", "--list", "--config", config)
    assert listed.returncode == 0 and "web01.xml" in listed.stdout
