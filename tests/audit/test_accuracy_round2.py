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

import pytest

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


# --- item 3: what the guest really is -------------------------------------------------------------

def test_a_guessed_windows_identity_says_so_in_the_text_report(tmp_path: Path) -> None:
    path = domain(tmp_path, "win10-desk", "<memballoon model='virtio'/>")
    proc = subprocess.run([sys.executable, "-m", "kvmtune", "audit", str(path), "--format", "text"],
                          capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "PYTHONPATH": str(SRC)})
    guesses = [line.strip() for line in proc.stdout.splitlines() if line.strip().startswith("guess:")]
    assert guesses, proc.stdout
    assert guesses[0] == ("guess: Windows guessed from the name 'win10-desk' (confidence: possible); "
                          "kvmtune fix applies it only when the rule is named")
    _, report, _ = audit(str(path))
    win = [f for f in findings(report) if f["rule"].startswith("KVM-WIN-")]
    assert win and all(f["extra"]["guessed"] == "Windows guessed from the name 'win10-desk'" for f in win)


def test_libosinfo_windows_is_certain_and_not_a_guess(tmp_path: Path) -> None:
    meta = ("<metadata><libosinfo:libosinfo xmlns:libosinfo='http://libosinfo.org/xmlns/libvirt/domain/1.0'>"
            "<libosinfo:os id='http://microsoft.com/win/2k22'/></libosinfo:libosinfo></metadata>")
    _, report, _ = audit(str(domain(tmp_path, "app01", "<memballoon model='virtio'/>", meta)))
    win = [f for f in findings(report) if f["rule"].startswith("KVM-WIN-")]
    assert win and all(f["confidence"] == "certain" and "extra" not in f for f in win)
    assert findings(report, "KVM-MEM-010") == []  # item 4: no free page reporting in virtio-win's balloon


# --- item 14: small read-only configuration volumes are not data disks ------------------------------

CONFIG_VOLUMES = """
    <disk type='file' device='disk'><driver name='qemu' type='raw'/>
      <source file='/var/lib/libvirt/images/vm-cidata.iso'/><target dev='sda' bus='sata'/><readonly/></disk>
    <disk type='file' device='disk'><driver name='qemu' type='raw'/>
      <source file='/var/lib/nova/instances/0b1c/disk.config'/><target dev='hdb' bus='ide'/><readonly/></disk>
    <disk type='file' device='disk'><driver name='qemu' type='qcow2'/>
      <source file='/var/lib/libvirt/images/data.qcow2'/><target dev='hdc' bus='ide'/><readonly/></disk>
"""


def test_read_only_config_volumes_do_not_draw_the_data_disk_rules(tmp_path: Path) -> None:
    _, report, _ = audit(str(domain(tmp_path, "cfgvol", CONFIG_VOLUMES)))
    judged = {f["target"]["device"] for f in findings(report) if (f["target"]["device"] or "").startswith("disk:")}
    assert judged == {"disk:hdc"}  # a read-only data image is still a data disk (on IDE: KVM-STO-001)
    assert "KVM-STO-001" in {f["rule"] for f in findings(report) if f["target"]["device"] == "disk:hdc"}


# --- item 13: templates ---------------------------------------------------------------------------

TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "templates"


def test_a_template_is_reported_in_one_line_and_its_placeholders_are_not_values() -> None:
    xml, args = TEMPLATES / "jinja-and-format.xml", TEMPLATES / "format.args"
    _, report, _ = audit(str(xml), "--qemu-cmdline", str(args), "--template")  # %(memory)s: judged (issue 45)
    notes = [line for line in report["looked_at"] if "a template" in line]
    assert notes == [
        f"{xml}: a template, not a guest definition (placeholders {{{{ vm_name }}}}, ${{UUID}}, %(memory)s, "
        "{path}, …); the values holding them are not judged",
        f"{args}: a template, not a guest definition (placeholders {{name}}, {{path}}); "
        "the values holding them are not judged",
    ]
    shown = json.dumps(findings(report))
    for placeholder in ("{path}", "{mac}", "{{ bridge }}", "{rng_source}", "${UUID}"):
        assert placeholder not in shown
    (file_backed,) = [f for f in findings(report, "KVM-STO-013") if f["source"] == str(xml)]
    assert file_backed["actual"] == "file"  # not "file {path}"


# --- a fully tuned Linux guest and a fully tuned Windows guest ----------------------------------------

TUNED = Path(__file__).resolve().parents[1] / "fixtures" / "tuned"


@pytest.mark.parametrize("name", ["linux.xml", "windows.xml"])
def test_a_fully_tuned_guest_has_no_finding_above_info(name: str) -> None:
    code, report, stderr = audit(str(TUNED / name))
    assert stderr == ""
    assert report["summary"]["errors"] == 0 and report["summary"]["findings"] >= 1  # audited: the info note
    above_info = [(f["rule"], f["actual"]) for f in findings(report) if f["severity"] != "info"]
    assert above_info == []
    assert code == 0
