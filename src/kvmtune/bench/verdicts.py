"""One verdict line per seed claim, computed from stored cells of one accelerator.

Each function looks for the cells its claim needs; when they are not there
it says which preset measures them. Ratios use the mean over repetitions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvmtune.bench.stats import mean
from kvmtune.bench.store import CellRow


@dataclass(frozen=True)
class Verdict:
    seed: str
    claim: str
    measured: str | None  # None: not measured in these runs
    ratio: float | None = None
    hint: str = ""

    def line(self) -> str:
        if self.measured is None:
            return f"{self.seed}: {self.claim} — not measured in these runs ({self.hint})"
        return f"{self.seed}: {self.measured} (seed claim: {self.claim})"


def _pick(cells: Sequence[CellRow], metric: str, workloads: Sequence[str], **cfg: str) -> tuple[str, float] | None:
    for w in workloads:
        vals = [
            c.metrics[metric]
            for c in cells
            if c.status == "ok" and c.workload == w and metric in c.metrics and all(c.config.get(k) == v for k, v in cfg.items())
        ]
        if vals:
            return w, mean(vals)
    return None


WRITE_WORKLOADS = ("fs-randwrite-4k", "randwrite-4k", "qemu-img-write-4k")


def _slower(r: float) -> str:
    """'2.50× slower' for r ≥ 1, '2.50× faster' for r < 1 (r = reference / subject)."""
    return f"{r:.2f}× slower" if r >= 1 else f"{1 / r:.2f}× faster"


BUS_ORDER = ("ide", "virtio-blk", "virtio-scsi", "nvme", "none")


def seed003_prealloc(cells: Sequence[CellRow]) -> Verdict:
    claim = "qcow2 without preallocation under write-through is about 5× slower than with metadata preallocation"
    parts: list[str] = []
    first: float | None = None
    for bus in BUS_ORDER:
        off = _pick(cells, "iops", WRITE_WORKLOADS, fmt="qcow2", prealloc="off", cache="writethrough", bus=bus)
        if off is None:
            continue
        meta = _pick(cells, "iops", [off[0]], fmt="qcow2", prealloc="metadata", cache="writethrough", bus=bus)
        if meta is None or off[1] <= 0 or meta[1] <= 0:
            continue
        r = meta[1] / off[1]
        first = r if first is None else first
        where = "qemu-img bench" if bus == "none" else f"bus {bus}"
        parts.append(f"{_slower(r)} ({off[0]}, {where}: {off[1]:,.0f} vs {meta[1]:,.0f} IOPS)")
    if not parts:
        return Verdict("seed:003", claim, None, hint="run --preset seed-003 or --quick")
    text = "on this host qcow2+write-through without preallocation is " + "; ".join(parts)
    return Verdict("seed:003", claim, text + " than with metadata preallocation", first)


def seed003_raw_vs_qcow2(cells: Sequence[CellRow]) -> Verdict:
    claim = "with cache=none, qcow2 without metadata preallocation is 5× slower than raw; with it the two tie"
    parts: list[str] = []
    first: float | None = None
    for bus in BUS_ORDER:
        raw = _pick(cells, "iops", WRITE_WORKLOADS, fmt="raw", prealloc="off", cache="none", bus=bus)
        if raw is None:
            continue
        q_off = _pick(cells, "iops", [raw[0]], fmt="qcow2", prealloc="off", cache="none", bus=bus)
        q_meta = _pick(cells, "iops", [raw[0]], fmt="qcow2", prealloc="metadata", cache="none", bus=bus)
        if q_off is None or q_off[1] <= 0:
            continue
        r = raw[1] / q_off[1]
        first = r if first is None else first
        text = f"qcow2 without preallocation is {_slower(r)} than raw"
        if q_meta is not None and q_meta[1] > 0:
            text += f", with metadata preallocation {_slower(raw[1] / q_meta[1])}"
        where = "qemu-img bench" if bus == "none" else f"bus {bus}"
        parts.append(f"{where}, {raw[0]}: {text}")
    if not parts:
        return Verdict("seed:003", claim, None, hint="run --preset seed-003 or --quick")
    return Verdict("seed:003", claim, "on this host, cache=none: " + "; ".join(parts), first)


def seed000_virtio_vs_ide(cells: Sequence[CellRow]) -> Verdict:
    claim = "virtio_blk beats emulated IDE on random writes with 8 threads by 4.5× (85.8 vs 19.0 MB/s)"
    for w in ("ffsb-randwrite-t8-direct", "ffsb-randwrite-t8-buffered", "randwrite-4k", "fs-randwrite-4k"):
        v = _pick(cells, "bw_Bps", [w], bus="virtio-blk")
        i = _pick(cells, "bw_Bps", [w], bus="ide")
        if v and i and i[1] > 0:
            r = v[1] / i[1]
            return Verdict(
                "seed:000",
                claim,
                f"on this host virtio-blk delivers {r:.2f}× the throughput of IDE on {w} "
                f"({v[1] / 1e6:.1f} vs {i[1] / 1e6:.1f} MB/s)",
                r,
            )
    return Verdict("seed:000", claim, None, hint="run --preset ffsb (or any matrix with --bus virtio-blk,ide)")


def seed000_deadline_vs_cfq(cells: Sequence[CellRow]) -> Verdict:
    claim = (
        "the deadline scheduler beats CFQ on random writes with 8 threads by 3.5× (79.8 vs 23.1 MB/s); "
        "CFQ's successor today is BFQ"
    )
    for w in ("ffsb-randwrite-t8-direct", "ffsb-randwrite-t1-direct", "randwrite-4k"):
        d = _pick(cells, "bw_Bps", [w], sched="mq-deadline")
        b = _pick(cells, "bw_Bps", [w], sched="bfq")
        if d and b and b[1] > 0:
            r = d[1] / b[1]
            return Verdict(
                "seed:000",
                claim,
                f"on this host mq-deadline in the guest delivers {r:.2f}× the throughput of BFQ on {w} "
                f"({d[1] / 1e6:.1f} vs {b[1] / 1e6:.1f} MB/s)",
                r,
            )
    return Verdict("seed:000", claim, None, hint="run --preset ffsb --sched mq-deadline,bfq")


def seed000_file_vs_block(cells: Sequence[CellRow]) -> Verdict:
    claim = "a block device gives a guest 90% or more of bare-metal performance, an image file only about 70%"
    for w in ("randread-4k", "randwrite-4k", "seqread-1m"):
        bare = _pick(cells, "iops", [w], target="host")
        f = _pick(cells, "iops", [w], target="file")
        b = _pick(cells, "iops", [w], target="block")
        if bare and (f or b) and bare[1] > 0:
            parts = []
            if f:
                parts.append(f"image file {100 * f[1] / bare[1]:.0f}%")
            if b:
                parts.append(f"block device (loop) {100 * b[1] / bare[1]:.0f}%")
            return Verdict(
                "seed:000",
                claim,
                f"on this host, {w}: {', '.join(parts)} of bare-metal IOPS ({bare[1]:,.0f})",
                (f[1] / bare[1]) if f else None,
            )
    return Verdict("seed:000", claim, None, hint="run --preset file-vs-block")


def seed001_tps_per_vm(cells: Sequence[CellRow]) -> Verdict:
    claim = "a boot-write-shutdown VM costs about 5 transactions/s on the host disk, so a 100-tps disk carries 20 such VMs"
    per_vm = [c for c in cells if c.status == "ok" and "host_tps_per_vm" in c.metrics]
    if not per_vm:
        return Verdict("seed:001", claim, None, hint="run --preset seed-001")
    tps_vm = mean([c.metrics["host_tps_per_vm"] for c in per_vm])
    cap = [c.metrics["capacity_host_tps"] for c in cells if "capacity_host_tps" in c.metrics]
    text = f"on this host one cycle VM ({per_vm[0].workload}) costs {tps_vm:.1f} transactions/s on the host disk"
    if cap and tps_vm > 0:
        capacity = mean(cap)
        text += (
            f"; the disk sustains {capacity:,.0f} tps (4 KiB synchronous writes), "
            f"so it carries about {capacity / tps_vm:,.0f} such VMs"
        )
    return Verdict("seed:001", claim, text, tps_vm)


def seed001_bus(cells: Sequence[CellRow]) -> Verdict:
    claim = "with qcow2 at default settings VirtIO is by far the fastest bus; IDE is the slowest"
    found = {}
    for bus in ("virtio-blk", "virtio-scsi", "ide"):
        v = _pick(cells, "iops", ["randwrite-4k", "seqwrite-1m"], bus=bus, fmt="qcow2")
        if v:
            found[bus] = v
    if len(found) >= 2 and "ide" in found and found["ide"][1] > 0:
        w = found["ide"][0]
        parts = [f"{b} {v[1] / found['ide'][1]:.2f}×" for b, v in found.items() if b != "ide"]
        return Verdict("seed:001", claim, f"on this host, qcow2 {w}, relative to IDE: {', '.join(parts)}", None)
    return Verdict("seed:001", claim, None, hint="run --preset seed-001")


ALL: tuple[Callable[[Sequence[CellRow]], Verdict], ...] = (
    seed003_prealloc,
    seed003_raw_vs_qcow2,
    seed000_virtio_vs_ide,
    seed000_deadline_vs_cfq,
    seed000_file_vs_block,
    seed001_tps_per_vm,
    seed001_bus,
)


def verdicts(cells: Sequence[CellRow]) -> list[Verdict]:
    return [f(cells) for f in ALL]
