"""The probe guest's QEMU argv, as each user of the launcher builds it, against a golden file.

The golden (tests/lab/golden/probe_argv.json) was written by the code before the launcher became the one place
that turns probe-guest virtual hardware into QEMU options (issue 44): the storage guest tier's disks on every bus,
the net guest tier's NICs on every backend, and verify's guest tier sides (machine, disk, NIC, agent). The tiers'
argv must stay byte-identical (the net and storage guest tiers' gained the agent
channel when they moved to the agent);
``KVMTUNE_REGEN_GOLDEN=1`` rewrites the file (only ever on purpose).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from kvmtune.bench.net.guest import NetContext, _vm_spec
from kvmtune.lab.guest import ProbeGuest
from kvmtune.lab.net.topology import Endpoint
from kvmtune.lab.probe.pair import NETDEV_ID, NIC_MAC, side_spec
from kvmtune.lab.probe.side import GuestSide, Plumbing
from kvmtune.lab.qemu import Disk, VmSpec, qemu_argv

GOLDEN = Path(__file__).with_name("golden") / "probe_argv.json"
SERIAL, QMP, JOB = Path("/w/run/vm.serial"), Path("/w/run/vm.qmp"), Path("/w/run/vm.job.sh")
QGA = Path("/w/scratch/run/qga.sock")  # the storage guest tier's agent channel
GUEST = ProbeGuest(kernel=Path("/boot/vmlinuz-6.1"), initrd=Path("/w/guest/initrd.img"), key="k", release="6.1",
                   modules=(), missing_optional=(), tools=(), size=0, cached=True, vmlinux=Path("/w/guest/vmlinux"))


def _argv(spec: VmSpec) -> list[str]:
    return qemu_argv(spec, SERIAL, QMP, JOB if spec.job is not None else None)


def storage_argvs() -> dict[str, list[str]]:
    """What bench/storage/guest.py's _boot_group and snapshot.py give the launcher."""
    out = {}
    for bus in ("virtio-blk", "virtio-scsi", "ide", "nvme"):
        for fmt, cache, aio in (("raw", "none", "native"), ("qcow2", "writeback", "threads"),
                                ("raw", "directsync", "io_uring")):
            for accel, smp in (("kvm", 1), ("tcg", 1), ("tcg", 2)):
                spec = VmSpec(guest=GUEST, accel=accel, memory_mb=1024, smp=smp,
                              disks=[Disk(f"/w/scratch/img.{fmt}", fmt, bus, cache, aio)], job="fio\n",
                              agent_socket=QGA)
                out[f"storage {bus} {fmt} {cache} {aio} {accel} {smp}"] = _argv(spec)
    restored = VmSpec(guest=GUEST, accel="tcg", disks=[Disk("/w/s.raw", "raw", "virtio-blk", "none", "threads")],
                      job="x\n", incoming=Path("/w/snap/state.bin"), agent_socket=QGA)
    out["storage restored"] = _argv(restored)
    return out


def net_argvs(tmp: Path) -> dict[str, list[str]]:
    """What bench/net/guest.py's _vm_spec gives the launcher, per endpoint backend (macvtap's fd number as FD), the
    guest agent's channel included (the net tier drives its guests through the agent since issue 44's last step)."""
    chardev = tmp / "tap7"
    chardev.write_bytes(b"")
    eps = {
        "tap vhost mtu9000": Endpoint("c0", "client", 0, 0, "kvmtune-ab12-h0", "tap", "52:54:00:4b:00:00",
                                      "198.18.0.10/24", None, 9000, True, "198.18.0.10", ifname="kvtap-c0"),
        "tap mtu1500": Endpoint("s1", "server", 1, 0, "kvmtune-ab12-h0", "tap", "52:54:00:4b:01:01",
                                "198.18.0.111/24", None, 1500, False, "198.18.0.111", ifname="kvtap-s1"),
        "macvtap": Endpoint("s0", "server", 0, 0, "kvmtune-ab12-h0", "macvtap", "52:54:00:4b:01:00",
                            "198.18.0.110/24", None, 1500, False, "198.18.0.110", ifname="kvmvt-s0",
                            chardev=str(chardev)),
        "user": Endpoint("s0", "server", 0, 1, "kvmtune-ab12-h1", "user", "52:54:00:4b:01:00", "198.18.200.15/24",
                         "198.18.200.2", 1500, False, "198.19.1.2", ports=(7200, 7201), hostfwd_address="198.19.1.2"),
    }
    ctx = cast(NetContext, SimpleNamespace(guest=GUEST, accel=SimpleNamespace(accel="tcg"), memory_mb=512, smp=2))
    out = {}
    for name, ep in eps.items():
        spec, fd = _vm_spec(ctx, ep, "serve\n", Path(f"/w/net/qga-{ep.name}.sock"))
        try:
            argv = [*spec.wrapper, *_argv(spec)]
        finally:
            if fd is not None:
                os.close(fd)
        out[f"net {name}"] = [re.sub(r"\bfd=\d+\b", "fd=FD", a) for a in argv]
    return out


SIDES: dict[str, tuple[GuestSide, dict[str, Any]]] = {
    "ide pc": (GuestSide(disk_bus="ide"), {}),
    "ide q35": (GuestSide(disk_bus="ide", machine="q35"), {}),
    "sata qcow2 default cache": (GuestSide(disk_bus="sata", disk_format="qcow2", disk_cache="default",
                                           disk_io="default"), {}),
    "virtio knobs": (GuestSide(disk_bus="virtio", disk_queues=4, disk_queue_size=128, disk_iothread=True,
                               vcpus=4, topology=(1, 2, 2), memory_mb=1024), {}),
    "virtio-scsi iothread": (GuestSide(disk_bus="scsi", scsi_model="virtio-scsi", disk_iothread=True,
                                       disk_queues=2, vcpus=2), {}),
    "lsilogic": (GuestSide(disk_bus="scsi", scsi_model="lsilogic"), {}),
    "nvme hugepages": (GuestSide(disk_bus="nvme", hugepages=True), {"hugetlbfs": "/dev/hugepages"}),
    "pc-i440fx-2.9": (GuestSide(disk_bus="virtio", machine="pc-i440fx-2.9"), {}),
    "virtio-net mq tap": (GuestSide(nic_model="virtio", vhost=True, nic_queues=4, rx_queue_size=1024,
                                    tx_queue_size=1024, vcpus=4), {"tap": "kvtap-a"}),
    "e1000 plumbing": (GuestSide(nic_model="e1000"), {"plumbing": True}),
    "virtio-net plumbing": (GuestSide(nic_model="virtio", vhost=True, nic_queues=2), {"plumbing": True}),
}


def verify_argvs() -> dict[str, list[str]]:
    """What verify's ProbePair.start gives the launcher (side_spec) for one side (the agent's socket, the plumbing's -netdev
    and its namespace prefix included)."""
    out = {}
    for name, (side, how) in SIDES.items():
        for s in ("A", "B"):
            plumb = Plumbing(("-netdev", f"tap,id={NETDEV_ID},ifname=kvtap-{s.lower()},script=no,downscript=no"),
                             ("nsenter", "--net=/proc/1234/ns/net")) if how.get("plumbing") else Plumbing()
            disk = Path(f"/w/scratch/disk-{s}.{side.disk_format}") if side.disk_bus else None
            netdev = NETDEV_ID if how.get("tap") is None and plumb.extra_args else None
            spec = side_spec(GUEST, side, accel="tcg", disk_path=disk, job="agent\n", tap=how.get("tap"), netdev=netdev,
                             hugetlbfs=how.get("hugetlbfs"), mac=NIC_MAC[s], agent_socket=Path(f"/w/run/qga-{s}.sock"),
                             plumbing=plumb)
            out[f"verify {name} {s}"] = [*spec.wrapper, *_argv(spec)]
    return out


def all_argvs(tmp: Path) -> dict[str, list[str]]:
    return {**storage_argvs(), **net_argvs(tmp), **verify_argvs()}


def test_every_tier_gives_qemu_the_argv_it_gave_before(tmp_path: Path) -> None:
    now = all_argvs(tmp_path)
    if os.environ.get("KVMTUNE_REGEN_GOLDEN"):
        GOLDEN.write_text(json.dumps(now, indent=1) + "\n")
    golden = json.loads(GOLDEN.read_text())
    assert sorted(now) == sorted(golden)
    for key in golden:
        assert now[key] == golden[key], key
