"""Issue 32 (audit accuracy, round two): what libvirt infers, what the guest really is, and context.

Each test runs the real ``kvmtune audit`` (``python -m kvmtune``) over a real file and reads its JSON report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import kvmtune

SRC = Path(kvmtune.__file__).resolve().parents[1]  # the kvmtune under test: the same one the subprocess runs


def audit(*args: str) -> tuple[int, dict[str, Any], str]:
    """``kvmtune audit ARGS --format json``: exit code, the report and standard error."""
    proc = subprocess.run(
        [sys.executable, "-m", "kvmtune", "audit", *args, "--format", "json"],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(SRC)},
    )
    report = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return proc.returncode, report, proc.stderr


def findings(report: dict[str, Any], rule: str | None = None) -> list[dict[str, Any]]:
    return [f for f in report.get("findings", []) if rule is None or f["rule"] == rule]


def domain(tmp_path: Path, name: str, body: str, extra: str = "") -> Path:
    path = tmp_path / f"{name}.xml"
    path.write_text(f"<domain type='kvm'><name>{name}</name><memory unit='GiB'>4</memory><vcpu>2</vcpu>"
                    f"{extra}<devices>{body}</devices></domain>", encoding="utf-8")
    return path


# --- item 16: two devices of one kind get distinct labels ------------------------------------------

def test_two_rng_devices_get_two_labels(tmp_path: Path) -> None:
    rng = "<rng model='virtio'><backend model='random'>/dev/random</backend></rng>"
    _, report, _ = audit(str(domain(tmp_path, "tworng", rng + rng)))
    devices = [f["target"]["device"] for f in findings(report, "KVM-SEC-002")]
    assert sorted(devices) == ["rng:1", "rng:2"]


def test_a_single_rng_keeps_its_plain_label(tmp_path: Path) -> None:
    rng = "<rng model='virtio'><backend model='random'>/dev/random</backend></rng>"
    _, report, _ = audit(str(domain(tmp_path, "onerng", rng)))
    assert [f["target"]["device"] for f in findings(report, "KVM-SEC-002")] == ["rng"]


# --- item 2: -balloon virtio, and command-line findings cite options ---------------------------------

def args_file(tmp_path: Path, name: str, options: str) -> Path:
    path = tmp_path / f"{name}.args"
    path.write_text(f"/usr/bin/qemu-system-x86_64 -name guest={name} -accel kvm -cpu host {options}\n", encoding="utf-8")
    return path


def test_the_legacy_balloon_option_is_a_virtio_balloon(tmp_path: Path) -> None:
    path = args_file(tmp_path, "legacy", "-m 2048 -balloon virtio")
    _, report, _ = audit("--qemu-cmdline", str(path))
    assert report["summary"]["findings"] > 0  # audited (a vCPU or RNG finding at least)
    assert findings(report, "KVM-MEM-002") == []


def test_command_line_findings_cite_options_not_xpaths(tmp_path: Path) -> None:
    path = args_file(tmp_path, "noballoon", "-balloon none")
    _, report, _ = audit("--qemu-cmdline", str(path))
    (missing,) = findings(report, "KVM-MEM-002")
    assert missing["evidence"] == "(no -device virtio-balloon-* or -balloon virtio option)"
    assert not [f for f in findings(report) if f["evidence"].startswith("/domain")], findings(report)
