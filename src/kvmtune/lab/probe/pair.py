"""The guest tier's booted pair: two probe guests, A (as it is) and B (as fixed), each with its guest agent.

:func:`side_spec` describes one :class:`~kvmtune.lab.probe.side.GuestSide` as the probe guest's virtual
hardware (machine, vCPUs and topology, hugepage backing, the disk under test on its bus with its
controller, queues and IOThread, the NIC under test with its queues and rings), which the launcher's
:func:`kvmtune.lab.qemu.qemu_argv` alone turns into QEMU options. :class:`ProbePair`
builds the probe guest (:class:`kvmtune.lab.guest.GuestBuilder`, with ``qemu-ga`` and the drivers the
sides need), makes one scratch disk per side (laid out like the block tier's replicas, never the
guest's own image), boots both QEMUs once for the whole experiment and offers what
:class:`~kvmtune.lab.probe.side.GuestPair` promises: a command run in side A or B through the
agent's ``guest-exec``, and QMP. On exit, an exception or Ctrl-C both QEMUs stop and every file is
removed; the scratch disks are unlinked as soon as QEMU holds them open, so a killed kvmtune leaves
none (QEMU dies with kvmtune), and its run directories are swept by the next verify.

What the guest prints is the guest's: every answer is size-bounded by the agent client, decoded with
replacement, and parsed strictly by the experiment that asked.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvmtune.errors import KvmtuneError
from kvmtune.host.root import HostRoot
from kvmtune.lab.guest import (
    ExtraFile,
    GuestBuilder,
    ProbeGuest,
    find_kernel,
    guest_agent_file,
    guest_agent_job,
    resolve_modules,
)
from kvmtune.lab.probe.agent import ProbeAgent
from kvmtune.lab.probe.kernel import BOOT, KernelChoice, choice_for, lacks_line
from kvmtune.lab.probe.side import ExecResult, GuestSide, Plumbing
from kvmtune.lab.qemu import Disk, GuestRun, Machine, Nic, VmSpec, tap_netdev
from kvmtune.lab.replica import Layout, create_replica, make_scratch_dir
from kvmtune.lab.workdir import Started
from kvmtune.qemu.qmp import Qmp
from kvmtune.qemuopts import Aio, Cache, E, ImageFormat, enum_value, unknown_line
from kvmtune.runner import Runner

SIDES = ("A", "B")
DISK_ID = "kvmtune-scratch"  # the -drive id (QMP query-block's device)
DISK_DEV = "kvmtune-disk"  # the disk's -device id (query-pci / qom paths)
SCSI_ID = "kvmtune-scsi"
AHCI_ID = "kvmtune-ahci"
NETDEV_ID = "kvmtune-net"
NIC_DEV = "kvmtune-nic"
NIC_MAC = {"A": "52:54:00:6b:74:0a", "B": "52:54:00:6b:74:0b"}

# libvirt's SCSI controller models → QEMU's device and the Linux driver that runs it
SCSI_HBA: dict[str, tuple[str, tuple[str, ...]]] = {
    "virtio-scsi": ("virtio-scsi-pci", ("virtio_pci", "virtio_scsi", "sd_mod")),
    "lsilogic": ("lsi53c895a", ("sym53c8xx", "sd_mod")),
    "lsi": ("lsi53c895a", ("sym53c8xx", "sd_mod")),
    "lsi53c895a": ("lsi53c895a", ("sym53c8xx", "sd_mod")),
    "lsisas1068": ("mptsas1068", ("mptsas", "sd_mod")),
    "mptsas1068": ("mptsas1068", ("mptsas", "sd_mod")),
    "lsisas1078": ("megasas", ("megaraid_sas", "sd_mod")),
    "megasas": ("megasas", ("megaraid_sas", "sd_mod")),
    "megasas-gen2": ("megasas-gen2", ("megaraid_sas", "sd_mod")),
    "vmpvscsi": ("pvscsi", ("vmw_pvscsi", "sd_mod")),
    "pvscsi": ("pvscsi", ("vmw_pvscsi", "sd_mod")),
}
# libvirt's NIC models → QEMU's device and the Linux driver
NIC_DEVICE: dict[str, tuple[str, tuple[str, ...]]] = {
    "virtio": ("virtio-net-pci", ("virtio_pci", "virtio_net")),
    "e1000": ("e1000", ("e1000",)),
    "e1000e": ("e1000e", ("e1000e",)),
    "rtl8139": ("rtl8139", ("8139cp",)),
}


class Unbootable(KvmtuneError):
    """This side cannot be built as a probe guest here (a bus QEMU or the guest's kernel cannot drive); one line."""


def disk_modules(side: GuestSide) -> tuple[str, ...]:
    """The guest drivers the side's disk needs (module names, in no particular order)."""
    bus = side.disk_bus
    if bus is None:
        return ()
    if bus == "virtio":
        return ("virtio_pci", "virtio_blk")
    if bus == "ide":
        return ("ahci", "sd_mod") if side.machine == "q35" else ("ata_piix", "sd_mod")
    if bus == "sata":
        return ("ahci", "sd_mod")
    if bus == "nvme":
        return ("nvme",)
    if bus == "scsi":
        return _hba(side)[1]
    raise Unbootable(f"the probe guest has no {bus} disk (buses: ide, sata, scsi, virtio, nvme)")


def nic_modules(side: GuestSide) -> tuple[str, ...]:
    if side.nic_model is None:
        return ()
    return _nic(side)[1]


def side_modules(side: GuestSide) -> tuple[str, ...]:
    """Every guest driver the side needs, deduplicated."""
    return tuple(dict.fromkeys((*disk_modules(side), *nic_modules(side))))


def _hba(side: GuestSide) -> tuple[str, tuple[str, ...]]:
    model = (side.scsi_model or "lsilogic").lower()
    if model not in SCSI_HBA:
        raise Unbootable(f"the probe guest has no SCSI controller model {model!r}")
    return SCSI_HBA[model]


def _nic(side: GuestSide) -> tuple[str, tuple[str, ...]]:
    model = (side.nic_model or "").lower()
    if model not in NIC_DEVICE:
        raise Unbootable(f"the probe guest has no NIC model {model!r} ({', '.join(NIC_DEVICE)})")
    return NIC_DEVICE[model]


def _side_enum(kind: type[E], raw: str) -> E:
    value = enum_value(kind, raw)
    if value is None:
        raise Unbootable(unknown_line(kind, raw))
    return value


def _side_machine(side: GuestSide, hugetlbfs: str | None) -> Machine:
    if side.hugepages and not hugetlbfs:
        raise Unbootable("hugepage backing needs a mounted hugetlbfs (mount -t hugetlbfs none /dev/hugepages)")
    return Machine(side.machine, side.topology, hugetlbfs if side.hugepages else None)


def _side_disk(side: GuestSide, disk_path: str) -> Disk:
    bus = side.disk_bus
    assert bus is not None
    cache = _side_enum(Cache, side.disk_cache)
    io = _side_enum(Aio, side.disk_io)
    fmt = _side_enum(ImageFormat, side.disk_format)
    if bus not in ("ide", "sata", "scsi", "virtio", "nvme"):
        raise Unbootable(f"the probe guest has no {bus} disk (buses: ide, sata, scsi, virtio, nvme)")
    hba = _hba(side)[0] if bus == "scsi" else None
    virtio_scsi = hba == "virtio-scsi-pci"
    if side.disk_iothread and not (bus == "virtio" or virtio_scsi):
        raise Unbootable(f"an IOThread serves virtio-blk and virtio-scsi only, not a {bus} disk")
    if bus != "virtio" and ((side.disk_queues is not None and not virtio_scsi) or side.disk_queue_size is not None):
        raise Unbootable(f"queues are a virtio-blk (or virtio-scsi) setting, not a {bus} disk's")
    return Disk(disk_path, fmt, "virtio-blk" if bus == "virtio" else bus,
                Cache.WRITEBACK if cache == Cache.DEFAULT else cache,  # QEMU's default
                Aio.THREADS if io == Aio.DEFAULT else io, controller=hba, iothread=side.disk_iothread,
                queues=side.disk_queues, queue_size=side.disk_queue_size, drive_id=DISK_ID, device_id=DISK_DEV,
                controller_id={"scsi": SCSI_ID, "sata": AHCI_ID}.get(bus))


def _side_nic(side: GuestSide, tap: str | None, netdev: str | None, mac: str) -> Nic:
    device, _mods = _nic(side)
    queues = side.nic_queues or 1
    virtio = device == "virtio-net-pci"
    if not virtio and (queues > 1 or side.rx_queue_size or side.tx_queue_size or side.vhost):
        raise Unbootable(f"vhost, queues and ring sizes are virtio-net settings, not {side.nic_model}'s")
    if tap is not None:
        return Nic(NETDEV_ID, tap_netdev(NETDEV_ID, tap, side.vhost, queues), device, mac, NIC_DEV, queues=queues,
                   rx_queue_size=side.rx_queue_size or None, tx_queue_size=side.tx_queue_size or None)
    if netdev is None:
        raise Unbootable("the side has a NIC and nothing to attach it to (no tap and no -netdev)")
    return Nic(netdev, None, device, mac, NIC_DEV, queues=queues, rx_queue_size=side.rx_queue_size or None,
               tx_queue_size=side.tx_queue_size or None)


def side_hardware(side: GuestSide, disk_path: str | Path | None, *, tap: str | None = None, netdev: str | None = None,
                  hugetlbfs: str | None = None, mac: str = NIC_MAC["A"]) -> tuple[Machine, list[Disk], list[Nic]]:
    """The side's machine, disk and NIC as the launcher takes them (see :func:`side_spec`); :class:`Unbootable`
    with one line for what the probe guest cannot be."""
    machine = _side_machine(side, hugetlbfs)
    disks = []
    if side.disk_bus is not None:
        if disk_path is None:
            raise Unbootable("the side has a disk and no scratch disk was given")
        disks.append(_side_disk(side, str(disk_path)))
    nics = [_side_nic(side, tap, netdev, mac)] if side.nic_model is not None else []
    return machine, disks, nics


def side_spec(guest: ProbeGuest, side: GuestSide, *, accel: str, disk_path: str | Path | None, job: str | None = None,
              tap: str | None = None, netdev: str | None = None, hugetlbfs: str | None = None,
              mac: str = NIC_MAC["A"], agent_socket: Path | None = None, plumbing: Plumbing | None = None) -> VmSpec:
    """The probe guest with this side's virtual hardware, for :func:`kvmtune.lab.qemu.qemu_argv` (which alone
    turns it into QEMU options): its machine, vCPUs and topology, hugepage backing, the disk under test on its bus
    with its controller, queues and IOThread, the NIC under test with its queues and rings, the agent's channel.

    ``disk_path``: the side's scratch disk (required when the side has a disk). The NIC goes on a tap (``tap``:
    its name; the ``-netdev`` comes with the NIC, with vhost and queues) or on a ``-netdev`` the side's
    :class:`~kvmtune.lab.probe.side.Plumbing` defines (``netdev``: its id). ``hugetlbfs``: where hugepage backing
    is mounted. Raises :class:`Unbootable` with one line for what the probe guest cannot be.
    """
    machine, disks, nics = side_hardware(side, disk_path, tap=tap, netdev=netdev, hugetlbfs=hugetlbfs, mac=mac)
    plumbing = plumbing or Plumbing()
    # PVH boot of the bare vmlinux is QEMU 4.0's: an older (versioned) machine type boots the bzImage
    boots = guest if side.machine in ("pc", "q35") else replace(guest, vmlinux=None)
    return VmSpec(guest=boots, accel=accel, memory_mb=side.memory_mb, smp=side.vcpus, job=job,
                  extra_args=plumbing.extra_args, wrapper=plumbing.wrapper, machine=machine, disks=disks, nics=nics,
                  agent_socket=agent_socket)


def kernel_lacks(host: HostRoot, names: Iterable[str], kernel: str | None = None,
                 modules_dir: str | None = None) -> tuple[str, list[str]]:
    """(the probe guest kernel's release, the modules among ``names`` it neither ships nor has built in);
    reads only ``modules.dep``/``modules.builtin``, builds nothing."""
    info = find_kernel(host, kernel, modules_dir)
    if info.modules_dir is None:
        return info.release, list(names)
    dep = (info.modules_dir / "modules.dep").read_text()
    builtin_path = info.modules_dir / "modules.builtin"
    builtin = builtin_path.read_text() if builtin_path.is_file() else ""
    _order, missing = resolve_modules(dep, builtin, names)
    return info.release, missing


def side_device(side: GuestSide) -> str:
    """The side's device under test, for a message: ``sata``, ``lsilogic SCSI controller``, ``e1000 NIC``."""
    if side.disk_bus in ("ide", "sata", "nvme"):
        return side.disk_bus
    if side.disk_bus == "scsi":
        return f"{side.scsi_model or 'lsilogic'} SCSI controller"
    if side.disk_bus == "virtio":
        return "virtio-blk disk"
    if side.nic_model is not None:
        return f"{side.nic_model} NIC"
    return "its device"


def missing_driver_line(side_name: str, side: GuestSide, release: str, missing: Sequence[str],
                        choice: KernelChoice | None = None) -> str:
    """One line: which driver side ``side_name`` needs that the probe guest's kernel lacks, and how to get one
    (lab/probe/kernel's line, the same the planners give; ``choice``: where the kernel came from, default bench's)."""
    return lacks_line(f"side {side_name} ({side_device(side)})", list(missing), release,
                      choice or KernelChoice(None, None, BOOT))


def hugetlbfs_mount(host: HostRoot) -> str | None:
    """Where a hugetlbfs is mounted on this host (the first), or None."""
    text = host.read_optional("/proc/mounts") or ""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[2] == "hugetlbfs":
            return parts[1].replace("\\040", " ")
    return None


def side_job(guest: ProbeGuest, side: GuestSide) -> str:
    """The probe guest's job for one side: load its drivers, start the agent, wait to be stopped."""
    insmod = "".join(f"insmod /lib/modules/{m} 2>/dev/null\n" for m in guest.modules_for(side_modules(side)))
    return insmod + guest_agent_job() + "echo KVMTUNE-PROBE-READY\nwhile true; do sleep 3600; done\n"


@dataclass
class _Side:
    name: str
    side: GuestSide
    run: GuestRun | None = None
    qmp: Qmp | None = None
    agent: ProbeAgent | None = None
    disk: Path | None = None
    agent_sock: Path | None = None


class ProbePair(Started):
    """Two booted probe guests, A and B (a context manager implementing :class:`~kvmtune.lab.probe.side.GuestPair`).

    ``a``/``b``: each side's hardware. ``accel``: ``kvm`` or ``tcg`` (what the caller decided; QMP's
    ``query-kvm`` says what QEMU really runs, :attr:`accel`). ``scratch_parent``: where the scratch disks
    go (the block tier's choice, :func:`kvmtune.verify.block.pair.scratch_parent`), each ``disk_size`` bytes;
    ``plumbing``: per side, extra QEMU options and the command prefix QEMU runs under (a tap in a kvmtune
    namespace); ``taps``: per side, the tap :func:`side_spec` brings the ``-netdev`` for (else a ``-netdev``
    in the plumbing with id :data:`NETDEV_ID`); ``extra``/``modules``: more files and drivers for the probe
    guest; ``kernel``/``modules_dir``: another kernel for it; ``layouts``: how each scratch disk is created.
    """

    def __init__(self, a: GuestSide, b: GuestSide, *, runner: Runner, workdir: Path, accel: str,
                 host: HostRoot | None = None, scratch_parent: Path | None = None, disk_size: int = 1 << 30,
                 plumbing: tuple[Plumbing, Plumbing] = (Plumbing(), Plumbing()),
                 taps: tuple[str | None, str | None] = (None, None), extra: Sequence[ExtraFile] = (),
                 modules: Sequence[str] = (), kernel: str | None = None, modules_dir: str | None = None,
                 layouts: tuple[Layout, Layout] | None = None, boot_timeout: float = 240.0) -> None:
        if accel not in ("kvm", "tcg"):
            raise ValueError(f"accel must be kvm or tcg, not {accel!r}")
        self.runner = runner
        self.workdir = workdir
        self.host = host or HostRoot()
        self.requested_accel = accel
        self.scratch_parent = scratch_parent or workdir
        self.disk_size = disk_size
        self.plumbing = dict(zip(SIDES, plumbing, strict=True))
        self.taps = dict(zip(SIDES, taps, strict=True))
        self.extra = tuple(extra)
        self.more_modules = tuple(modules)
        self.kernel = kernel
        self.modules_dir = modules_dir
        self.boot_timeout = boot_timeout
        # each scratch disk as qemu-img creates it (the block tier's replica layout: format, cluster size,
        # preallocation); by default a sparse file of the side's format
        self.layouts = dict(zip(SIDES, layouts or (Layout(format=a.disk_format), Layout(format=b.disk_format)), strict=True))  # type: ignore[arg-type]
        for name, side in (("A", a), ("B", b)):
            if side.disk_bus is not None and self.layouts[name].format != side.disk_format:
                raise ValueError(f"side {name}: layout format {self.layouts[name].format} is not the disk's {side.disk_format}")
        self.sides = {"A": _Side("A", a), "B": _Side("B", b)}
        self.guest: ProbeGuest | None = None
        self.run_dir: Path | None = None
        self.disk_dir: Path | None = None
        self._accel: str | None = None
        self.boot_s: float = 0.0

    # ------------------------------------------------------------------ lifecycle

    def build(self) -> ProbeGuest:
        """The probe guest with qemu-ga, fio and every driver both sides need; :class:`Unbootable` names a missing one."""
        needed = tuple(dict.fromkeys(m for s in self.sides.values() for m in side_modules(s.side)))
        builder = GuestBuilder(self.workdir, self.runner, self.host, kernel=self.kernel, modules_dir=self.modules_dir,
                               extra=(guest_agent_file(), *self.extra), more_modules=(*needed, *self.more_modules))
        guest = builder.build()
        for s in self.sides.values():
            lacking = [m for m in side_modules(s.side) if m in guest.missing_optional]
            if lacking:
                raise Unbootable(missing_driver_line(s.name, s.side, guest.release, lacking,
                                                      choice_for(self.kernel, self.modules_dir)))
        return guest

    def start(self) -> None:
        started = time.monotonic()
        self.guest = guest = self.build()
        hugetlbfs = hugetlbfs_mount(self.host) if any(s.side.hugepages for s in self.sides.values()) else None
        self.run_dir = make_scratch_dir(self.workdir)
        if any(s.side.disk_bus for s in self.sides.values()):
            self.disk_dir = self.run_dir if self.scratch_parent == self.workdir else make_scratch_dir(self.scratch_parent)
        for s in self.sides.values():
            if s.side.disk_bus is not None:
                assert self.disk_dir is not None
                s.disk = self.disk_dir / f"disk-{s.name}.{s.side.disk_format}"
                create_replica(self.runner, s.disk, self.layouts[s.name], self.disk_size)
            s.agent_sock = self.run_dir / f"qga-{s.name}.sock"
            plumb = self.plumbing[s.name]
            netdev = NETDEV_ID if self.taps[s.name] is None and any(a == "-netdev" for a in plumb.extra_args) else None
            spec = side_spec(guest, s.side, accel=self.requested_accel, disk_path=s.disk, job=side_job(guest, s.side),
                             tap=self.taps[s.name], netdev=netdev, hugetlbfs=hugetlbfs, mac=NIC_MAC[s.name],
                             agent_socket=s.agent_sock, plumbing=plumb)
            s.run = GuestRun(spec, self.run_dir / s.name, self.runner, name=f"probe-{s.name}")
            s.run.start()
        for s in self.sides.values():  # both boot side by side
            self._connect(s, started + self.boot_timeout)
        accels = {s.name: self._query_accel(s) for s in self.sides.values()}
        if accels["A"] != accels["B"]:
            raise KvmtuneError(f"the two probe guests run under different accelerators ({accels['A']}, {accels['B']})")
        self._accel = accels["A"]
        self.boot_s = time.monotonic() - started

    def _connect(self, s: _Side, until: float) -> None:
        assert s.run is not None and s.agent_sock is not None
        s.agent = ProbeAgent(s.run, s.agent_sock, s.name)
        while True:
            s.agent.alive()
            try:
                s.qmp = Qmp(s.run.qmp_path, timeout=5.0)
                break
            except (OSError, ConnectionError):
                if time.monotonic() > until:
                    raise KvmtuneError(f"QMP of probe guest {s.name} did not answer") from None
                time.sleep(0.1)
        if s.disk is not None:  # QEMU holds it open now: a killed kvmtune leaves no scratch disk behind
            s.disk.unlink(missing_ok=True)
        s.agent.connect(until, self.boot_timeout)

    def _query_accel(self, s: _Side) -> str:
        kvm = self.qmp(s.name, "query-kvm")
        return "kvm" if isinstance(kvm, dict) and kvm.get("enabled") is True else "tcg"

    def close(self) -> None:
        for s in self.sides.values():
            if s.agent is not None:
                s.agent.close()
                s.agent = None
            if s.qmp is not None:
                s.qmp.close()
                s.qmp = None
            if s.run is not None:
                s.run.close()
            if s.disk is not None:
                s.disk.unlink(missing_ok=True)
        for d in (self.disk_dir, self.run_dir):
            if d is not None:
                shutil.rmtree(d, ignore_errors=True)
        self.disk_dir = self.run_dir = None

    # ------------------------------------------------------------------ GuestPair

    @property
    def accel(self) -> str:
        if self._accel is None:
            raise KvmtuneError("the probe guests are not running")
        return self._accel

    def _side(self, side: str) -> _Side:
        if side not in self.sides:
            raise ValueError(f"side must be A or B, not {side!r}")
        return self.sides[side]

    def qmp(self, side: str, command: str, arguments: dict[str, Any] | None = None) -> Any:
        s = self._side(side)
        if s.qmp is None:
            raise KvmtuneError(f"probe guest {side} is not running")
        try:
            return s.qmp.execute(command, **(arguments or {}))
        except (OSError, ValueError) as exc:
            raise KvmtuneError(f"QMP {command} of probe guest {side}: {exc}") from None

    def exec(self, side: str, argv: list[str], timeout: float) -> ExecResult:
        """Run ``argv`` (an absolute path first) in probe guest ``side`` through ``guest-exec``; wait at most
        ``timeout`` seconds, then kill it (rc None)."""
        s = self._side(side)
        if s.agent is None or not s.agent.connected:
            raise KvmtuneError(f"probe guest {side} is not running")
        return s.agent.exec(argv, timeout)
