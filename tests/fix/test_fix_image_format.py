"""``fix --image-format raw|qcow2`` names the images' format; ``--format`` is the output format. For one release
``fix --format raw|qcow2`` still works, with one warning line (issue 30)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvmtune.cli import build_parser, main

needs_qemu_img = pytest.mark.skipif(shutil.which("qemu-img") is None, reason="qemu-img not installed")
WARNING = "kvmtune: warning: --format raw is the image format: use --image-format; --format will mean the output format"


def kvmtune(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvmtune", *argv], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=120, check=False)


@pytest.fixture
def raw(tmp_path: Path) -> Path:
    p = tmp_path / "guest.raw"
    subprocess.run(["qemu-img", "create", "-q", "-f", "raw", str(p), "16M"], check=True)
    return p


@needs_qemu_img
def test_image_format_plans_the_image_without_a_warning(raw: Path) -> None:
    res = kvmtune("fix", "--image-format", "raw", "--images", str(raw))
    assert res.returncode == 0, res.stderr
    assert "falloc" in res.stdout and "change(s) planned" in res.stdout
    assert res.stderr == ""


@needs_qemu_img
def test_legacy_format_does_the_same_and_warns_once(raw: Path) -> None:
    new = kvmtune("fix", "--image-format", "raw", "--images", str(raw))
    old = kvmtune("fix", "--format", "raw", "--images", str(raw))
    assert old.returncode == new.returncode == 0
    assert old.stdout == new.stdout
    assert old.stderr.splitlines() == [WARNING]


@needs_qemu_img
def test_the_journal_records_image_format(raw: Path, journal_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fix", "--format", "raw", "--images", str(raw), "--apply", "--yes"]) == 0
    capsys.readouterr()
    assert main(["undo", "--list"]) == 0
    listing = capsys.readouterr().out
    assert f"--images {raw} --image-format raw" in listing and "--format" not in listing.replace("--image-format", "")


def test_two_different_image_formats_are_refused_in_one_line(tmp_path: Path) -> None:
    res = kvmtune("fix", "--format", "qcow2", "--image-format", "raw", "--images", str(tmp_path / "x.raw"))
    assert res.returncode == 2
    assert res.stderr.splitlines() == ["kvmtune: error: --format qcow2 and --image-format raw: give one image format"]
    assert res.stdout == ""


def test_format_offers_only_output_formats() -> None:
    fix = build_parser()._subparsers._group_actions[0].choices["fix"]  # type: ignore[union-attr]
    fmt = next(a for a in fix._actions if "--format" in a.option_strings)
    assert list(fmt.choices or ()) == ["text", "json"]  # what --help, the man page and completions show
    assert "{text,json}" in fix.format_help() and "qcow2" not in fix.format_help().split("--image-format")[0]
    res = kvmtune("fix", "--format", "html", "--images", "x.raw")
    assert res.returncode == 2 and "invalid choice: 'html'" in res.stderr
