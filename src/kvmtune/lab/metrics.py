"""The metrics catalogue: every number a benchmark stores, with its unit and
which direction is better. ``compare``, the charts, the verdicts and
``results show`` read direction, unit and label from here; nothing guesses
them from a metric's name.

Some metrics come in families (fio's percentiles per direction, the network
tier's client/server CPU figures); a family is one entry whose ``name`` is a
pattern (``clat_pNN_us``) matched by a regular expression.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum


class Better(Enum):
    HIGHER = "higher"
    LOWER = "lower"
    NEITHER = "neither"  # a fact about the cell (duration, bytes moved), not a figure of merit


@dataclass(frozen=True)
class Metric:
    name: str  # the stored name, or the family's pattern as users see it (clat_pNN_us)
    unit: str
    better: Better
    label: str
    summed_over_pairs: bool = False  # network runs: pairs add up (throughput) rather than average (latency)
    regex: str | None = None  # families only
    measured: bool = True  # False: a placeholder a tier cannot measure (shown as "–", never compared)

    def better_ratio(self, a: float, b: float) -> float | None:
        """How many times better ``b`` is than ``a`` (> 1: b better); None without a direction or a positive pair."""
        if a <= 0 or b <= 0 or self.better is Better.NEITHER:
            return None
        return b / a if self.better is Better.HIGHER else a / b

    def pct_better(self, a: float | None, b: float | None) -> float | None:
        """``b`` against ``a`` in % with positive meaning better; lower-is-better metrics are compared as rates."""
        if a is None or b is None:
            return None
        r = self.better_ratio(a, b)
        return None if r is None else 100.0 * r - 100.0


H, L, N = Better.HIGHER, Better.LOWER, Better.NEITHER

_RW = r"(?:_(?:read|write))?"

CATALOGUE: tuple[Metric, ...] = (
    # fio, in a guest, through QEMU's block layer, or on the bare-metal floor
    Metric("iops", "IO/s", H, "IOPS"),
    Metric("iops_read", "IO/s", H, "read IOPS"),
    Metric("iops_write", "IO/s", H, "write IOPS"),
    Metric("bw_Bps", "B/s", H, "bandwidth"),
    Metric("bw_read_Bps", "B/s", H, "read bandwidth"),
    Metric("bw_write_Bps", "B/s", H, "write bandwidth"),
    Metric("lat_mean_us", "µs", L, "mean latency"),
    Metric("lat_mean_RW_us", "µs", L, "mean latency per direction", regex=rf"lat_mean{_RW}_us"),
    Metric("clat_pNN_us", "µs", L, "completion latency percentile", regex=rf"clat_p\d+(?:[._]\d+)?{_RW}_us"),
    Metric("fio_usr_cpu_pct", "%", L, "fio user CPU"),
    Metric("fio_sys_cpu_pct", "%", L, "fio system CPU"),
    Metric("fio_runtime_s", "s", N, "fio measured time"),
    Metric("guest_cpu_busy_pct", "%", L, "guest CPU busy"),
    Metric("guest_restored", "flag", N, "ran in a restored guest"),
    Metric("pct_of_bare_metal", "%", H, "% of bare metal"),
    Metric("unallocated_write_pct", "%", N, "writes to unallocated clusters"),
    # the host beside the benchmark
    Metric("host_tps", "tps", L, "host disk transactions/s"),
    Metric("host_write_kBps", "kB/s", L, "host disk writes"),
    Metric("qemu_cpu_s", "s", L, "QEMU CPU time"),
    Metric("qemu_cpu_pct", "%", L, "QEMU CPU"),
    Metric("window_s", "s", N, "measured window"),
    Metric("daemon_exit_s", "s", N, "storage daemon exit after the cell (writeback: its write-back)"),
    Metric("slot_s", "s", N, "wall time from the previous cell's end to this cell's"),
    Metric("ramp_overlap_ms", "ms", N, "the previous cell's last requests, during this cell's ramp"),
    # seed 001's boot-write-shutdown cycle and the disk it is set against
    Metric("host_tps_per_vm", "tps", L, "host tps per VM"),
    Metric("vm_lifetime_s", "s", N, "VM lifetime"),
    Metric("write_mib", "MiB", N, "MiB written"),
    Metric("capacity_iops", "IO/s", H, "disk capacity IOPS"),
    Metric("capacity_host_tps", "tps", H, "disk capacity (transactions/s)"),
    # qemu-img bench (the quick tier)
    Metric("elapsed_s", "s", L, "qemu-img bench time"),
    # the network tier (netload)
    Metric("throughput_Bps", "B/s", H, "throughput", summed_over_pairs=True),
    Metric("tps", "tx/s", H, "transactions/s", summed_over_pairs=True),
    Metric("bytes", "B", N, "bytes moved", summed_over_pairs=True),
    Metric("transactions", "count", N, "transactions", summed_over_pairs=True),
    Metric("errors", "count", L, "errors"),
    Metric("measured_s", "s", N, "netload measured time"),
    Metric("tcp_retransmits", "count", L, "TCP segments retransmitted (both sides, TCP_INFO)"),
    Metric("undelivered_messages", "count", L, "messages still in flight when netload's drain time was up"),
    Metric("lat_STAT_us", "µs", L, "transaction time", regex=r"lat_(?:avg|p50|p90|p99|p99_9)_us"),
    Metric("SIDE_cpu_s_per_mb", "s/MB", L, "CPU per MB", regex=r"(?:client|server)_cpu_s_per_mb"),
    Metric("SIDE_cpu_us_per_txn", "µs", L, "CPU per transaction", regex=r"(?:client|server)_cpu_us_per_txn"),
    Metric("SIDE_cpu_busy_pct", "%", L, "CPU busy", regex=r"(?:client|server)_cpu_busy_pct"),
    Metric("qemu_SIDE_cpu_pct", "%", L, "QEMU CPU", regex=r"qemu_(?:client|server)_cpu_pct"),
    Metric("qemu_SIDE_cpu_s_per_mb", "s/MB", L, "QEMU CPU per MB", regex=r"qemu_(?:client|server)_cpu_s_per_mb"),
    Metric("guest_mtu", "B", N, "guest MTU"),
    # the datapath tier: CPU of the whole path (both netloads plus the topology's daemons, e.g. ovs-vswitchd)
    Metric("path_cpu_s_per_mb", "s/MB", L, "path CPU per MB"),
    Metric("path_cpu_us_per_txn", "µs", L, "path CPU per transaction"),
    Metric("daemon_cpu_s", "s", L, "forwarding daemons' CPU time"),
    Metric("ovs_unforwarded_pct", "%", L, "packets Open vSwitch received but did not forward"),
    Metric("ovs_socket_drop_pct", "%", L, "packets Open vSwitch's AF_PACKET sockets dropped (receive buffer full)"),
)

_EXACT = {m.name: m for m in CATALOGUE if m.regex is None}
_FAMILIES = [(re.compile(m.regex), m) for m in CATALOGUE if m.regex is not None]


def lookup(name: str) -> Metric | None:
    """The catalogue entry of a stored metric name, or None for a name no tier stores."""
    found = _EXACT.get(name)
    if found is not None:
        return found
    for pattern, family in _FAMILIES:
        if pattern.fullmatch(name):
            return family
    return None


def metric(name: str) -> Metric:
    """Like :func:`lookup` for names the code itself uses; a missing entry is a kvmtune bug."""
    found = lookup(name)
    if found is None:
        raise KeyError(f"metric {name!r} is not in the catalogue (kvmtune.lab.metrics)")
    return found


def names() -> list[str]:
    """Every catalogue name as a user may type it (families shown by their pattern)."""
    return [m.name for m in CATALOGUE]


def lower_is_better(name: str) -> bool:
    m = lookup(name)
    return m is not None and m.better is Better.LOWER
