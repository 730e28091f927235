"""What the QEMU guest agent told kvmtune about the inside of one running guest.

Every value was written by the guest, so each one was checked against a narrow pattern
when it was read (``guestagent/inside.py``): a value that did not fit is absent here and
named in ``unreadable``. ``None`` means "not known" (the agent does not offer it, or the
guest has no such file), never "off".
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class GuestDiskScheduler:
    name: str  # the guest's block device name: vda, sdb, nvme0n1
    bus: str | None  # the agent's bus-type for it (virtio, scsi, sata, ...), None when not reported
    current: str | None  # the bracketed entry of queue/scheduler: none, mq-deadline, bfq, kyber, noop, deadline, cfq
    available: tuple[str, ...] = ()


@dataclass(frozen=True)
class GuestDriver:
    """A Windows guest's PCI device and the driver bound to it (guest-get-devices)."""

    vendor_id: int
    device_id: int
    driver: str | None  # None: no driver bound
    version: str | None = None


@dataclass
class GuestInside:
    via: str  # how it was read: "libvirt qemu:///system" or "agent socket /run/vm1/qga.sock"
    os_kind: str | None = None  # linux | windows | None (unknown)
    kernel_release: str | None = None
    schedulers: list[GuestDiskScheduler] = field(default_factory=list)
    clocksource: str | None = None
    clocksources_available: tuple[str, ...] = ()
    entropy_avail: int | None = None
    rng_current: str | None = None  # hw_random's rng_current: virtio_rng.0, tpm-rng, none
    rng_available: tuple[str, ...] = ()
    thp_enabled: str | None = None  # always | madvise | never
    discard_mounts: tuple[str, ...] = ()  # mount points mounted with the discard option
    trim_scheduled: bool | None = None  # fstrim.timer enabled or a cron fstrim job; None: unknown
    drivers: list[GuestDriver] = field(default_factory=list)  # Windows only
    unreadable: list[str] = field(default_factory=list)  # what the agent answered but did not fit
    blocked: list[str] = field(default_factory=list)  # agent commands the guest disabled

    @property
    def is_linux(self) -> bool:
        return self.os_kind == "linux"

    @property
    def is_windows(self) -> bool:
        return self.os_kind == "windows"
