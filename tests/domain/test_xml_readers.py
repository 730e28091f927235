"""The domain XML reader is a table of small readers: one per top-level element, one per device element."""

from __future__ import annotations

import pytest
from lxml import etree

from kvmtune.domain import xml
from kvmtune.domain.xml import guest_from_tree, parse_xml_bytes
from kvmtune.model.guest import Guest

DOMAIN = b"""<domain type='kvm'>
  <name>w</name>
  <vcpu>2</vcpu>
  <clock offset='utc'/>
  <devices>
    <watchdog model='i6300esb'/>
    <disk type='file' device='disk'><source file='/img/w.raw'/><target dev='vda' bus='virtio'/></disk>
    <watchdog model='itco'/>
  </devices>
</domain>"""


def _read(data: bytes = DOMAIN) -> Guest:
    return guest_from_tree(parse_xml_bytes(data, "w.xml"), "w.xml")


def test_a_new_device_reader_sees_each_of_its_elements_with_its_position(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str | None, int, str]] = []

    def read_watchdog(devices: xml._Devices, el: etree._Element, n: int) -> None:
        seen.append((el.get("model"), n, devices.guest.name))

    monkeypatch.setitem(xml.DEVICE_READERS, "watchdog", read_watchdog)
    guest = _read()
    assert seen == [("i6300esb", 1, "w"), ("itco", 2, "w")]
    assert [d.target for d in guest.disks] == ["vda"]  # the other readers are untouched


def test_a_new_domain_reader_runs_for_every_domain(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str | None] = []

    def read_clock(guest: Guest, top: dict[str, etree._Element]) -> None:
        clock = top.get("clock")
        seen.append(clock.get("offset") if clock is not None else None)

    monkeypatch.setitem(xml.DOMAIN_READERS, "clock", read_clock)
    _read()
    _read(b"<domain type='kvm'><name>bare</name></domain>")
    assert seen == ["utc", None]  # called with or without its element: an absent element is a default too


def test_unknown_elements_are_left_alone() -> None:
    guest = _read()
    assert (guest.vcpus, guest.memballoon, guest.hostdevs) == (2, None, 0)


@pytest.mark.parametrize(("target", "device", "bus"), [
    ("hda", "disk", "ide"), ("hdc", "cdrom", "ide"), ("sdb", "disk", "scsi"), ("vdc", "disk", "virtio"),
    ("xvda", "disk", "xen"), ("fda", "floppy", "fdc"), ("uba", "disk", "usb"), ("nvme0n1", "disk", None),
])
def test_a_disk_target_without_bus_gets_the_bus_libvirt_infers_from_its_name(
        target: str, device: str, bus: str | None) -> None:
    guest = _read(f"""<domain type='kvm'><name>b</name><devices>
      <disk type='file' device='{device}'><source file='/img/b'/><target dev='{target}'/></disk>
    </devices></domain>""".encode())
    (disk,) = guest.disks
    assert disk.bus == bus
    if bus is not None:
        where = "/@device" if device == "floppy" else "/target/@dev"
        assert disk.where("bus") == "/domain/devices/disk[1]" + where  # the evidence is the name, not an absent @bus


def test_a_stated_bus_is_kept_whatever_the_name() -> None:
    guest = _read(b"""<domain type='kvm'><name>b</name><devices>
      <disk type='file' device='disk'><source file='/img/b'/><target dev='hda' bus='sata'/></disk>
    </devices></domain>""")
    assert guest.disks[0].bus == "sata"
    assert guest.disks[0].where("bus") == "/domain/devices/disk[1]/target/@bus"
