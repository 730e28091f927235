"""A Proxmox VE config is split into lines on ``\\n`` only, as PVE's ``parse_vm_config`` splits it (issue 43 item 2).

``str.splitlines()`` also breaks on ``\\r``, ``\\x0b``, ``\\x0c``, ``\\x1c``-``\\x1e``, ``\\x85``, U+2028 and U+2029,
so ``ciuser: bob<U+2028>scsi5: /dev/sda`` was one key to PVE and two to kvmtune: ``audit --root`` saw a disk
``scsi5: /dev/sda`` and printed ``qm set … --scsi5 /dev/sda,…``. These run the real CLI over a copy of the
fixture tree with such a value added.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvmtune.errors import InputError
from kvmtune.proxmox.config import parse_config

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "proxmox"
TREE = FIXTURES / "cluster"
SRC = Path(__file__).resolve().parents[2] / "src"
CONF = "etc/pve/nodes/pve1/qemu-server/101.conf"
SEPARATORS = ["\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvmtune", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(SRC)}, check=False)


def _tree(tmp: Path, extra: str) -> Path:
    tree = tmp / "tree"
    shutil.copytree(TREE, tree, symlinks=True)
    conf = tree / CONF
    conf.write_bytes(conf.read_bytes() + extra.encode("utf-8"))
    return tree


def _id(sep: str) -> str:
    return f"U+{ord(sep):04X}"


@pytest.mark.parametrize("sep", SEPARATORS, ids=_id)
def test_audit_root_sees_no_disk_in_a_value_holding_a_line_break(tmp_path: Path, sep: str) -> None:
    tree = _tree(tmp_path, f"ciuser: bob{sep}scsi5: /dev/sda,cache=writeback\n")
    proc = _cli("audit", "--root", str(tree), "--no-images", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    devices = {f["target"]["device"] for f in report["findings"] if f["target"]["domain"] == "pve:101 (win11-desk)"}
    assert "disk:scsi5" not in devices and "disk:sata0" in devices
    assert "--scsi5" not in proc.stdout and "/dev/sda" not in proc.stdout
    escaped = f"\\x{ord(sep):02x}" if ord(sep) < 0x100 else f"\\u{ord(sep):04x}"
    assert any(f"101.conf:18: ciuser holds a line-break character ({escaped}) that PVE does not split on" in n
               for n in report["looked_at"])


def test_audit_and_fix_root_print_no_scsi5_and_apply_attaches_nothing(tmp_path: Path) -> None:
    tree = _tree(tmp_path, "ciuser: bob\u2028scsi5: /dev/sda,cache=writeback\n")
    audit = _cli("audit", "--root", str(tree), "--no-images")
    assert audit.returncode == 0, audit.stderr
    assert "--scsi5" not in audit.stdout and "qm set 101 " in audit.stdout
    assert "ciuser holds a line-break character (\\u2028)" in audit.stdout and "\u2028" not in audit.stdout
    plan = _cli("fix", "--root", str(tree))
    assert plan.returncode == 0, plan.stderr
    assert "--scsi5" not in plan.stdout and "\u2028" not in plan.stdout
    # the diff shows the value as the one line it is in the file, escaped
    assert " ciuser: bob\\u2028scsi5: /dev/sda,cache=writeback\n" in plan.stdout
    assert "\n scsi5:" not in plan.stdout and "\n+scsi5:" not in plan.stdout
    applied = _cli("fix", "--root", str(tree), "--apply", "--yes")
    assert applied.returncode == 0, applied.stderr
    lines = (tree / CONF).read_text(encoding="utf-8").split("\n")
    assert "ciuser: bob\u2028scsi5: /dev/sda,cache=writeback" in lines
    assert not [line for line in lines if line.startswith("scsi5")]
    assert "sata0: local-zfs:vm-101-disk-1,cache=none,discard=on,size=64G" in lines  # the real fix was made


@pytest.mark.parametrize("sep", SEPARATORS, ids=_id)
def test_an_injected_key_overrides_no_real_value(sep: str) -> None:
    cfg = parse_config(f"agent: 1{sep}cores: 64\ncores: 2\nname: x{sep}memory: 1\nmemory: 4096\n", "/x/150.conf", "150")
    assert cfg.current == {"agent": f"1{sep}cores: 64", "cores": "2", "name": f"x{sep}memory: 1", "memory": "4096"}
    assert len(cfg.notes) == 2


def test_a_description_line_is_decoded_and_never_a_key() -> None:
    cfg = parse_config("#notes%3A scsi5%3A /dev/sda\n#second line %E2%9C%93\nname: x\n", "/x/150.conf", "150")
    assert cfg.current == {"name": "x"}
    assert cfg.description == "notes: scsi5: /dev/sda\nsecond line \u2713"


@pytest.mark.parametrize("sep", SEPARATORS, ids=_id)
def test_a_drive_or_nic_value_with_a_line_break_is_refused(sep: str) -> None:
    for line in (f"scsi0: local:150/a.raw{sep}scsi5: /dev/sda", f"net0: virtio=BC:24:11:5A:01:01{sep},bridge=vmbr0"):
        with pytest.raises(InputError, match="a control or line-break character in a drive or NIC value"):
            parse_config(f"name: x\n{line}\n", "/x/150.conf", "150")


def test_a_key_set_twice_is_refused_with_both_lines(tmp_path: Path) -> None:
    tree = _tree(tmp_path, "sata0: /dev/sda,cache=writeback\n")
    proc = _cli("audit", "--root", str(tree), "--no-images")
    assert proc.returncode == 2
    assert (f"{tree / 'etc/pve/qemu-server/101.conf'}:18: sata0 is set twice (first on line 12); PVE would take the "
            "last, kvmtune takes neither") in proc.stdout + proc.stderr
    assert "/dev/sda" not in proc.stdout.replace(f"{tree}", "")
    plan = _cli("fix", "--root", str(tree))
    assert "sata0 is set twice" in plan.stdout and "qm set 101" not in plan.stdout and "101.conf\n" not in plan.stdout


def test_a_crlf_config_reads_as_pve_reads_it() -> None:
    cfg = parse_config("name: x\r\ncores: 2\r\nscsi0: local:150/a.raw,cache=none\r\n", "/x/150.conf", "150")
    assert cfg.current == {"name": "x", "cores": "2", "scsi0": "local:150/a.raw,cache=none"} and cfg.notes == []
