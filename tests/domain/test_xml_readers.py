"""The domain XML reader is a table of small readers: one per top-level element, one per device element."""

from __future__ import annotations

from pathlib import Path

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


# --- templates: the byte search that spares most definitions the walk must miss no placeholder -------

TEMPLATE = """<domain type='kvm'>
  <name>{{ vm_name }}</name>
  <description>free text {not a placeholder}</description>
  <memory unit='MiB'>%(memory)s</memory>
  <devices><disk type='file' device='disk'><source file='{path}'/><target dev='vda'/></disk></devices>
</domain>"""
PLACEHOLDERS = ("{{ vm_name }}", "%(memory)s", "{path}")
# the same placeholders with no "{" or "%" byte in the file: character references only
ESCAPED = (TEMPLATE.replace("{", "&#123;").replace("}", "&#x7D;").replace("%", "&#37;")
           .replace("free text &#123;not a placeholder&#x7D;", "free text"))

EBCDIC = ("<?xml version='1.0' encoding='IBM037'?>" + TEMPLATE.replace("\n", "")).encode("cp037")  # "{" is 0xC0


def _reads(data: bytes) -> bool:
    """Whether this lxml's parser reads ``data`` (its encoding) at all."""
    try:
        etree.fromstring(data)
    except etree.XMLSyntaxError:
        return False
    return True


@pytest.mark.parametrize("data", [
    TEMPLATE.encode(),
    ESCAPED.encode(),
    TEMPLATE.encode("utf-16"),  # a byte-order mark, no declaration (lxml's docinfo then says UTF-8)
    ("<?xml version='1.0' encoding='UTF-16'?>" + TEMPLATE).encode("utf-16-le"),
    ("<?xml version='1.0' encoding='ISO-8859-1'?>" + TEMPLATE.replace("free", "fr\xe9e")).encode("latin-1"),
    pytest.param(EBCDIC, marks=pytest.mark.skipif(not _reads(EBCDIC), reason="this lxml's libxml2 refuses EBCDIC "
                                                  "(\"Unsupported encoding\"): nothing to audit, one error line")),
], ids=["utf-8", "char-refs", "utf-16-bom", "utf-16-declared", "latin-1", "ebcdic"])
def test_placeholders_are_found_with_and_without_the_source_bytes(data: bytes) -> None:
    assert guest_from_tree(parse_xml_bytes(data, "t.xml"), "t.xml", raw=data).template == PLACEHOLDERS
    assert guest_from_tree(parse_xml_bytes(data, "t.xml"), "t.xml").template == PLACEHOLDERS


def test_braces_only_in_free_text_or_percent_signs_make_no_template(tmp_path: Path) -> None:
    data = (b"<domain type='kvm'><name>a</name><title>{x}</title><description>{{ y }}</description>"
            b"<memory unit='KiB'>1024</memory><!-- {z} --><devices><disk type='file'>"
            b"<source file='/img/100%.raw'/><target dev='vda'/></disk></devices></domain>")
    f = tmp_path / "a.xml"
    f.write_bytes(data)
    guest = xml.load_guest_file(f)
    assert (guest.template, guest.disks[0].source) == ((), "/img/100%.raw")
    assert guest_from_tree(parse_xml_bytes(data, "a.xml"), "a.xml").template == ()
