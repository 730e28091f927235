"""What the tests of probe-guest options share: a probe guest that is never booted, and the options a side adds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvmtune.lab.guest import ProbeGuest
from kvmtune.lab.probe.pair import side_spec
from kvmtune.lab.probe.side import GuestSide
from kvmtune.lab.qemu import VmSpec, qemu_argv

PROBE = ProbeGuest(kernel=Path("/boot/vmlinuz"), initrd=Path("/w/initrd"), key="k", release="6.1", modules=(),
                   missing_optional=(), tools=(), size=0, cached=True)


def qemu_args(side: GuestSide, disk: str | Path | None, **kw: Any) -> list[str]:
    """The options a side adds to a bare probe guest's: the launcher's qemu_argv of the side's spec, less those of
    the same guest without the side's hardware."""
    spec = side_spec(PROBE, side, accel="tcg", disk_path=disk, **kw)
    full = qemu_argv(spec, Path("/w/vm.serial"), Path("/w/vm.qmp"), None)
    bare = qemu_argv(VmSpec(guest=spec.guest, accel="tcg", memory_mb=spec.memory_mb, smp=spec.smp),
                     Path("/w/vm.serial"), Path("/w/vm.qmp"), None)
    assert full[: len(bare)] == bare
    return full[len(bare):]
