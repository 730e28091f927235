"""The command-line reader is a table of small readers: one per option (family), one per kind of -device."""

from __future__ import annotations

import pytest

from kvmtune.qemu import cmdline
from kvmtune.qemu.argv import Option
from kvmtune.qemu.cmdline import guest_from_argv


def test_a_new_option_reader_sees_each_option_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str | None, int]] = []

    def read_rtc(r: cmdline._Reading, opt: Option) -> None:
        seen.append((opt.value, opt.index))

    monkeypatch.setitem(cmdline.OPTION_READERS, "-rtc", read_rtc)
    guest = guest_from_argv(["qemu-system-x86_64", "-rtc", "base=utc", "-m", "1G", "-rtc", "base=localtime"], "t")
    assert seen == [("base=utc", 0), ("base=localtime", 2)]
    assert guest.memory_kib == 1024**2  # the other readers are untouched


def test_a_device_reader_gets_its_devices_after_all_options(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, str | None]] = []

    def read_rng(r: cmdline._Reading, dev: Option, drv: str) -> None:
        obj = r.objects.get(str(dev.props.get("rng")))  # the object comes after the device: still known
        seen.append((drv, obj.props.get("filename") if obj else None))

    monkeypatch.setitem(cmdline.DEVICE_READERS, "rng", read_rng)
    guest = guest_from_argv(["qemu-system-x86_64", "-device", "VIRTIO-RNG-PCI,rng=r0",
                             "-object", "rng-random,id=r0,filename=/dev/urandom"], "t")
    assert seen == [("virtio-rng-pci", "/dev/urandom")]
    assert guest.rngs == []  # the replaced reader alone decides


@pytest.mark.parametrize(("driver", "kind"), [
    ("virtio-blk-pci", "disk"), ("scsi-generic", None), ("vhost-user-blk-pci", "vhostuser-disk"),
    ("e1000", "interface"), ("vfio-pci", "hostdev"), ("virtio-balloon-pci", "memballoon"), ("virtio-rng-pci", "rng"),
    ("qxl-vga", None),
])
def test_each_device_goes_to_one_reader(driver: str, kind: str | None) -> None:
    props = {"driver": driver, "drive": "d0"} if driver == "virtio-blk-pci" else {"driver": driver}
    assert cmdline._device_kind(driver, props) == kind
    assert kind is None or kind in cmdline.DEVICE_READERS
