"""Counters read from one source at one instant. Rates come from two of them (``signals``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvmtune.host.parsers import CpuTimes
from kvmtune.model.guest import Guest


@dataclass
class VcpuCounters:
    cpu_ns: int
    delay_ns: int  # time runnable but waiting for a host CPU (schedstat's run_delay)
    allowed_cpus: frozenset[int] | None = None


@dataclass
class DiskCounters:
    rd_ops: int = 0
    wr_ops: int = 0
    fl_ops: int = 0
    rd_bytes: int = 0
    wr_bytes: int = 0
    rd_ns: int = 0
    wr_ns: int = 0
    fl_ns: int = 0


@dataclass
class NicCounters:
    rx_pkts: int = 0
    tx_pkts: int = 0
    rx_drop: int = 0
    tx_drop: int = 0


@dataclass
class GuestSample:
    """One running guest. ``key`` is its identity: source plus name, never the name alone."""

    key: str
    name: str
    source: str
    pid: int | None = None
    vcpus: dict[int, VcpuCounters] = field(default_factory=dict)
    disks: dict[str, DiskCounters] = field(default_factory=dict)
    nics: dict[str, NicCounters] = field(default_factory=dict)
    memory_kib: int | None = None
    balloon_kib: int | None = None
    halt_poll_success: int | None = None
    halt_poll_attempted: int | None = None
    guest: Guest | None = None  # the configuration, for diagnosis
    notes: list[str] = field(default_factory=list)
    # what metrics are keyed by, the same across a restart: "uuid:<UUID>" (libvirt, QEMU -uuid or smbios),
    # else "name:<QEMU -name>", else "pid:<pid>" (an unnamed process has nothing steadier)
    identity: str = ""
    # who runs a QEMU that libvirt did not start (its user name, else "uid N"): any user may start one and
    # give it any -name; "" for libvirt's guests
    owner: str = ""


@dataclass
class Pressure:
    some_avg10: float | None = None
    full_avg10: float | None = None


@dataclass
class HostSample:
    cpu: CpuTimes | None = None
    online_cpus: int | None = None
    pressure: dict[str, Pressure] = field(default_factory=dict)
    pswpin: int | None = None
    pswpout: int | None = None
    ksm_shared: int | None = None
    ksm_sharing: int | None = None
    page_size: int = 4096
    halt_poll_success: int | None = None
    halt_poll_attempted: int | None = None


@dataclass
class Snapshot:
    t: float  # time.monotonic() when the sample began
    host: HostSample
    guests: dict[str, GuestSample] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # one line per source that is not available
