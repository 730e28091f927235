"""One module-dependency closure (lab.guest.module_closure) for the boot list, storage and network guests."""

from __future__ import annotations

from pathlib import Path

from kvmtune.lab.guest import ProbeGuest, module_closure

DEPS = {
    "virtio_net": ("net_failover",),
    "net_failover": ("failover",),
    "failover": (),
    "virtio_blk": (),
    "nvme": ("nvme_core",),
    "nvme_core": (),
    "loop_a": ("loop_b",),
    "loop_b": ("loop_a",),  # a cycle must not hang it
}


def test_closure_follows_dependencies_transitively_and_normalises_dashes() -> None:
    assert module_closure(DEPS, ["virtio-net"]) == {"virtio_net", "net_failover", "failover"}
    assert module_closure(DEPS, ["nvme", "virtio_blk"]) == {"nvme", "nvme_core", "virtio_blk"}
    assert module_closure(DEPS, ["loop_a"]) == {"loop_a", "loop_b"}
    assert module_closure(DEPS, ["unknown"]) == {"unknown"}


def test_guest_modules_for_keeps_load_order() -> None:
    paths = ("kernel/net/core/failover.ko", "kernel/drivers/net/net_failover.ko", "kernel/drivers/nvme/nvme-core.ko",
             "kernel/drivers/net/virtio_net.ko", "kernel/drivers/nvme/nvme.ko", "kernel/drivers/block/virtio_blk.ko")
    guest = ProbeGuest(kernel=Path("vmlinuz"), initrd=Path("initrd"), key="k", release="6.1", modules=(),
                       missing_optional=(), tools=(), size=0, cached=True, module_paths=paths, module_deps=DEPS)
    assert guest.modules_for(["virtio_net"]) == [paths[0], paths[1], paths[3]]
    assert guest.modules_for(["nvme"]) == [paths[2], paths[4]]
