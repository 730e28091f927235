"""`fix --patch`: a clean patch `git apply` accepts, giving the same bytes as `fix --apply`;
every reason line says something."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from fixhelpers import FIXTURE_HOST, REPO

from kvmtune.cli import main
from kvmtune.fix.registry import FixCall, XmlFixer, all_fixers

LEGACY = REPO / "src" / "kvmtune" / "examples" / "web01-legacy.xml"


@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_patch_applies_with_git_and_equals_apply(in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (in_tmp / "vm.xml").write_bytes(LEGACY.read_bytes())
    (in_tmp / "applied.xml").write_bytes(LEGACY.read_bytes())
    assert main(["fix", "vm.xml", "--allow-bus-change", "--root", str(FIXTURE_HOST), "--patch"]) == 0
    patch = capsys.readouterr().out
    assert "--- a/vm.xml\n+++ b/vm.xml\n" in patch
    assert "## " not in patch and "note:" not in patch and "planned" not in patch
    (in_tmp / "fix.patch").write_text(patch)
    check = subprocess.run(["git", "apply", "--check", "fix.patch"], capture_output=True, text=True, cwd=in_tmp)
    assert check.returncode == 0, check.stderr
    subprocess.run(["git", "apply", "fix.patch"], check=True, cwd=in_tmp)
    assert main(["fix", "applied.xml", "--allow-bus-change", "--root", str(FIXTURE_HOST), "--apply", "--yes"]) == 0
    assert (in_tmp / "vm.xml").read_bytes() == (in_tmp / "applied.xml").read_bytes()


def test_patch_does_not_go_with_apply(in_tmp: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (in_tmp / "vm.xml").write_bytes(LEGACY.read_bytes())
    assert main(["fix", "vm.xml", "--patch", "--apply", "--yes"]) == 2
    assert (in_tmp / "vm.xml").read_bytes() == LEGACY.read_bytes()
    assert len(capsys.readouterr().err.splitlines()) == 1


def test_a_reason_line_is_never_empty(
    in_tmp: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = all_fixers()["KVM-SEC-001"]

    def silent(call: FixCall) -> str:
        real.func(call)
        return ""

    monkeypatch.setitem(all_fixers(), "KVM-SEC-001", XmlFixer(real.rule, silent, real.summary))
    (in_tmp / "vm.xml").write_bytes(LEGACY.read_bytes())
    assert main(["fix", "vm.xml", "--root", str(FIXTURE_HOST)]) == 0
    out = capsys.readouterr().out
    reasons = [ln for ln in out.splitlines() if ln.startswith("# KVM-")]
    assert reasons and all(not ln.rstrip().endswith(":") for ln in reasons)
    assert f"# KVM-SEC-001 rng: {real.summary}" in out
    assert os.path.exists("vm.xml")
