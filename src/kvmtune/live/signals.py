"""Rates over one interval, from two snapshots of the same guests."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvmtune.live.model import GuestSample, HostSample, Snapshot


@dataclass
class DiskRates:
    iops: float
    mb_s: float
    read_ms: float | None  # mean time per read over the interval; None when no read completed
    write_ms: float | None
    flush_ms: float | None
    tps: float  # reads + writes per second, what seed 001 sized disks by


@dataclass
class NicRates:
    pps: float
    drops: int
    drop_fraction: float


@dataclass
class GuestRates:
    key: str
    name: str
    source: str
    vcpu_delay: dict[int, float] = field(default_factory=dict)  # run delay as a fraction of the interval
    vcpu_busy: dict[int, float] = field(default_factory=dict)
    disks: dict[str, DiskRates] = field(default_factory=dict)
    nics: dict[str, NicRates] = field(default_factory=dict)
    memory_kib: int | None = None
    balloon_kib: int | None = None
    balloon_fraction: float | None = None  # balloon size / defined memory
    halt_poll_success: float | None = None
    identity: str = ""  # GuestSample.identity: what metrics are keyed by
    owner: str = ""  # GuestSample.owner: who runs a QEMU libvirt did not start
    # signal -> why its figure could not be taken (symptoms.Signal.unmeasured, filled by diagnose.Diagnoser):
    # "not measured" in top, sample and why, and no Prometheus sample at all
    not_measured: dict[str, str] = field(default_factory=dict)

    @property
    def max_vcpu_delay(self) -> float | None:
        return max(self.vcpu_delay.values()) if self.vcpu_delay else None

    @property
    def tps(self) -> float:
        return sum(d.tps for d in self.disks.values())


@dataclass
class HostRates:
    cpu_busy: float | None = None
    psi_some: dict[str, float] = field(default_factory=dict)  # avg10, percent
    psi_full: dict[str, float] = field(default_factory=dict)
    swap_in_s: float | None = None  # pages per second
    swap_out_s: float | None = None
    ksm_saved_bytes: int | None = None
    halt_poll_success: float | None = None
    not_measured: dict[str, str] = field(default_factory=dict)  # as GuestRates.not_measured, for host signals


@dataclass
class Rates:
    interval_s: float
    host: HostRates
    guests: list[GuestRates]
    notes: list[str]


def _per_op_ms(ns: int, ops: int) -> float | None:
    return ns / ops / 1e6 if ops > 0 else None


def _ratio(num: int | None, den: int | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return num / den


def guest_rates(a: GuestSample, b: GuestSample, dt: float) -> GuestRates:
    out = GuestRates(b.key, b.name, b.source, identity=b.identity or b.key, owner=b.owner)
    dt_ns = dt * 1e9
    for i, vb in b.vcpus.items():
        va = a.vcpus.get(i)
        if va is None:
            continue
        out.vcpu_delay[i] = max(0, vb.delay_ns - va.delay_ns) / dt_ns
        out.vcpu_busy[i] = max(0, vb.cpu_ns - va.cpu_ns) / dt_ns
    for name, db in b.disks.items():
        da = a.disks.get(name)
        if da is None:
            continue
        rd, wr, fl = db.rd_ops - da.rd_ops, db.wr_ops - da.wr_ops, db.fl_ops - da.fl_ops
        out.disks[name] = DiskRates(
            iops=(rd + wr) / dt,
            mb_s=(db.rd_bytes - da.rd_bytes + db.wr_bytes - da.wr_bytes) / dt / 1e6,
            read_ms=_per_op_ms(db.rd_ns - da.rd_ns, rd),
            write_ms=_per_op_ms(db.wr_ns - da.wr_ns, wr),
            flush_ms=_per_op_ms(db.fl_ns - da.fl_ns, fl),
            tps=(rd + wr) / dt,
        )
    for name, nb in b.nics.items():
        na = a.nics.get(name)
        if na is None:
            continue
        pkts = nb.rx_pkts - na.rx_pkts + nb.tx_pkts - na.tx_pkts
        drops = nb.rx_drop - na.rx_drop + nb.tx_drop - na.tx_drop
        out.nics[name] = NicRates(pps=pkts / dt, drops=drops,
                                  drop_fraction=drops / (pkts + drops) if pkts + drops > 0 else 0.0)
    out.memory_kib, out.balloon_kib = b.memory_kib, b.balloon_kib
    if b.balloon_kib is not None and b.memory_kib:
        out.balloon_fraction = b.balloon_kib / b.memory_kib
    if a.halt_poll_attempted is not None and b.halt_poll_attempted is not None:
        out.halt_poll_success = _ratio((b.halt_poll_success or 0) - (a.halt_poll_success or 0),
                                       b.halt_poll_attempted - a.halt_poll_attempted)
    return out


def host_rates(a: HostSample, b: HostSample, dt: float) -> HostRates:
    out = HostRates()
    if a.cpu is not None and b.cpu is not None:
        total = b.cpu.total - a.cpu.total
        idle = (b.cpu.idle + b.cpu.iowait) - (a.cpu.idle + a.cpu.iowait)
        out.cpu_busy = (total - idle) / total if total > 0 else None
    for resource, p in b.pressure.items():
        if p.some_avg10 is not None:
            out.psi_some[resource] = p.some_avg10
        if p.full_avg10 is not None:
            out.psi_full[resource] = p.full_avg10
    if a.pswpin is not None and b.pswpin is not None:
        out.swap_in_s = (b.pswpin - a.pswpin) / dt
    if a.pswpout is not None and b.pswpout is not None:
        out.swap_out_s = (b.pswpout - a.pswpout) / dt
    if b.ksm_sharing is not None:
        out.ksm_saved_bytes = b.ksm_sharing * b.page_size
    if a.halt_poll_attempted is not None and b.halt_poll_attempted is not None:
        out.halt_poll_success = _ratio((b.halt_poll_success or 0) - (a.halt_poll_success or 0),
                                       b.halt_poll_attempted - a.halt_poll_attempted)
    return out


def rates(a: Snapshot, b: Snapshot) -> Rates:
    dt = max(b.t - a.t, 1e-6)
    guests = [guest_rates(a.guests[key], g, dt) for key, g in b.guests.items() if key in a.guests]
    return Rates(dt, host_rates(a.host, b.host, dt), sorted(guests, key=lambda g: g.name), list(b.notes))
