"""Guests in the forms real generators emit: every disk resolves to the right model.

Fixtures: ``tests/fixtures/generators/`` (see its README). For each disk the resolved
protocol, path, format, effective cache mode, aio and discard are asserted, then the
findings that follow from them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import run_rules
from kvmtune.domain.xml import load_guest_file
from kvmtune.host.root import HostRoot
from kvmtune.model.guest import Guest
from kvmtune.qemu.cmdline import guest_from_text

HERE = Path(__file__).resolve().parent.parent / "fixtures" / "generators"
FIXTURE_HOST = HERE.parent / "hosts" / "rules-default"

# target: (device, protocol, path, format, cache, aio, discard)
EXPECTED: dict[str, dict[str, tuple[str, str | None, str | None, str | None, str | None, str | None, str | None]]] = {
    "libvirt/web-blockdev.args": {
        "virtio-disk0": ("disk", "file", "/var/lib/libvirt/images/web.qcow2", "qcow2", "none", None, "unmap"),
        "scsi0-0-0-1": ("disk", "host_device", "/dev/vg0/web-db", "raw", "directsync", "native", None),
        "virtio-disk1": ("disk", "rbd", "volumes/volume-2f6c", "raw", "writeback", None, "unmap"),
        "sata0-0-0": ("cdrom", "file", "/var/lib/libvirt/images/web-seed.iso", "raw", None, None, None),
    },
    "proxmox/vm-100-pve9.args": {
        "scsi0": ("disk", "file", "/var/lib/vz/images/100/vm-100-disk-0.qcow2", "qcow2", "none", "io_uring", "unmap"),
        "virtio1": ("disk", "rbd", "ceph-vm/vm-100-disk-2", "raw", "directsync", None, None),
        "virtio2": ("disk", "file", "/mnt/pve/nfs-store/images/100/vm-100-disk-3.qcow2", "qcow2", "writeback",
                    "threads", None),
    },
    "proxmox/vm-101-pve8.args": {
        "scsi0": ("disk", "file", "/var/lib/vz/images/101/vm-101-disk-0.qcow2", "qcow2", "writethrough", "threads",
                  None),
        "virtio1": ("disk", "host_device", "/dev/pve/vm-101-disk-2", "raw", "none", "native", "unmap"),
        "ide2": ("cdrom", "file", "/var/lib/vz/template/iso/debian-12.iso", None, None, "io_uring", None),
        "drive6": ("firmware", "file", "/usr/share/pve-edk2-firmware//OVMF_CODE_4M.fd", "raw", None, None, None),
        "drive-efidisk0": ("firmware", "host_device", "/dev/pve/vm-101-disk-1", "raw", None, None, None),
    },
    "nova/instance-00000a1f.xml": {
        "vda": ("disk", "rbd", "vms/a7d3e2c1-6b5f-4e8d-9c0a-1b2c3d4e5f60_disk", "raw", "writeback", None, "unmap"),
        "vdb": ("disk", "file", "/var/lib/nova/instances/a7d3e2c1-6b5f-4e8d-9c0a-1b2c3d4e5f60/disk.eph0", "qcow2",
                "none", None, None),
        "vdc": ("disk", "host_device",
                "/dev/disk/by-path/ip-10.40.0.5:3260-iscsi-iqn.2010-10.org.openstack:volume-6c1d-lun-1", "raw", "none",
                "native", None),
        "hda": ("cdrom", "file", "/var/lib/nova/instances/a7d3e2c1-6b5f-4e8d-9c0a-1b2c3d4e5f60/disk.config", "raw",
                "none", None, None),
    },
    "virt-install/fedora-vm1.xml": {
        "vda": ("disk", "file", "/var/lib/libvirt/images/fedora-vm1.qcow2", "qcow2", None, None, "unmap"),
        "sda": ("cdrom", "file", "/var/lib/libvirt/boot/Fedora-Everything-netinst-x86_64-40.iso", "raw", None, None,
                None),
    },
    "handwritten/run-lab.args": {
        "data": ("disk", "file", "/srv/lab/data.qcow2", "qcow2", "none", "io_uring", "unmap"),
        "scratch": ("disk", "host_device", "/dev/nvme0n1p3", "raw", "writethrough", None, None),
        "ceph": ("disk", "rbd", "rbd/lab-ceph", "raw", "writeback", None, None),
        "nbd": ("disk", "nbd", "192.0.2.10:10809/lab-export", "raw", "unsafe", None, None),
        "jdisk": ("disk", "file", "/srv/lab/json.qcow2", "qcow2", "directsync", "native", None),
        "lun": ("lun", "host_device", "/dev/sdc", "raw", "none", None, None),
        "archive": ("disk", "file", "/srv/lab/archive.qcow2", "qcow2", None, None, None),
        "drive10": ("firmware", "file", "/usr/share/OVMF/OVMF_CODE.fd", "raw", None, None, None),
        "drive11": ("firmware", "file", "/srv/lab/OVMF_VARS.fd", "raw", None, None, None),
        "drive12": ("disk", "file", "/srv/lab/root.qcow2", "qcow2", "none", "native", "unmap"),
        "hda#29": ("disk", "file", "/srv/lab/old.img", None, None, None, None),
    },
}


def load(rel: str) -> Guest:
    path = HERE / rel
    guest = load_guest_file(path) if path.suffix == ".xml" else guest_from_text(path.read_text(), str(path))
    guest.on_audited_host = True
    return guest


def findings(guest: Guest) -> set[tuple[str, str | None]]:
    ctx = AuditContext(host=HostRoot(str(FIXTURE_HOST)))
    return {(f.rule, f.target.device) for f in run_rules(ctx, [guest])}


@pytest.mark.parametrize("rel", sorted(EXPECTED))
def test_every_disk_resolves_to_its_model(rel: str) -> None:
    guest = load(rel)
    got = {d.target: (d.device, d.protocol, d.source, d.format, d.cache, d.io, d.discard) for d in guest.disks}
    assert got == EXPECTED[rel]


def test_filters_between_device_and_image_are_seen_through() -> None:
    disks = {d.target: d for d in load("libvirt/web-blockdev.args").disks}
    assert disks["virtio-disk1"].filters == ["throttle", "copy-on-read"]
    assert disks["virtio-disk1"].source_type == "network"
    lab = {d.target: d for d in load("handwritten/run-lab.args").disks}
    assert lab["scratch"].filters == ["preallocate"] and lab["archive"].filters == ["compress"]
    pve = {d.target: d for d in load("proxmox/vm-100-pve9.args").disks}
    assert all(d.filters == ["throttle"] for d in pve.values())


def test_proxmox_inline_trees_get_the_storage_findings_they_deserve() -> None:
    got = findings(load("proxmox/vm-100-pve9.args"))
    assert ("KVM-STO-008", "disk:scsi0") in got  # the format rule sees qcow2, not raw
    assert ("KVM-STO-013", "disk:scsi0") in got  # file-backed, not "network" with the path "throttle"
    assert ("KVM-STO-014", "disk:virtio1") in got  # directsync reported as itself ...
    assert ("KVM-STO-002", "disk:virtio1") not in got  # ... not as writethrough
    assert ("KVM-STO-005", "disk:virtio2") in got  # writeback on a local file
    assert ("KVM-STO-006", "disk:virtio2") not in got  # aio=threads matters with O_DIRECT only
    assert not any(rule == "KVM-STO-015" for rule, _ in got)  # virtio-scsi single with its IOThread
    assert ("KVM-STO-011", "machine") not in got  # pc-q35-9.2+pve1 is new enough


def test_vendor_machine_suffix_and_legacy_forms() -> None:
    guest = load("proxmox/vm-101-pve8.args")
    got = findings(guest)
    assert guest.uuid == "5e7a1c3b-2d4f-4a6e-9b8c-0d1e2f3a4b5c"  # from -smbios type=1
    assert ("KVM-STO-011", "machine") in got  # pc-q35-3.1+pve0 is read as 3.1
    assert ("KVM-STO-002", "disk:scsi0") in got and ("KVM-STO-012", "disk:scsi0") in got
    assert ("KVM-CPU-001", "cpu") in got  # kvm64
    assert not any(dev and dev.startswith("disk:drive") for _, dev in got)  # the EFI vars are no data disk


def test_hand_written_script() -> None:
    guest = load("handwritten/run-lab.args")
    assert (guest.name, guest.virt_type, guest.cpu_model) == ("lab", "kvm", "core2duo")
    assert guest.memory_kib == (4 + 2 + 1) * 1024 * 1024  # -m 4G plus two pc-dimms (2 GiB, 1 GiB)
    got = findings(guest)
    assert ("KVM-CPU-001", "cpu") in got  # core2duo is a legacy model too
    assert ("KVM-STO-012", "disk:archive") in got  # pvscsi is emulated by QEMU
    assert ("KVM-STO-014", "disk:jdisk") in got
    assert ("KVM-STO-002", "disk:scratch") in got  # cache.direct=off under write-cache=off
    lun = [rule for rule, dev in got if dev == "disk:lun"]
    assert not [r for r in lun if r in ("KVM-STO-002", "KVM-STO-003", "KVM-STO-004", "KVM-STO-005", "KVM-STO-006",
                                        "KVM-STO-007", "KVM-STO-014")]  # no page-cache verdicts on a passthrough LUN
    assert not any(dev in ("disk:drive10", "disk:drive11") for _, dev in got)


def test_libvirt_firmware_nodes_are_not_disks() -> None:
    guest = load("libvirt/web-blockdev.args")
    assert all("pflash" not in (d.source or "") and "OVMF" not in (d.source or "") for d in guest.disks)
    assert guest.uuid == "4b1c7e2a-9d3f-4e5a-8b6c-1d2e3f4a5b6c"


@pytest.mark.parametrize("path", sorted((HERE / "other-hypervisors").glob("*.xml")), ids=lambda p: p.stem)
def test_other_hypervisors_get_one_info_line(path: Path) -> None:
    guest = load_guest_file(path)
    guest.on_audited_host = True
    ctx = AuditContext(host=HostRoot(str(FIXTURE_HOST)))
    got = run_rules(ctx, [guest, guest])  # also kept out of the run rules (duplicate MAC with itself)
    assert [(f.rule, str(f.severity)) for f in got] == [("KVM-GST-001", "info")] * 2
    assert got[0].summary == "not a KVM/QEMU guest: not audited"


def test_tcg_finding_for_every_architecture() -> None:
    for binary in ("qemu-system-aarch64 -machine virt", "qemu-system-riscv64 -machine virt",
                   "qemu-system-s390x -machine s390-ccw-virtio", "qemu-system-x86_64"):
        guest = guest_from_text(f"{binary} -name g -m 1G", "t")
        assert ("KVM-CPU-003", None) in findings(guest), binary


def test_xml_memory_devices_count_with_numa_cells(tmp_path: Path) -> None:
    xml = tmp_path / "dimm.xml"
    xml.write_text("""<domain type='kvm'><name>dimm</name>
  <maxMemory slots='4' unit='GiB'>32</maxMemory><memory unit='GiB'>6</memory><vcpu>2</vcpu>
  <os><type arch='x86_64' machine='pc-q35-8.2'>hvm</type></os>
  <cpu mode='host-passthrough'><numa><cell id='0' cpus='0-1' memory='4' unit='GiB'/></numa></cpu>
  <devices>
    <memory model='dimm'><target><size unit='GiB'>2</size><node>0</node></target></memory>
    <memory model='virtio-mem'><target><size unit='GiB'>8</size><node>0</node><block unit='MiB'>2</block>
      <requested unit='GiB'>1</requested></target></memory>
  </devices></domain>""")
    assert load_guest_file(xml).memory_kib == (4 + 2 + 1) * 1024 * 1024  # cells + dimm + plugged virtio-mem
