"""Config and command line agree (issue 45, item 5): each of Proxmox VE's own config-to-command test pairs
(``tests/fixtures/proxmox/cfg2cmd/``, see its README) audited as a VM config and as the command line qemu-server
generates from it gives the same findings per disk and NIC, on every rule that reads disks and NICs, and the same
effective disk and NIC settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import run_rules
from kvmtune.host.root import HostRoot
from kvmtune.model.guest import Guest
from kvmtune.proxmox.load import read_config_text, storage_file
from kvmtune.qemu.cmdline import guest_from_argv, guest_from_text

HERE = Path(__file__).resolve().parent.parent / "fixtures" / "proxmox" / "cfg2cmd"
RULES_HOST = HERE.parents[1] / "hosts" / "rules-default"
CLASSES = sorted(p.stem for p in HERE.glob("*.conf"))


def read_pair(name: str) -> tuple[Guest, Guest, list[str]]:
    text = (HERE / f"{name}.conf").read_text()
    # the suite's VMID is 8006; kvmtune reads it from the file name, as PVE does
    config, _, notes = read_config_text(text, str(HERE / name / "8006.conf"), storage_file(str(HERE / "storage.cfg")))
    cmdline = guest_from_text((HERE / f"{name}.conf.cmd").read_text(), f"{name}.conf.cmd")
    return config, cmdline, notes


def judged(guest: Guest) -> set[tuple[str, str]]:
    ctx = AuditContext(host=HostRoot(str(RULES_HOST)))
    guest.on_audited_host = True
    return {(f.rule, f.target.device or "") for f in run_rules(ctx, [guest], [], False)
            if (f.target.device or "").startswith(("disk:", "net:"))}


def disks(guest: Guest) -> dict[str, tuple[object, ...]]:
    """What the disk rules read, per disk that has a volume (an empty CD-ROM drive is absent from PVE 9's line)."""
    return {d.target: (d.device, d.bus, d.cache, d.io, d.format, d.source, d.readonly, d.discard, d.iothread,
                       d.scsi_controller_model)
            for d in guest.disks if d.source and d.device != "firmware"}


def nics(guest: Guest) -> dict[str, tuple[object, ...]]:
    return {n.label: (n.model, n.type, n.vhost, n.queues, n.rx_queue_size) for n in guest.nics}


def test_the_fixtures_hold_every_class_the_issue_names() -> None:
    assert CLASSES == ["netdev-7.1-multiqueues", "netdev-7.1-multiqueues-qemu71", "pinned-version",
                       "pinned-version-pxe-pve", "q35-linux-hostpci", "simple-backingchain", "simple-btrfs",
                       "simple1-template"]


@pytest.mark.parametrize("name", CLASSES)
def test_config_and_command_line_agree_per_device(name: str) -> None:
    config, cmdline, _ = read_pair(name)
    assert disks(config) == disks(cmdline)
    assert nics(config) == nics(cmdline)
    assert judged(config) == judged(cmdline)


def test_btrfs_resolves_to_the_subvolume_and_defaults_to_writeback() -> None:
    config, _, notes = read_pair("simple-btrfs")
    assert not [n for n in notes if "not judged" in n]
    scsi0 = next(d for d in config.disks if d.target == "scsi0")
    assert (scsi0.source, scsi0.cache) == ("/butter/bread/images/8006/vm-8006-disk-0/disk.raw", "writeback")
    assert "PVE's default writeback" in scsi0.evidence["cache"]
    assert ("KVM-STO-005", "disk:scsi0") in judged(config)


def test_a_qcow2_volume_on_lvm_is_qcow2() -> None:
    config, _, _ = read_pair("simple-backingchain")
    scsi1 = next(d for d in config.disks if d.target == "scsi1")
    assert (scsi1.source, scsi1.format, scsi1.io) == ("/dev/veegee/vm-8006-disk-0.qcow2", "qcow2", "native")


def test_a_template_is_audited_as_its_backup_start() -> None:
    config, cmdline, notes = read_pair("simple1-template")
    assert config.nics == [] == cmdline.nics
    sata0 = next(d for d in config.disks if d.target == "sata0")
    assert (sata0.device, sata0.bus, sata0.readonly) == ("cdrom", "sata", True)
    assert any("a template (template: 1)" in n for n in notes)


@pytest.mark.parametrize("name", ["netdev-7.1-multiqueues", "netdev-7.1-multiqueues-qemu71"])
def test_queues_from_machine_7_1_get_pves_1024_ring(name: str) -> None:
    config, _, _ = read_pair(name)
    (nic,) = config.nics
    assert (nic.queues, nic.rx_queue_size) == (2, 1024)
    assert "from machine version 7.1 on" in nic.evidence["rx_queue_size"]
    assert not {r for r, _ in judged(config)} & {"KVM-NET-021"}


def test_queues_below_machine_7_1_keep_the_256_ring(tmp_path: Path) -> None:
    text = (HERE / "netdev-7.1-multiqueues.conf").read_text() + "machine: pc-i440fx-7.0\n"
    config, _, _ = read_config_text(text, str(tmp_path / "8006.conf"), None)
    assert config.nics[0].rx_queue_size is None
    assert ("KVM-NET-021", "net:a2:c0:43:77:08:a0") in judged(config)


def test_a_pinned_pxe_machine_is_the_machine_qemu_gets() -> None:
    config, cmdline, _ = read_pair("pinned-version-pxe-pve")
    assert config.machine == cmdline.machine == "pc-q35-4.1+pve2"
    assert config.balloon_free_page_reporting is cmdline.balloon_free_page_reporting is False


def test_qemu_servers_own_readconfig_file_withholds_nothing() -> None:
    config, cmdline, _ = read_pair("q35-linux-hostpci")
    assert cmdline.unread == ()
    assert (cmdline.virt_type, cmdline.memballoon) == ("kvm", "virtio")
    assert config.hostdevs == cmdline.hostdevs == 6
    assert any("qemu-server's own file" in n for n in cmdline.derived["notes"])


@pytest.mark.parametrize("path", ["/usr/share/qemu-server/../../../tmp/pve-q35.cfg", "/tmp/pve-q35-4.0.cfg",
                                  "/usr/share/qemu-server/pve-q35.cfg\u2028", "/usr/share/qemu-server/pve-q35*.cfg",
                                  "/usr/share/qemu-server//pve-q35.cfg", "usr/share/qemu-server/pve-q35.cfg"])
def test_a_look_alike_readconfig_path_still_withholds(path: str) -> None:
    guest = guest_from_argv(["/usr/bin/kvm", "-m", "1024", "-readconfig", path], "x.args")
    assert guest.unread == (f"-readconfig {path}",)
    assert guest.virt_type is None and guest.memballoon is None


def test_qemu_servers_file_present_in_a_tree_is_read_as_it_is(tmp_path: Path) -> None:
    """A tree holding the file: its contents count (here a hostile one that turns on TCG), never the assumption."""
    share = tmp_path / "usr" / "share" / "qemu-server"
    share.mkdir(parents=True)
    (share / "pve-q35-4.0.cfg").write_text('[accel]\n  accel = "tcg"\n')
    guest = guest_from_argv(["/usr/bin/kvm", "-m", "1024", "-readconfig", "/usr/share/qemu-server/pve-q35-4.0.cfg"],
                            "x.args", host=HostRoot(str(tmp_path)))
    assert guest.virt_type == "qemu"


@pytest.mark.parametrize(("volume", "source"), [
    ("btrfs-store:8006/../../../etc/shadow.raw", None), ("btrfs-store:8006//vm-8006-disk-0.raw", None),
    ("local:8006/./../x.qcow2", None),
    ("btrfs-store:8006/vm;rm -rf.raw", "/butter/bread/images/8006/vm;rm -rf/disk.raw"),
    ("btrfs-store:1/base-1-disk-0.raw/8006/vm-8006-disk-0.raw", "/butter/bread/images/8006/vm-8006-disk-0/disk.raw"),
    ("btrfs-store:8006/vm-8006-disk-0.qcow2", "/butter/bread/images/8006/vm-8006-disk-0.qcow2")])
def test_a_btrfs_volume_resolves_beneath_its_images_directory_or_not_at_all(
        volume: str, source: str | None, tmp_path: Path) -> None:
    text = f"memory: 512\nscsihw: virtio-scsi-pci\nscsi0: {volume},size=1G\n"
    config, _, notes = read_config_text(text, str(tmp_path / "8006.conf"), storage_file(str(HERE / "storage.cfg")))
    (disk,) = config.disks
    assert disk.source == source
    if source is None:
        assert any("'..' path component; its storage findings are not judged" in n for n in notes), notes
