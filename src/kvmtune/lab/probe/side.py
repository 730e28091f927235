"""The guest tier's vocabulary: one side of a probe-guest experiment, and what a booted pair offers.

A :class:`GuestSide` is the part of a guest's virtual hardware that the guest-visible fixes change
(disk bus and controller, IOThread, queues, NIC model, vhost, NIC queues and rings, vCPUs and their
topology, hugepage backing), read from the audit's model (side A) or from the model of the
definition the rule's fixer wrote on a copy (side B). It is plain data: ``lab/probe/pair.py`` turns
it into QEMU options for the probe guest, ``verify/guest/disk.py`` and ``verify/guest/nic.py`` build
it from a finding's disk or interface.

:class:`Plumbing` is what a side needs from outside the VM (a tap in a kvmtune namespace);
:class:`GuestPair` is what the booted pair offers an experiment: run a command in side A or B
through the guest agent, and ask QEMU (QMP) what it was really given.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Protocol


@dataclass(frozen=True)
class GuestSide:
    """One probe guest's virtual hardware, as far as the guest-visible fixes change it.

    ``None`` means "not part of this experiment" (no such device in the probe guest) or QEMU's
    default, as each field says.
    """

    # the disk under test (None: no disk)
    disk_bus: str | None = None  # ide | sata | virtio (virtio-blk) | scsi (on scsi_model) | usb
    scsi_model: str | None = None  # scsi bus only: virtio-scsi | lsilogic | megasas | ...
    disk_iothread: bool = False  # the disk's (virtio-blk) or its controller's (virtio-scsi) IOThread
    disk_queues: int | None = None  # virtio-blk num-queues (None: QEMU's default for the machine type)
    disk_queue_size: int | None = None  # virtio-blk queue-size
    disk_format: str = "raw"  # the scratch replica's format (raw | qcow2)
    disk_cache: str = "none"
    disk_io: str = "threads"
    # the NIC under test (None: no NIC)
    nic_model: str | None = None  # virtio | e1000 | e1000e | rtl8139 | ...
    vhost: bool = False
    nic_queues: int | None = None  # multiqueue virtio-net: queue pairs (None: one)
    rx_queue_size: int | None = None
    tx_queue_size: int | None = None
    # the machine
    vcpus: int = 1
    topology: tuple[int, int, int] | None = None  # sockets, cores, threads (None: QEMU's default)
    memory_mb: int = 512
    hugepages: bool = False
    machine: str = "pc"  # pc | q35

    def changes_to(self, other: GuestSide) -> str:
        """``field a → b`` for every field that differs, in declaration order (one line)."""
        parts = []
        for f in fields(self):
            a, b = getattr(self, f.name), getattr(other, f.name)
            if a != b:
                parts.append(f"{f.name.replace('_', ' ')} {_show(a)} → {_show(b)}")
        return ", ".join(parts) or "no change"


def _show(value: object) -> str:
    if value is None:
        return "default"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return "x".join(str(v) for v in value)
    return str(value)


class TwoSides:
    """What an experiment on two probe guests changes, A (as it is) to B (as fixed): a base for experiments whose
    ``a`` and ``b`` are :class:`GuestSide` s."""

    a: GuestSide
    b: GuestSide

    @property
    def change(self) -> str:
        return self.a.changes_to(self.b)


@dataclass(frozen=True)
class Plumbing:
    """What one side needs from outside its VM: extra QEMU options (``-netdev tap,…``), a command prefix
    QEMU runs under (``nsenter --net=…``: a tap opened inside a kvmtune namespace)."""

    extra_args: tuple[str, ...] = ()
    wrapper: tuple[str, ...] = ()


@dataclass(frozen=True)
class ExecResult:
    """A command run in a probe guest through its agent (``guest-exec``)."""

    rc: int | None  # None: it did not finish in time (the guest killed it)
    stdout: str
    stderr: str
    seconds: float


class GuestPair(Protocol):
    """Two booted probe guests, A (as it is) and B (as fixed), each with its guest agent."""

    @property
    def accel(self) -> str: ...  # kvm | tcg: what QEMU really runs (QMP query-kvm), the same for both sides

    def exec(self, side: str, argv: list[str], timeout: float) -> ExecResult: ...

    def qmp(self, side: str, command: str, arguments: dict[str, Any] | None = None) -> Any: ...
