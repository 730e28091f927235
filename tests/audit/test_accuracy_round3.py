"""Issue 45 (audit accuracy, round three): launchers other than libvirt, templates, Proxmox VE.

Each test runs the real ``kvmtune audit`` (the CLI's ``main``) over real files and reads its JSON report.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kvmtune.cli import main


def audit(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any], str]:
    code = main(["audit", *args, "--format", "json"])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else {}, err


def findings(report: dict[str, Any], rule: str | None = None) -> list[dict[str, Any]]:
    return [f for f in report.get("findings", []) if rule is None or f["rule"] == rule]


def comparable(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """What the findings say, without where the guest came from."""
    return sorted((f["rule"], str(f["target"].get("device")), f["summary"]) for f in findings(report))


# --- item 2: argument lists without the binary ------------------------------------------------------

PACKER_ARGS = ("-m 2048M -smp 2 -display none -machine type=pc,accel=kvm -netdev user,id=user.0,hostfwd=tcp::2222-:22 "
               "-device virtio-net,netdev=user.0 -drive file=output/packer-ubuntu,if=virtio,cache=writeback,"
               "discard=ignore,format=qcow2 -name packer-ubuntu -vnc 127.0.0.1:59\n")
MULTIPASS_ARGS = ("-display none -bios OVMF.fd --enable-kvm -cpu host -nic tap,ifname=tap-1,script=no,downscript=no,"
                  "model=virtio-net-pci,mac=52:54:00:1b:2c:3d -m 1024M -smp 1 -device virtio-scsi-pci,id=scsi0 "
                  "-drive file=/var/snap/multipass/vault/instances/primary/ubuntu.img,if=none,format=qcow2,"
                  "discard=unmap,id=hda -device scsi-hd,drive=hda,bus=scsi0.0 -cdrom cloud-init-config.iso\n")


@pytest.mark.parametrize("args", [PACKER_ARGS, MULTIPASS_ARGS], ids=["starts-with-m", "starts-with-display"])
def test_an_argument_list_without_the_binary_is_audited_as_qemu_system_x86_64s(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], args: str) -> None:
    bare, whole = tmp_path / "bare" / "vm.args", tmp_path / "whole" / "vm.args"
    bare.parent.mkdir()
    whole.parent.mkdir()
    bare.write_text(args)
    whole.write_text("qemu-system-x86_64 " + args)
    code_bare, bare_report, _ = audit(capsys, "--qemu-cmdline", str(bare))
    code_whole, whole_report, _ = audit(capsys, "--qemu-cmdline", str(whole))
    assert (code_bare, code_whole) == (0, 0)
    assert comparable(bare_report) == comparable(whole_report) and findings(bare_report)
    said = [line for line in bare_report["looked_at"] if "without the binary" in line]
    assert said == [f"{bare}: an argument list without the binary, read as qemu-system-x86_64's "
                    "(--qemu-binary NAME to choose another)"]
    assert not any("without the binary" in line for line in whole_report["looked_at"])


def test_qemu_binary_chooses_another_binary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "arm.args"
    f.write_text("-machine virt -m 1G -smp 2\n")
    code, report, _ = audit(capsys, "--qemu-cmdline", str(f), "--qemu-binary", "qemu-system-aarch64")
    assert code == 0
    assert any("read as qemu-system-aarch64's" in line for line in report["looked_at"])
    with pytest.raises(SystemExit):
        main(["audit", "--qemu-cmdline", str(f), "--qemu-binary", "/bin/sh"])
    assert "not a QEMU system emulator" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["-m 2048\n", "-display none\n", "-enable-kvm\n", "-device virtio-net-pci,netdev=n0\n"])
def test_a_single_option_stays_a_refused_fragment(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str) -> None:
    f = tmp_path / "frag.args"
    f.write_text(text)
    code, report, _ = audit(capsys, "--qemu-cmdline", str(f))
    first = text.split()[0]
    assert code == 2
    assert report["errors"] == [f"{f}: a single option ({first!r}), a fragment of a QEMU command line, "
                                "not an argument list to audit"]
    assert findings(report) == []


def test_a_command_that_is_not_qemu_is_still_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "ls.args"
    f.write_text("ls -l -m 2048\n")
    code, report, _ = audit(capsys, "--qemu-cmdline", str(f))
    assert code == 2 and report["errors"] == [f"{f}: not a QEMU system emulator command line (starts with 'ls')"]
