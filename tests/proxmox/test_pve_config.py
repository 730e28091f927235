"""Proxmox VE VM configs as an audit input (issue 35).

Fixtures: ``tests/fixtures/proxmox/`` (see its README): a captured ``/etc/pve`` of a two-node cluster and,
for each of node pve1's VMs, the command line PVE 8 generates from that config.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvmtune.audit.collect import merge_pve_processes
from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import AuditResult, run_rules
from kvmtune.domain.windows import hyperv_hint, os_identity
from kvmtune.errors import InputError
from kvmtune.host.root import HostRoot
from kvmtune.model.guest import Guest
from kvmtune.proxmox.config import parse_config
from kvmtune.proxmox.guest import guest_from_config
from kvmtune.proxmox.load import read_files, read_host, storage_file
from kvmtune.proxmox.qmset import QmChange, apply_to_text, change_for, qm_set_line
from kvmtune.qemu.cmdline import guest_from_text
from kvmtune.rules.storage.disk_cache_writeback import DiskCacheWriteback

HERE = Path(__file__).resolve().parent.parent / "fixtures" / "proxmox"
TREE = HERE / "cluster"
PVE = TREE / "etc" / "pve"
NODE = PVE / "nodes" / "pve1" / "qemu-server"
STORAGE = PVE / "storage.cfg"
FIXTURE_HOST = HERE.parent / "hosts" / "rules-default"
SRC = Path(__file__).resolve().parents[2] / "src"
VMIDS = ("8006", "101", "102")
TOPICS_COMPARED = ("disk:", "net:")


def _pair(vmid: str) -> tuple[Guest, Guest]:
    read = read_files([str(NODE / f"{vmid}.conf")], storage_file(str(STORAGE)))
    assert read.errors == []
    args = HERE / "cmdlines" / f"{vmid}.args"
    return read.guests[0], guest_from_text(args.read_text(), str(args))


def _effective(guest: Guest) -> dict[str, tuple[str | None, ...]]:
    return {
        d.target.removeprefix("drive-"): (d.device, d.bus, d.cache, d.io, d.discard, d.iothread or d.scsi_controller_iothread)
        for d in guest.disks if d.device != "firmware"
    }


@pytest.mark.parametrize("vmid", VMIDS)
def test_each_disk_has_the_cache_aio_discard_iothread_and_bus_of_the_command_line_pve_generates(vmid: str) -> None:
    config, cmdline = _pair(vmid)
    assert _effective(config) == _effective(cmdline)
    assert len(_effective(config)) >= 3


@pytest.mark.parametrize("vmid", VMIDS)
def test_storage_and_network_findings_equal_those_of_the_command_line(vmid: str) -> None:
    config, cmdline = _pair(vmid)
    ctx = AuditContext(host=HostRoot(str(FIXTURE_HOST)))

    def judged(guest: Guest) -> set[tuple[str, str]]:
        guest.on_audited_host = True
        return {(f.rule, f.target.device or "") for f in run_rules(ctx, [guest], [], False)
                if (f.target.device or "").startswith(TOPICS_COMPARED)}

    found = judged(config)
    assert found == judged(cmdline)
    assert found  # the fixtures are chosen to have storage findings


def test_every_disk_bus_storage_type_and_section_kind_is_covered_by_the_fixtures() -> None:
    read = read_files([str(NODE)], storage_file(str(STORAGE)))
    disks = [d for g in read.guests for d in g.disks]
    assert {d.bus for d in disks} >= {"ide", "sata", "scsi", "virtio"}
    assert {d.target for d in disks if d.locator.endswith("args")} == set()  # args: disks keep their option
    used = {cfg.current[k].split(":", 1)[0] for cfg in read.configs for k in cfg.current if k[:3] in ("ide", "sat", "scs", "vir")}
    kinds = {s.type for sid, s in storage_file(str(STORAGE)).items() if sid in used}
    assert kinds >= {"dir", "lvm", "lvmthin", "zfspool", "rbd", "nfs", "cifs", "iscsi"}
    assert any(cfg.snapshots for cfg in read.configs) and any(cfg.pending for cfg in read.configs)
    assert any("args" in cfg.current for cfg in read.configs)
    assert {cfg.current["ostype"] for cfg in read.configs} >= {"win11", "l26"}


def test_pve_defaults_are_applied_by_storage_type_and_said_to_be_defaults() -> None:
    storages = storage_file(str(STORAGE))
    text = ("scsi0: local-lvm:vm-150-disk-0,size=8G\nscsi1: local:150/vm-150-disk-1.qcow2,size=8G\n"
            "scsi2: cifs-store:150/vm-150-disk-2.raw,cache=writeback\nscsi3: ceph-krbd:vm-150-disk-3,cache=writethrough\n"
            "scsi4: ceph-krbd:vm-150-disk-4\nide2: local:iso/x.iso,media=cdrom\n")
    guest, _notes = guest_from_config(parse_config(text, "/x/150.conf", "150"), storages)
    got = {d.target: (d.cache, d.io) for d in guest.disks}
    assert got == {"scsi0": ("none", "native"), "scsi1": ("none", "io_uring"), "scsi2": ("writeback", "threads"),
                   "scsi3": ("writethrough", "threads"), "scsi4": ("none", "io_uring"), "ide2": (None, "io_uring")}
    scsi0 = guest.disks[1]
    assert scsi0.scsi_controller_model == "lsi"  # qm.conf(5): scsihw defaults to lsi
    assert "PVE's default none" in scsi0.where("cache") and "PVE's default native" in scsi0.where("io")


def test_unknown_storage_is_named_never_guessed() -> None:
    guest, notes = guest_from_config(parse_config("scsi0: nosuch:vm-150-disk-0\n", "/x/150.conf", "150"),
                                     storage_file(str(STORAGE)))
    assert guest.disks[0].source is None and guest.disks[0].source_type is None
    assert notes == ["pve:150 disk:scsi0: storage 'nosuch' is not defined in storage.cfg; its storage findings are not judged"]


@pytest.mark.parametrize(("line", "problem"), [
    ("scsi0: local:150/a.raw,cache=fast", "scsi0: cache='fast' is not one of directsync, none, unsafe, writeback, writethrough"),
    ("virtio0: local:150/a.raw,speed=9", "virtio0: unable to parse drive options: unknown property 'speed'"),
    ("scsihw: buslogic", "scsihw: 'buslogic' is not one of"),
    ("this is not a config line", "not a 'key: value' line"),
])
def test_a_config_pve_would_refuse_is_refused_with_its_file_and_line(line: str, problem: str) -> None:
    with pytest.raises(InputError) as err:
        parse_config(f"name: x\n{line}\n", "/x/150.conf", "150")
    assert str(err.value).startswith("/x/150.conf:2: ") and problem in str(err.value)


def test_ostype_settles_the_os_and_pve_sets_windows_enlightenments_itself() -> None:
    read = read_files([str(NODE)], storage_file(str(STORAGE)))
    by_name = {g.name: g for g in read.guests}
    win, linux = by_name["pve:101 (win11-desk)"], by_name["pve:8006 (web)"]
    assert os_identity(win) is not None and os_identity(win).family == "windows"  # type: ignore[union-attr]
    assert os_identity(linux) is not None and os_identity(linux).family == "linux"  # type: ignore[union-attr]
    assert hyperv_hint(win) is None  # qemu-server adds hv_* flags, -no-hpet and the RTC policy for win11


def test_a_running_qemu_pve_started_is_the_config_guest_not_a_second_one() -> None:
    read = read_files([str(NODE / "8006.conf")], storage_file(str(STORAGE)))
    args = (HERE / "cmdlines" / "8006.args").read_text()
    by_uuid = guest_from_text(args, "/proc/4242/cmdline")
    by_id = guest_from_text(args.replace("uuid=6f1c2a3b", "uuid=00000000"), "/proc/4243/cmdline")
    # neither the UUID nor -id: PVE's pidfile path names the VMID
    by_pidfile = guest_from_text(args.replace("uuid=6f1c2a3b", "uuid=00000000").replace("-id 8006 ", ""),
                                 "/proc/4244/cmdline")
    for process in (by_uuid, by_id, by_pidfile):
        process.active = True
        result = AuditResult()
        result.guests = [*read.guests, process]
        merge_pve_processes(result)
        assert [g.name for g in result.guests] == ["pve:8006 (web)"] and result.guests[0].active
        assert result.looked_at == [f"pve:8006 (web): running as {process.origin}"]
    other = guest_from_text(args.replace("uuid=6f1c2a3b", "uuid=00000000").replace("-id 8006 ", "")
                            .replace("/var/run/qemu-server/8006.pid", "/run/qemu-server/101.pid"), "/proc/4245/cmdline")
    assert other.derived["pve_vmid"] == "101"


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvmtune", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(SRC), **(env or {})}, check=False)


def test_audit_root_names_guests_by_vmid_on_their_node_with_qm_set_fixes() -> None:
    proc = _cli("audit", "--root", str(TREE), "--no-images", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    findings = report["findings"]
    domains = {f["target"]["domain"] for f in findings if f["target"]["domain"]}
    assert domains == {"pve:8006 (web)", "pve:101 (win11-desk)", "pve:102 (db)"}  # 200 runs on pve2
    looked = " ".join(report["looked_at"])
    assert "Proxmox VE node pve1: 3 VM config(s); those of pve2 (1) are audited on their own nodes" in looked
    assert "pve:8006 (web): 1 snapshot(s) (before-upgrade) not audited" in looked
    assert "pve:8006 (web): pending until its next start" in looked
    fixes = {(f["rule"], f["target"]["domain"], f["target"]["device"]): f["fix"]["description"] for f in findings}
    # the VM's one combined qm set (issue 45): the same line on each finding fix changes, none undoing another
    combined = fixes[("KVM-STO-005", "pve:8006 (web)", "disk:scsi2")]
    assert combined.startswith("qm set 8006 ") and "this VM's one qm set for every finding" in combined
    assert " --scsi2 nfs-store:8006/vm-8006-disk-2.qcow2,cache=none," in combined
    assert combined.split(";")[0] == fixes[("KVM-SEC-001", "pve:8006 (web)", "rng")].split(";")[0]
    assert "web UI: Hardware > Hard Disk (scsi2) > Cache: No cache" in fixes[("KVM-STO-005", "pve:8006 (web)", "disk:scsi2")]
    assert not any("<driver" in text for (rule, _d, _dev), text in fixes.items() if rule in ("KVM-STO-005", "KVM-STO-010"))
    assert not [k for k in fixes if k[0].startswith("KVM-WIN")]


def test_audit_of_named_conf_files_with_pve_storage_and_a_refused_one(tmp_path: Path) -> None:
    shutil.copy(NODE / "102.conf", tmp_path / "102.conf")
    proc = _cli("audit", str(tmp_path / "102.conf"), "--pve-storage", str(STORAGE), "--no-images", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    disks = {f["target"]["device"] for f in json.loads(proc.stdout)["findings"] if f["target"]["domain"] == "pve:102 (db)"}
    assert "disk:virtio1" not in disks and "disk:scsi1" in disks
    bad = tmp_path / "bad" / "103.conf"
    bad.parent.mkdir()
    bad.write_text("name: broken\nscsi0: local:103/a.raw,cache=fast\n")
    proc = _cli("audit", str(bad), "--pve-storage", str(STORAGE))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"kvmtune: {bad}:2: scsi0: cache='fast' is not one of directsync, none, unsafe, writeback, writethrough"]
    assert proc.stdout == ""


def test_qm_set_line_and_the_file_edit_keep_every_other_byte() -> None:
    text = (NODE / "8006.conf").read_text()
    cfg = parse_config(text, "8006.conf", "8006")
    change = QmChange(props={"scsi0": {"iothread": "1", "aio": "native"}}, values={"scsihw": "virtio-scsi-single"})
    assert qm_set_line(cfg, change) == ("qm set 8006 --scsihw virtio-scsi-single --scsi0 "
                                        "local:8006/vm-8006-disk-0.raw,aio=native,cache=none,discard=on,iothread=1,size=32G,ssd=1")
    fix = change_for(DiskCacheWriteback.pve, cfg, "disk:scsi2")
    assert fix is not None
    after = apply_to_text(text, cfg, fix)
    before_lines, after_lines = text.splitlines(), after.splitlines()
    changed = [(a, b) for a, b in zip(before_lines, after_lines, strict=True) if a != b]
    assert changed == [("scsi2: nfs-store:8006/vm-8006-disk-2.qcow2,cache=writeback,size=50G",
                        "scsi2: nfs-store:8006/vm-8006-disk-2.qcow2,cache=none,size=50G")]


def test_a_live_style_read_of_the_tree_reads_this_nodes_configs_once() -> None:
    read = read_host(HostRoot(str(TREE)))
    assert sorted(g.name for g in read.guests) == ["pve:101 (win11-desk)", "pve:102 (db)", "pve:8006 (web)"]
    assert all(cfg.node == "pve1" for cfg in read.configs)
