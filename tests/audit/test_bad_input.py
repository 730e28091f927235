"""Bad input: one clear line naming the file, the rest of the run goes on, exit 2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from kvmtune.cli import main

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "src" / "kvmtune" / "examples" / "web01-legacy.xml"
NETWORK_XML = """<network><name>default</name><forward mode='nat'/><bridge name='virbr0'/></network>\n"""


def run_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, object], str]:
    code = main(["audit", "--format", "json", *args])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


def test_mixed_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "good.xml").write_bytes(EXAMPLE.read_bytes())
    (tmp_path / "net.xml").write_text(NETWORK_XML)
    (tmp_path / "empty.xml").write_text("")
    (tmp_path / "broken.xml").write_text("<domain type='kvm'>\n  <name>x</name>\n  <devices>\n</domain>\n")
    (tmp_path / "notes.txt").write_text("not xml, not picked up from a directory")
    code, doc, err = run_json([str(tmp_path)], capsys)
    assert code == 2
    errors = doc["errors"]
    assert isinstance(errors, list)
    by_file = {Path(e.split(":")[0]).name: e for e in errors}
    assert set(by_file) == {"net.xml", "empty.xml", "broken.xml"}
    assert "not a libvirt domain: the root element is a libvirt network" in by_file["net.xml"]
    assert "empty file" in by_file["empty.xml"]
    assert by_file["broken.xml"].startswith(f"{tmp_path / 'broken.xml'}:4: malformed XML")
    # the good file was still audited
    findings = doc["findings"]
    assert isinstance(findings, list) and any(f["target"]["domain"] == "web01-legacy" for f in findings)
    assert len(err.strip().splitlines()) == 3 and "Traceback" not in err


def test_missing_file_and_directory_as_cmdline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, doc, _ = run_json([str(tmp_path / "nope.xml"), "--qemu-cmdline", str(tmp_path)], capsys)
    assert code == 2
    assert doc["errors"] == [f"{tmp_path / 'nope.xml'}: no such file",
                             f"{tmp_path}: is a directory (give a file holding one QEMU command line)"]


def test_cmdline_that_is_not_qemu(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "ls.args"
    f.write_text("ls -l /tmp\n")
    code, doc, _ = run_json(["--qemu-cmdline", str(f)], capsys)
    assert code == 2
    assert doc["errors"] == [f"{f}: not a QEMU system emulator command line (starts with 'ls')"]


def test_unbalanced_quote_in_cmdline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "q.args"
    f.write_text("qemu-system-x86_64 -name 'oops\n")
    code, doc, _ = run_json(["--qemu-cmdline", str(f)], capsys)
    assert code == 2 and doc["errors"] == [f"{f}: cannot split the command line: No closing quotation"]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to an unprivileged user")
def test_unreadable_file(tmp_path: Path) -> None:
    """Root reads everything, so the CLI runs as 'nobody' to meet a file it may not read."""
    tmp_path = Path(tempfile.mkdtemp(prefix="kvmtune-test-", dir="/tmp"))
    try:
        os.chmod(tmp_path, 0o755)
        secret = tmp_path / "secret.xml"
        secret.write_bytes(EXAMPLE.read_bytes())
        os.chmod(secret, 0o600)
        visible = tmp_path / "visible.xml"
        visible.write_bytes(EXAMPLE.read_bytes())
        os.chmod(visible, 0o644)
        proc = subprocess.run(
            [sys.executable, "-m", "kvmtune", "audit", "--format", "json", str(secret), str(visible)],
            capture_output=True, text=True, user=65534, group=65534, env={**os.environ, "HOME": "/tmp"},
            check=False,
        )
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.strip() == f"kvmtune: {secret}: not readable (permission denied)"
        assert json.loads(proc.stdout)["summary"]["findings"] > 0
    finally:
        shutil.rmtree(tmp_path)  # a failed assertion used to leave the directory (and its copy) in /tmp


def test_bad_fail_on_and_bad_root(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "--fail-on", "urgent", str(EXAMPLE)]) == 2
    assert "unknown severity 'urgent'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:  # --root is argparse's to refuse now (cli/command.py root_option)
        main(["audit", "--root", "/nonexistent-root", str(EXAMPLE)])
    assert exc.value.code == 2
    assert "/nonexistent-root: not a directory" in capsys.readouterr().err


def test_fail_on_sets_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["audit", "--fail-on", "high", str(EXAMPLE)]) == 1
    assert main(["audit", "--fail-on", "critical", "--only", "KVM-STO-001", str(EXAMPLE)]) == 0
    assert main(["audit", str(EXAMPLE)]) == 0
    capsys.readouterr()


def test_unreachable_libvirt_uri(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("libvirt")
    uri = "qemu+unix:///system?socket=/nonexistent/kvmtune-test.sock"
    code = main(["audit", "--connect", uri])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and err[0].startswith(f"kvmtune: {uri}: cannot connect to libvirt:")


def test_output_file_written_atomically(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.json"
    assert main(["audit", "--format", "json", "-o", str(out), str(EXAMPLE)]) == 0
    assert json.loads(out.read_text())["schema_version"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]
