"""Without libvirt's Python binding (the wheel in a venv of its own), `kvmtune audit` audits what needs no libvirt, as
the .deb does when libvirt does not answer: the host and the QEMU processes, with one note naming the binding and how
to reach it (issue 46 item 2). A named --connect still fails on it, in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# the binding made unimportable in this interpreter, as in a fresh venv that has none
NO_BINDING = "import sys; sys.modules['libvirt'] = None; from kvmtune.cli import main; sys.exit(main(sys.argv[1:]))"


def kvmtune(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    env.pop("KVMTUNE_CONFIG", None)
    return subprocess.run([sys.executable, "-c", NO_BINDING, *argv], capture_output=True, text=True, env=env,
                          timeout=120, check=False)


def test_audit_without_the_binding_audits_the_host_with_one_note() -> None:
    done = kvmtune("audit", "--no-config", "--color", "never")
    assert done.returncode in (0, 1), done.stderr
    assert "host audited" in done.stdout
    notes = [part for part in done.stdout.split("; ") if "libvirt's Python binding" in part]
    assert len(notes) == 1 and notes[0].startswith("libvirt qemu:///system: not read: ")
    for hint in ("python3-libvirt", "--system-site-packages", "pipx inject kvmtune libvirt-python", "libvirt-dev"):
        assert hint in notes[0], hint
    assert "libvirt" not in done.stderr


def test_a_named_connection_without_the_binding_is_one_error_line() -> None:
    done = kvmtune("audit", "--no-config", "-c", "qemu:///system", "--color", "never")
    assert done.returncode == 2 and done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert line.startswith("kvmtune: qemu:///system: libvirt's Python binding (libvirt-python) is not installed")
