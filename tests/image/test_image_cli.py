"""``kvmtune audit --images`` and the images of audited domains, end to end, including bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from kvmtune.cli import main
from kvmtune.qemu.image import read_image
from kvmtune.runner import Runner

DOMAIN = """<domain type='kvm'>
  <name>web01</name>
  <memory unit='GiB'>1</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='q35'>hvm</type></os>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2' cache='writethrough'/>
      <source file='{qcow2}'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw' cache='none'/>
      <source file='/nonexistent/elsewhere.raw'/>
      <target dev='vdb' bus='virtio'/>
    </disk>
    <disk type='file' device='cdrom'>
      <source file='{qcow2}'/>
      <target dev='sda' bus='sata'/>
      <readonly/>
    </disk>
  </devices>
</domain>
"""


def run_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict, str]:  # type: ignore[type-arg]
    code = main(["audit", "--format", "json", *args])
    out = capsys.readouterr()
    return code, json.loads(out.out), out.err


def test_images_directory_and_missing_path(images: dict[str, Path], tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "pool"
    d.mkdir()
    shutil.copyfile(images["mbr63.qcow2"], d / "a.qcow2")
    shutil.copyfile(images["prealloc-metadata.qcow2"], d / "b.qcow2")
    (d / "notes.txt").write_text("not an image")
    code, doc, err = run_json(["--images", str(d), str(tmp_path / "missing.qcow2"), "--only", "KVM-IMG"], capsys)
    assert code == 2
    assert doc["errors"] == [f"{tmp_path / 'missing.qcow2'}: no such file"]
    assert "Traceback" not in err
    rules = {(f["rule"], Path(f["target"]["device"].split(" ")[0][6:]).name) for f in doc["findings"]}
    assert ("KVM-IMG-009", "a.qcow2") in rules and ("KVM-IMG-002", "a.qcow2") in rules
    assert ("KVM-IMG-002", "b.qcow2") not in rules


def test_domain_brings_its_images(images: dict[str, Path], tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    img = tmp_path / "web01.qcow2"
    shutil.copyfile(images["prealloc-off.qcow2"], img)
    xml = tmp_path / "web01.xml"
    xml.write_text(DOMAIN.format(qcow2=img))
    # a domain file may describe another machine: its paths are not probed here unless the user says so
    code, doc, _ = run_json([str(xml), "--only", "KVM-IMG"], capsys)
    assert code == 0 and doc["findings"] == []
    assert any("not known to run on this host" in s and "--assume-this-host" in s for s in doc["looked_at"])
    code, doc, _ = run_json([str(xml), "--only", "KVM-IMG", "--assume-this-host"], capsys)
    assert code == 0
    [f] = [f for f in doc["findings"] if f["rule"] == "KVM-IMG-002"]
    assert f["severity"] == "high" and "writethrough by web01" in f["actual"]
    assert any("1 disk path(s) not present" in s for s in doc["looked_at"])
    code, doc, _ = run_json([str(xml), "--only", "KVM-IMG", "--no-images", "--assume-this-host"], capsys)
    assert doc["findings"] == []


def test_character_devices_and_fifos_named_as_disks_are_never_probed(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "disk.fifo"
    os.mkfifo(fifo)
    xml = tmp_path / "foreign.xml"
    xml.write_text(DOMAIN.replace("{qcow2}", "/dev/null").replace("/nonexistent/elsewhere.raw", str(fifo)))
    # a domain file: nothing of it is probed at all
    code, doc, _ = run_json([str(xml), "--only", "KVM-IMG"], capsys)
    assert code == 0 and doc["findings"] == [] and doc["errors"] == []
    # declared this host's: the paths are looked at, but /dev/null and the FIFO are refused unopened
    # (a FIFO would block the read; /dev/null would be judged "raw, declared qcow2")
    code, doc, _ = run_json([str(xml), "--only", "KVM-IMG", "--assume-this-host"], capsys)
    assert doc["findings"] == []
    assert sorted(e.split(":")[0] for e in doc["errors"]) == sorted(["/dev/null", str(fifo)])
    assert all("not opened" in e for e in doc["errors"])


def test_qemu_img_missing_is_one_error_and_audit_goes_on(images: dict[str, Path], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    code, doc, err = run_json(["--images", str(images["mbr63.raw"]), str(images["gpt.qcow2"]), "--only", "KVM-IMG"],
                              capsys)
    assert code == 2
    assert len(doc["errors"]) == 1 and doc["errors"][0].startswith("qemu-img: not found on PATH")
    assert "2 image(s) read without it" in doc["errors"][0]
    assert {f["rule"] for f in doc["findings"]} >= {"KVM-IMG-009"}
    assert "Traceback" not in err


def test_broken_images_are_findings(images: dict[str, Path], tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    t = tmp_path / "trunc.qcow2"
    t.write_bytes(images["mbr63.qcow2"].read_bytes()[:300])
    g = tmp_path / "garbage.qcow2"
    g.write_bytes(b"QFI\xfb" + b"\xff" * 200)
    code, doc, err = run_json(["--images", str(t), str(g), str(images["mbr2048.raw"])], capsys)
    broken = {Path(f["target"]["device"][6:]).name: f["actual"] for f in doc["findings"] if f["rule"] == "KVM-IMG-010"}
    assert "truncated" in broken["trunc.qcow2"]
    assert "qemu-img cannot open it" in broken["garbage.qcow2"]
    assert doc["errors"] == [] and code == 0
    assert "Traceback" not in err


def _wait_locked(path: Path, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        r = subprocess.run(["qemu-img", "info", str(path)], capture_output=True, text=True)
        if r.returncode != 0 and "lock" in r.stderr:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.integration
def test_image_locked_by_running_qemu(images: dict[str, Path], tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    qemu = shutil.which("qemu-system-x86_64")
    if qemu is None:
        pytest.skip("qemu-system-x86_64 not installed")
    img = tmp_path / "busy.qcow2"
    shutil.copyfile(images["mbr63.qcow2"], img)
    proc = subprocess.Popen(
        [qemu, "-accel", "tcg", "-S", "-nodefaults", "-display", "none", "-m", "32",
         "-drive", f"file={img},format=qcow2,if=none,id=d0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        assert _wait_locked(img), "QEMU did not take the image lock"
        runner = Runner()
        info = read_image(str(img), runner, [])
        assert info.in_use and info.broken is None
        assert "-U" not in runner.history[0].argv and "-U" in runner.history[1].argv
        assert info.partitions is not None and info.partitions.partitions[0].start_sector == 63
        code, doc, _ = run_json(["--images", str(img), "--only", "KVM-IMG"], capsys)
        assert code == 0 and doc["errors"] == []
        assert "KVM-IMG-009" in {f["rule"] for f in doc["findings"]}
        assert "KVM-IMG-010" not in {f["rule"] for f in doc["findings"]}
    finally:
        proc.kill()
        proc.wait(timeout=10)
