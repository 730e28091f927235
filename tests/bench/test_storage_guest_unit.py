"""Probe guest builder pieces: modules.dep resolution, ldd parsing, kernel lookup, cpio, PVH notes."""

from __future__ import annotations

import struct
import subprocess
from pathlib import Path

import pytest

from kvmtune.errors import KvmtuneError
from kvmtune.host.root import HostRoot
from kvmtune.lab.guest import (
    CpioWriter,
    bzimage_release,
    find_kernel,
    has_pvh_note,
    parse_ldd,
    resolve_modules,
)

DEP = """kernel/drivers/virtio/virtio.ko.xz: kernel/drivers/virtio/virtio_ring.ko.xz
kernel/drivers/virtio/virtio_ring.ko.xz:
kernel/drivers/virtio/virtio_pci.ko.xz: kernel/drivers/virtio/virtio_pci_legacy_dev.ko.xz @@
kernel/drivers/virtio/virtio.ko.xz kernel/drivers/virtio/virtio_ring.ko.xz
kernel/drivers/virtio/virtio_pci_legacy_dev.ko.xz:
kernel/drivers/block/virtio_blk.ko.xz: kernel/drivers/virtio/virtio.ko.xz kernel/drivers/virtio/virtio_ring.ko.xz
kernel/block/kyber-iosched.ko.xz:
""".replace(" @@\n", " ")  # long lines are wrapped here, joined again


def test_modules_come_after_their_dependencies_once_each() -> None:
    order, missing = resolve_modules(DEP, "kernel/drivers/nvme/host/nvme.ko\n", ["virtio_pci", "virtio_blk", "nvme"])
    assert missing == []  # nvme is built in
    names = [p.rsplit("/", 1)[1] for p in order]
    assert names == [
        "virtio_ring.ko.xz",
        "virtio.ko.xz",
        "virtio_pci_legacy_dev.ko.xz",
        "virtio_pci.ko.xz",
        "virtio_blk.ko.xz",
    ]


def test_dash_and_underscore_names_match_and_absent_modules_are_reported() -> None:
    order, missing = resolve_modules(DEP, "", ["kyber_iosched", "ata_piix"])
    assert [p.rsplit("/", 1)[1] for p in order] == ["kyber-iosched.ko.xz"]
    assert missing == ["ata_piix"]


def test_parse_ldd_keeps_loader_and_skips_vdso() -> None:
    text = (
        "\tlinux-vdso.so.1 (0x00007ffd)\n"
        "\tlibaio.so.1 => /lib/x86_64-linux-gnu/libaio.so.1 (0x00007f35)\n"
        "\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f35)\n"
        "\t/lib64/ld-linux-x86-64.so.2 (0x00007f35)\n"
    )
    assert parse_ldd(text) == [
        "/lib/x86_64-linux-gnu/libaio.so.1",
        "/lib/x86_64-linux-gnu/libc.so.6",
        "/lib64/ld-linux-x86-64.so.2",
    ]


def _fake_bzimage(version: str) -> bytes:
    data = bytearray(0x2000)
    data[0x202:0x206] = b"HdrS"
    data[0x20E:0x210] = struct.pack("<H", 0x1000 - 0x200)
    v = f"{version} (builder@host) #1 SMP".encode()
    data[0x1000 : 0x1000 + len(v)] = v
    return bytes(data)


def test_bzimage_release_reads_the_header() -> None:
    assert bzimage_release(_fake_bzimage("6.1.0-56-cloud-amd64")) == "6.1.0-56-cloud-amd64"
    assert bzimage_release(b"\0" * 0x400) is None


def test_find_kernel_picks_the_newest_and_its_module_tree(tmp_path: Path) -> None:
    (tmp_path / "boot").mkdir()
    for v in ("6.1.0-9-amd64", "6.1.0-10-amd64", "5.10.0-30-amd64"):
        (tmp_path / "boot" / f"vmlinuz-{v}").write_bytes(_fake_bzimage(v))
    mods = tmp_path / "lib" / "modules" / "6.1.0-10-amd64"
    mods.mkdir(parents=True)
    (mods / "modules.dep").write_text(DEP)
    k = find_kernel(HostRoot(str(tmp_path)))
    assert k.release == "6.1.0-10-amd64"
    assert k.path.name == "vmlinuz-6.1.0-10-amd64"
    assert k.modules_dir == mods


def test_find_kernel_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(KvmtuneError, match=r"/boot: no vmlinuz"):
        find_kernel(HostRoot(str(tmp_path)))
    bad = tmp_path / "notakernel"
    bad.write_bytes(b"hello")
    with pytest.raises(KvmtuneError, match="not a bzImage"):
        find_kernel(HostRoot(str(tmp_path)), kernel=str(bad))
    with pytest.raises(KvmtuneError, match="kernel image not found"):
        find_kernel(HostRoot(str(tmp_path)), kernel=str(tmp_path / "missing"))
    good = tmp_path / "vmlinuz-x"
    good.write_bytes(_fake_bzimage("9.9.9"))
    (tmp_path / "mods").mkdir()
    with pytest.raises(KvmtuneError, match=r"no modules\.dep"):
        find_kernel(HostRoot(str(tmp_path)), kernel=str(good), modules_dir=str(tmp_path / "mods"))


def test_cpio_archive_is_readable_by_cpio(tmp_path: Path) -> None:
    out = tmp_path / "a.cpio"
    with open(out, "wb") as fh:
        w = CpioWriter(fh)
        w.file("usr/bin/tool", b"#!/bin/sh\necho hi\n", 0o755)
        w.symlink("bin/sh", "/bin/busybox")
        w.file("etc/kvmtune/modules", b"a.ko\n")
        w.trailer()
    with open(out, "rb") as fh:
        listing = subprocess.run(["cpio", "-it", "--quiet"], stdin=fh, capture_output=True, text=True)
    assert listing.returncode == 0, listing.stderr
    names = listing.stdout.split()
    assert {"usr", "usr/bin", "usr/bin/tool", "bin/sh", "etc/kvmtune/modules"} <= set(names)
    assert out.stat().st_size % 4 == 0


def _elf_with_note(name: bytes, ntype: int) -> bytes:
    note = struct.pack("<III", len(name) + 1, 4, ntype) + (name + b"\0").ljust((len(name) + 4) & ~3, b"\0") + b"\0" * 4
    hdr = bytearray(64)
    hdr[:5] = b"\x7fELF\x02"
    struct.pack_into("<Q", hdr, 0x20, 64)  # phoff
    struct.pack_into("<HH", hdr, 0x36, 56, 1)
    ph = struct.pack("<IIQQQQQQ", 4, 0, 64 + 56, 0, 0, len(note), len(note), 4)
    return bytes(hdr) + ph + note


def test_pvh_note_detection() -> None:
    assert has_pvh_note(_elf_with_note(b"Xen", 18))
    assert not has_pvh_note(_elf_with_note(b"Xen", 17))
    assert not has_pvh_note(_elf_with_note(b"GNU", 18))
    assert not has_pvh_note(b"MZ not an elf")
