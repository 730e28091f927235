"""One fix-text source per rule (issue 35 item 3): a rule whose fix is a config change declares its Proxmox VE
form (``pve = PveForm(...)``, plain data) beside its libvirt text and XML fixer; ``proxmox/qmset.py`` only
interprets forms and names no rule."""

from __future__ import annotations

from pathlib import Path

import pytest

import kvmtune.proxmox
from kvmtune.audit.rule import Rule, all_rules
from kvmtune.proxmox.config import parse_config
from kvmtune.proxmox.qmset import KINDS, PveForm, change_for, qm_set_line

CONFIG = """\
cores: 4
memory: 8192
name: forms
net0: e1000=BC:24:11:00:00:01,bridge=vmbr0
ostype: l26
sata1: local-lvm:vm-150-disk-1,size=8G
scsi0: local-lvm:vm-150-disk-0,cache=writeback,size=32G
scsihw: lsi
sockets: 1
balloon: 0
"""
DEVICE = {"disk-props": "disk:scsi0", "aio": "disk:scsi0", "iothread": "disk:scsi0", "scsihw": "scsi-controller:scsi0",
          "nic-model": "net:bc:24:11:00:00:01", "queues": "net:bc:24:11:00:00:01", "set": "", "bus": "disk:sata1",
          "cpu": "cpu"}
WITH_FORMS = [r for r in all_rules() if r.pve is not None]


def test_the_rules_that_carry_a_pve_form() -> None:
    assert {r.id for r in WITH_FORMS} == {
        "KVM-STO-002", "KVM-STO-003", "KVM-STO-004", "KVM-STO-005", "KVM-STO-006", "KVM-STO-007", "KVM-STO-009",
        "KVM-STO-010", "KVM-STO-012", "KVM-STO-014", "KVM-STO-015", "KVM-NET-001", "KVM-NET-008", "KVM-MEM-002",
        "KVM-CPU-001", "KVM-SEC-001", "KVM-STO-001"}


@pytest.mark.parametrize("rule", WITH_FORMS, ids=lambda r: r.id)
def test_each_rules_pve_form_is_a_qm_set_change_with_its_web_ui_field(rule: type[Rule]) -> None:
    form = rule.pve
    assert isinstance(form, PveForm) and form.kind in KINDS
    assert rule.fix_kind != "manual"  # the libvirt form of the same fix exists too
    cfg = parse_config(CONFIG, "150.conf", "150")
    change = change_for(form, cfg, DEVICE[form.kind])
    assert change is not None and (change.values or change.props)
    assert qm_set_line(cfg, change).startswith("qm set 150 --")
    assert change.ui.startswith("Hardware >") and "{}" not in change.ui


def test_proxmox_names_no_rule() -> None:
    package = Path(kvmtune.proxmox.__file__).parent
    assert [p.name for p in package.glob("*.py") if "KVM-" in p.read_text()] == []


BUS = PveForm("bus", "Hard Disk ({})")
BUS_CONFIG = """\
boot: order=ide2;sata0;net0
ide2: none,media=cdrom
memory: 4096
ostype: {ostype}
sata0: local-lvm:vm-151-disk-0,cache=writeback,discard=on,size=32G,ssd=1
virtio0: local-lvm:vm-151-disk-1,size=8G
"""


def test_the_bus_form_moves_the_volume_to_a_free_virtio_key_in_the_same_boot_place() -> None:
    cfg = parse_config(BUS_CONFIG.format(ostype="l26"), "151.conf", "151")
    change = change_for(BUS, cfg, "disk:sata0")
    assert change is not None and change.guest_visible and change.moves == {"sata0": "virtio1"}
    # the same volume, its properties kept but ssd= (virtio-blk has none), the old key deleted, boot order kept
    assert qm_set_line(cfg, change) == ("qm set 151 --virtio1 local-lvm:vm-151-disk-0,cache=writeback,discard=on,"
                                        "size=32G --boot 'order=ide2;virtio1;net0' --delete sata0")
    assert any("ssd= has no virtio-blk form" in n for n in change.notes)
    assert any("stop VM 151 first" in n for n in change.notes)
    assert not any("Windows" in n for n in change.notes)


def test_another_findings_change_to_a_moved_drive_lands_on_its_new_key() -> None:
    cfg = parse_config(BUS_CONFIG.format(ostype="win10"), "151.conf", "151")
    change = change_for(BUS, cfg, "disk:sata0")
    cache = change_for(PveForm("disk-props", "x", (("cache", "none"),)), cfg, "disk:sata0")
    assert change is not None and cache is not None
    change.merge(cache)
    line = qm_set_line(cfg, change)
    assert "--virtio1 local-lvm:vm-151-disk-0,cache=none,discard=on,size=32G" in line and "--sata0" not in line
    assert any("viostor" in n for n in change.notes)  # Windows needs its virtio-blk driver first


def test_the_legacy_boot_format_follows_the_disk_through_bootdisk() -> None:
    text = BUS_CONFIG.format(ostype="l26").replace("boot: order=ide2;sata0;net0", "boot: cdn\nbootdisk: sata0")
    cfg = parse_config(text, "151.conf", "151")
    change = change_for(BUS, cfg, "disk:sata0")
    assert change is not None and change.values["bootdisk"] == "virtio1" and "boot" not in change.values


@pytest.mark.parametrize(("edit", "why"), [
    (("sata0: local-lvm:vm-151-disk-0,", "sata0: local-lvm:vm-151-disk-0,wwn=0x5000c500a1b2c3d4,"), "sets wwn"),
    (("virtio0: local-lvm:vm-151-disk-1,size=8G\n", "".join(f"virtio{n}: local-lvm:vm-151-disk-{n + 1},size=8G\n"
                                                              for n in range(16))), "no free virtio drive key"),
    (("virtio0: local-lvm:vm-151-disk-1,size=8G\n", "virtio0: local-lvm:vm-151-disk-1,size=8G\n\n[PENDING]\n"
                                                     "sata0: local-lvm:vm-151-disk-0,cache=none,size=32G\n"),
     "sata0 has a pending change"),
])
def test_the_bus_form_refuses_what_it_cannot_move_and_says_why(edit: tuple[str, str], why: str) -> None:
    cfg = parse_config(BUS_CONFIG.format(ostype="l26").replace(*edit), "151.conf", "151")
    change = change_for(BUS, cfg, "disk:sata0")
    assert change is not None and why in change.refused and not change.values and not change.props


def test_the_bus_form_leaves_disks_already_on_a_paravirtual_bus() -> None:
    cfg = parse_config(BUS_CONFIG.format(ostype="l26"), "151.conf", "151")
    assert change_for(BUS, cfg, "disk:virtio0") is None


def test_a_fix_never_creates_a_drive_key_nor_puts_another_volume_under_one() -> None:
    from kvmtune.proxmox.qmset import QmChange, drive_refusal

    cfg = parse_config(CONFIG + "scsi1: /dev/disk/by-id/ata-HOST,cache=writeback,size=100G\n", "/x/150.conf", "150")
    assert drive_refusal(cfg, QmChange(props={"scsi0": {"cache": "none"}})) == ""
    assert drive_refusal(cfg, QmChange(values={"scsi5": "/dev/sda,cache=none"})) == (
        "scsi5 is not a drive or NIC VM 150 has: a fix never creates one")
    assert drive_refusal(cfg, QmChange(values={"net1": "virtio,bridge=vmbr0"})).startswith("net1 is not a drive or NIC")
    assert drive_refusal(cfg, QmChange(values={"scsi0": "/dev/sda,cache=none"})) == (
        "scsi0: the change would put another volume under it")
    assert drive_refusal(cfg, QmChange(values={"sata1": None, "virtio0": "/dev/sda"}, moves={"sata1": "virtio0"})) == (
        "virtio0: the change would put another volume under it")
    assert drive_refusal(cfg, QmChange(values={"scsi0": None})) == "scsi0: a fix does not remove a drive or NIC"
    host = QmChange(props={"scsi1": {"cache": "none"}})
    assert drive_refusal(cfg, host) == ("scsi1 is the host's /dev/disk/by-id/ata-HOST (a path or device, not a storage "
                                        "volume): changed only when named (--pve-volume /dev/disk/by-id/ata-HOST)")
    assert drive_refusal(cfg, host, frozenset({"/dev/disk/by-id/ata-HOST"})) == ""
    bus = change_for(PveForm("bus", "{}"), cfg, "disk:sata1")
    assert bus is not None and bus.moves == {"sata1": "virtio0"} and drive_refusal(cfg, bus) == ""
