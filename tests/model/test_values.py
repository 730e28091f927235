"""The value normalisation both readers share (model/values.py), and that they agree through it."""

from __future__ import annotations

import pytest

from kvmtune.domain.xml import guest_from_tree, parse_xml_bytes
from kvmtune.model.values import (
    CACHE_MODES,
    cache_mode,
    disk_protocol,
    machine_bus,
    qemu_bool,
    qemu_object_kib,
    qemu_size_kib,
    switch_on,
    unit_kib,
    xml_int,
)
from kvmtune.qemu.cmdline import guest_from_argv


@pytest.mark.parametrize("mode", sorted(m for m in CACHE_MODES if m != "off"))
def test_cache_modes_round_trip(mode: str) -> None:
    # libvirt's name -> QEMU's three cache flags -> libvirt's name again
    assert cache_mode(*CACHE_MODES[mode]) == mode


def test_cache_mode_unset_and_off() -> None:
    assert cache_mode(None, None, None) is None
    assert cache_mode(*CACHE_MODES["off"]) == "none"  # -drive cache=off is QEMU's old spelling of none


@pytest.mark.parametrize(("value", "unit", "kib"), [
    (4, "GiB", 4 * 1024**2), (4, "G", 4 * 1024**2), (1, "GB", 976562), (2048, None, 2048), (2048, "KiB", 2048),
    (1024, "bytes", 1), (3, "furlongs", 3), (1, "TiB", 1024**3),
])
def test_libvirt_units(value: int, unit: str | None, kib: int) -> None:
    assert unit_kib(value, unit) == kib


@pytest.mark.parametrize(("text", "kib"), [
    ("2048", 2048 * 1024), ("4G", 4 * 1024**2), ("4GiB", 4 * 1024**2), ("512M", 512 * 1024), ("1.5G", 1536 * 1024),
    ("64k", 64), ("lots", None),
])
def test_qemu_memory_sizes_default_to_mib(text: str, kib: int | None) -> None:
    assert qemu_size_kib(text) == kib


def test_qemu_object_sizes_default_to_bytes() -> None:
    assert qemu_object_kib("1073741824") == 1024**2
    assert qemu_object_kib("1G") == 1024**2
    assert qemu_object_kib(None) is None


def test_two_switch_grammars() -> None:
    # QEMU takes on/true/yes/1 (and JSON booleans); libvirt's on/off switch only "on"
    assert [qemu_bool(v) for v in ("on", "TRUE", " yes", "1", "off", True, False, None)] == \
        [True, True, True, True, False, True, False, None]
    assert [switch_on(v) for v in ("on", " ON ", "yes", "true", None)] == [True, True, False, False, False]


def test_xml_int() -> None:
    assert [xml_int(v) for v in (" 4 ", "0x10", "four", None)] == [4, 16, None, None]


def test_disk_protocols_and_buses() -> None:
    assert disk_protocol("file", "disk", None) == "file"
    assert disk_protocol("block", "cdrom", None) == "host_cdrom"
    assert disk_protocol("network", "disk", "rbd") == "rbd"
    assert machine_bus("ide", "pc-q35-8.2") == "sata"
    assert machine_bus("ide", "pc-i440fx-8.2") == "ide"


def _xml_disk(cache: str, discard: str) -> tuple[str | None, str | None, str | None]:
    xml = (f"<domain type='kvm'><name>x</name><devices><disk type='file' device='disk'>"
           f"<driver name='qemu' type='raw' cache='{cache}' discard='{discard}'/><source file='/img/x.raw'/>"
           f"<target dev='vda' bus='virtio'/></disk></devices></domain>").encode()
    (disk,) = guest_from_tree(parse_xml_bytes(xml, "t.xml"), "t.xml").disks
    return disk.cache, disk.discard, disk.protocol


def _argv_disk(cache: str, discard: str) -> tuple[str | None, str | None, str | None]:
    g = guest_from_argv(["qemu-system-x86_64", "-drive", f"file=/img/x.raw,format=raw,if=none,id=d0,cache={cache},"
                         f"discard={discard}", "-device", "virtio-blk-pci,drive=d0"], "t.args")
    (disk,) = g.disks
    return disk.cache, disk.discard, disk.protocol


@pytest.mark.parametrize("cache", sorted(m for m in CACHE_MODES if m != "off"))
def test_both_readers_say_the_same(cache: str) -> None:
    # the same disk written as domain XML and as a QEMU command line reads as the same values
    assert _xml_disk(cache, "unmap") == _argv_disk(cache, "unmap") == (cache, "unmap", "file")
