"""fix / --apply / undo on domain XML files: dry run, atomic rewrite, journal, exact undo."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from fixhelpers import FIXTURE_HOST, GOLDEN

from kvmtune.audit.engine import select_rules
from kvmtune.cli import main
from kvmtune.errors import KvmtuneError
from kvmtune.fix.apply import apply_plan
from kvmtune.fix.domains import plan_files
from kvmtune.fix.plan import Plan
from kvmtune.fix.registry import FixOptions
from kvmtune.host.root import HostRoot

LEGACY = GOLDEN / "ALL" / "legacy-everything.in.xml"
LEGACY_OUT = GOLDEN / "ALL" / "legacy-everything.out.xml"


@pytest.fixture
def legacy(tmp_path: Path) -> Path:
    p = tmp_path / "legacy.xml"
    shutil.copyfile(LEGACY, p)
    os.chmod(p, 0o640)
    return p


def _journal_id(out: str) -> str:
    line = next(ln for ln in out.splitlines() if ln.startswith("Undo with: kvmtune undo "))
    return line.rsplit(" ", 1)[1]


def _rules_in(path: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    assert main(["audit", "--format", "json", "--root", str(FIXTURE_HOST), str(path)]) in (0, 1)
    return [f["rule"] for f in json.loads(capsys.readouterr().out)["findings"]]


def test_dry_run_prints_diff_and_changes_nothing(legacy: Path, journal_dir: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    before = legacy.read_bytes()
    assert main(["fix", str(legacy)]) == 0
    out = capsys.readouterr().out
    assert f"--- {legacy}" in out and f"+++ {legacy}" in out
    assert "# KVM-STO-002 disk:hda: cache writethrough → none" in out
    assert "-      <driver name='qemu' type='qcow2' cache='writethrough'/>" in out
    assert "only with --allow-bus-change" in out  # the IDE disk and the rtl8139 NIC wait for the flag
    assert "nothing changed (run again with --apply)" in out
    assert legacy.read_bytes() == before
    assert list(journal_dir.iterdir()) == []


def test_apply_then_fix_again_then_undo(legacy: Path, journal_dir: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    before = legacy.read_bytes()
    fixed_before = set(_rules_in(legacy, capsys))
    assert main(["fix", "--apply", "--yes", "--allow-bus-change", str(legacy)]) == 0
    out = capsys.readouterr().out
    jid = _journal_id(out)
    assert legacy.read_bytes() == LEGACY_OUT.read_bytes()
    assert stat.S_IMODE(legacy.stat().st_mode) == 0o640
    assert not [p for p in legacy.parent.iterdir() if ".kvmtune-" in p.name], "no temp file left behind"

    # idempotent: the second run plans nothing
    assert main(["fix", "--apply", "--yes", "--allow-bus-change", str(legacy)]) == 0
    assert "Nothing to change." in capsys.readouterr().out

    # re-audit: what was fixed is gone, what has no fixer is still reported
    after = set(_rules_in(legacy, capsys))
    assert {"KVM-STO-001", "KVM-STO-002", "KVM-NET-001", "KVM-MEM-002", "KVM-SEC-001"} <= fixed_before
    assert not after & {"KVM-STO-001", "KVM-STO-002", "KVM-NET-001", "KVM-MEM-002", "KVM-SEC-001"}

    journal = json.loads((journal_dir / f"{jid}.json").read_text())
    assert journal["state"] == "applied"
    assert journal["changes"][0]["kind"] == "file"
    assert journal["changes"][0]["status"] == "done"

    assert main(["undo", "--list"]) == 0
    assert jid in capsys.readouterr().out

    assert main(["undo", jid]) == 0
    assert "restored" in capsys.readouterr().out
    assert legacy.read_bytes() == before
    assert stat.S_IMODE(legacy.stat().st_mode) == 0o640

    assert main(["undo", jid]) == 0
    assert "undone already" in capsys.readouterr().out
    assert legacy.read_bytes() == before


def test_only_and_skip_choose_rules(legacy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fix", "--only", "KVM-STO-002", str(legacy)]) == 0
    out = capsys.readouterr().out
    assert "KVM-STO-002" in out and "KVM-SEC-001" not in out and "KVM-NET" not in out
    assert main(["fix", "--skip", "KVM-STO,KVM-NET", str(legacy)]) == 0
    out = capsys.readouterr().out
    assert "KVM-SEC-001" in out and "# KVM-STO" not in out and "# KVM-NET" not in out


def test_undo_refuses_a_file_changed_after_apply(legacy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = legacy.read_bytes()
    assert main(["fix", "--apply", "--yes", str(legacy)]) == 0
    jid = _journal_id(capsys.readouterr().out)
    edited = legacy.read_bytes().replace(b"team-a", b"team-b")
    legacy.write_bytes(edited)
    assert main(["undo", jid]) == 1
    err = capsys.readouterr().err
    assert "was changed after kvmtune wrote it" in err
    assert legacy.read_bytes() == edited
    assert main(["undo", "--force", jid]) == 0
    assert legacy.read_bytes() == before


def test_plan_is_checked_again_before_writing(legacy: Path, journal_dir: Path) -> None:
    plan = Plan()
    plan_files([str(legacy)], select_rules(), FixOptions(host=HostRoot(str(FIXTURE_HOST))), plan)
    assert plan.changes
    legacy.write_bytes(legacy.read_bytes() + b"<!-- edited meanwhile -->\n")
    edited = legacy.read_bytes()
    with pytest.raises(KvmtuneError, match="changed since the plan was made"):
        apply_plan(plan, journal_dir)
    assert legacy.read_bytes() == edited
    assert list(journal_dir.iterdir()) == []


def test_confirmation_is_required(legacy: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    before = legacy.read_bytes()
    monkeypatch.setattr("sys.stdin.isatty", lambda: False, raising=False)
    assert main(["fix", "--apply", str(legacy)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "add --yes" in err
    assert legacy.read_bytes() == before


def test_several_files_one_journal(tmp_path: Path, journal_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = []
    for case in sorted(GOLDEN.glob("KVM-STO-00[2-5]/*.in.xml")):
        p = tmp_path / f"{case.parent.name}-{case.name}"
        shutil.copyfile(case, p)
        files.append(p)
    before = {p: p.read_bytes() for p in files}
    assert main(["fix", "--apply", "--yes", *map(str, files)]) == 0
    jid = _journal_id(capsys.readouterr().out)
    assert all(p.read_bytes() != before[p] for p in files)
    doc = json.loads((journal_dir / f"{jid}.json").read_text())
    assert len(doc["changes"]) == len(files)
    assert main(["undo", jid]) == 0
    assert {p: p.read_bytes() for p in files} == before
