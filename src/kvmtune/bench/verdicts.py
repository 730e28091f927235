"""One verdict line per seed claim, computed from stored cells of one accelerator.

Each function looks for the cells its claim needs; when they are not there
it says which preset measures them. A configuration's figure is its median over repetitions (the tables' and
charts' figure); the block and quick tiers' ratios carry 95 % intervals (:func:`ratio`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from kvmtune.lab.stats import mean, median, stdev, summarize, t95
from kvmtune.lab.store import CellRow
from kvmtune.lab.vocabulary import DOES_NOT_HOLD, HOLDS, INCONCLUSIVE, NOT_COMPARABLE, NOT_MEASURED, within


@dataclass(frozen=True)
class Verdict:
    seed: str
    claim: str
    measured: str | None  # None: not measured in these runs
    ratio: float | None = None
    hint: str = ""

    def word(self) -> str:
        """The vocabulary word this verdict settles on: the worst its text names; without one (a figure with no
        interval) inconclusive."""
        if self.measured is None:
            return NOT_MEASURED
        found = [w for w in WORST_FIRST if re.search(rf"(?<![\w-]){w}\b", self.measured)]
        return found[0] if found else INCONCLUSIVE

    def line(self, tier: str | None = None) -> str:
        """One line; ``tier`` names where it was measured when the text does not already say so."""
        where = f" [{tier} tier]" if tier and (self.measured is None or "tier" not in self.measured) else ""
        if self.measured is None:
            return f"{self.seed}{where}: {self.claim} — {NOT_MEASURED} in these runs ({self.hint})"
        unsettled = "" if any(w in self.measured for w in WORST_FIRST) else f": {INCONCLUSIVE} (no interval)"
        return f"{self.seed}{where}: {self.measured}{unsettled} (seed claim: {self.claim})"


WORST_FIRST = (NOT_COMPARABLE, DOES_NOT_HOLD, INCONCLUSIVE, HOLDS)


def _pick(cells: Sequence[CellRow], metric: str, workloads: Sequence[str], **cfg: str) -> tuple[str, float] | None:
    for w in workloads:
        vals = [
            c.metrics[metric]
            for c in cells
            if c.status == "ok" and c.workload == w and metric in c.metrics and all(c.config.get(k) == v for k, v in cfg.items())
        ]
        if vals:
            return w, median(vals)
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
    tps_vm = median([c.metrics["host_tps_per_vm"] for c in per_vm])
    cap = [c.metrics["capacity_host_tps"] for c in cells if "capacity_host_tps" in c.metrics]
    text = f"on this host one cycle VM ({per_vm[0].workload}) costs {tps_vm:.1f} transactions/s on the host disk"
    if cap and tps_vm > 0:
        capacity = median(cap)
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


def cell_tier(cell: CellRow) -> str:
    """guest, quick or block (cells stored before tiers were recorded: quick ran on bus 'none')."""
    tier = cell.config.get("tier")
    if isinstance(tier, str):
        return tier
    return "quick" if cell.config.get("bus") == "none" else "guest"


def verdicts(cells: Sequence[CellRow]) -> list[Verdict]:
    """The seed verdicts of one tier's cells (the block tier's carry intervals)."""
    tiers = {cell_tier(c) for c in cells}
    if len(tiers) == 1 and tiers <= {"block", "quick"}:  # these tiers repeat: verdicts only with an interval
        return block_verdicts(cells, tiers.pop())
    found = [f(cells) for f in ALL]
    if cells and all(c.accel == "tcg" for c in cells):  # the guest's emulation dominates: not the seeds' mechanism
        why = f"{NOT_COMPARABLE} (measured in a TCG guest, software emulation; the seeds measured KVM guests): "
        found = [v if v.measured is None else Verdict(v.seed, v.claim, why + v.measured, v.ratio, v.hint) for v in found]
    return found


# --------------------------------------------------------------------------- the block tier: verdicts need evidence

CLAIM_WT = "qcow2 without preallocation under write-through is about 5× slower than with metadata preallocation"
CLAIM_RAW = "with cache=none, qcow2 without metadata preallocation is 5× slower than raw; with it the two tie"
CLAIM_FILE = "a block device gives a guest 90% or more of bare-metal performance, an image file only about 70%"
TIE = (0.8, 1.25)  # a ratio whose whole interval lies here is a tie


Round = tuple[int, int, str]  # (run, round, host file system): the cells measured side by side


@dataclass(frozen=True)
class Ratio:
    """How many times ``num`` exceeds ``den``: the median of the per-round ratios, with a 95 % interval (Student's
    t on their logarithms). Rounds interleave every configuration, so each round's ratio is taken side by side and
    drift between rounds cancels. Sides measured in different rounds (nothing to pair) fall back to the ratio of
    the medians, with Welch's interval on the logarithms."""

    value: float
    low: float | None
    high: float | None
    n: int  # rounds paired (or on the smaller side)
    paired: bool = True

    def text(self) -> str:
        if self.low is None or self.high is None:
            return f"{self.value:.2f}× (no interval: {self.n} round)"
        how = f"median of {self.n} per-round ratios" if self.paired else f"ratio of medians, {self.n} rounds"
        return f"{self.value:.2f}× (95% interval {self.low:.2f}–{self.high:.2f}×, {how})"

    def repeats_for(self, target: float = 1.0) -> int | None:
        """Rounds that would bring the interval's half-width below the distance to ``target`` (log scale)."""
        if self.low is None or self.high is None or self.value <= 0 or self.low <= 0:
            return None
        half = (math.log(self.high) - math.log(self.low)) / 2
        gap = abs(math.log(self.value) - math.log(target))
        if gap == 0:
            return None
        return max(self.n + 1, math.ceil(self.n * (half / gap) ** 2) + 1)


def ratio(num: Mapping[Round, float] | Sequence[float], den: Mapping[Round, float] | Sequence[float]) -> Ratio | None:
    """Values keyed by round (the block tier): paired per round where at least two rounds have both sides, else
    the ratio of the medians. Plain sequences (runs' scores, the network claims): the ratio of geometric means.
    Either unpaired form carries Welch's interval on the logarithms."""
    if isinstance(num, Mapping) and isinstance(den, Mapping):
        both = [k for k in num if k in den and num[k] > 0 and den[k] > 0]
        if len(both) >= 2:
            s = summarize([num[k] / den[k] for k in both])  # positive: the interval is on the logarithms
            return Ratio(s.median, s.low, s.high, s.n)
        pos_a, pos_b = [x for x in num.values() if x > 0], [x for x in den.values() if x > 0]
        value = median(pos_a) / median(pos_b) if pos_a and pos_b else None
    else:
        pos_a = [x for x in (num.values() if isinstance(num, Mapping) else num) if x > 0]
        pos_b = [x for x in (den.values() if isinstance(den, Mapping) else den) if x > 0]
        value = None
    if not pos_a or not pos_b:
        return None
    a, b = [math.log(x) for x in pos_a], [math.log(x) for x in pos_b]
    if value is None:
        value = math.exp(mean(a) - mean(b))
    n = min(len(a), len(b))
    if len(a) < 2 or len(b) < 2:
        return Ratio(value, None, None, n, paired=False)
    va, vb = stdev(a) ** 2 / len(a), stdev(b) ** 2 / len(b)
    se = math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1)) if se > 0 else len(a) + len(b) - 2
    half = t95(df) * se
    return Ratio(value, math.exp(mean(a) - mean(b) - half), math.exp(mean(a) - mean(b) + half), n, paired=False)


def _values(cells: Sequence[CellRow], workload: str, metric: str = "iops", **cfg: str) -> dict[Round, float]:
    return {(c.run_id, c.rep, str(c.config.get("host_fs") or "")): c.metrics[metric] for c in cells
            if c.status == "ok" and c.workload == workload and metric in c.metrics
            and all(c.config.get(k) == v for k, v in cfg.items())}


def _pct_interval(r: Ratio) -> str:
    if r.low is None or r.high is None:
        return " (no interval: 1 round)"
    return f" (95% interval {100 * r.low:.0f}–{100 * r.high:.0f}%, median of {r.n} rounds)"


ABOUT = (0.5, 2.0)  # "about N×" holds when the whole interval lies within half to twice N


def _interval(r: Ratio) -> tuple[float, float] | None:
    return None if r.low is None or r.high is None else (r.low, r.high)


def _judge(r: Ratio, band: tuple[float, float]) -> str:
    """holds when the whole interval lies in the claim's band, does not hold when wholly outside, else inconclusive
    (with the interval, or without one from a single round)."""
    if r.low is None or r.high is None:
        return f"{INCONCLUSIVE}: no interval from one round (run --repeat 3 or more)"
    word = within(_interval(r), *band)
    if word != INCONCLUSIVE:
        return word
    more = r.repeats_for(band[0] if r.value < band[0] else band[1] if r.value > band[1] else 1.0)
    return (f"{INCONCLUSIVE}: the interval crosses the claim's band {band[0]:.2g}–{band[1]:.2g}×"
            + (f"; about {more} rounds would settle it" if more else ""))


def _times(r: Ratio, more: str, less: str) -> str:
    """'2.50× (…) slower' or, below 1, '1.39× (…) faster': the word from the sign, the figure above 1."""
    if r.value >= 1:
        return f"{r.text()} {more}"
    flipped = Ratio(1 / r.value, None if r.high is None else 1 / r.high, None if r.low is None else 1 / r.low, r.n,
                    r.paired)
    return f"{flipped.text()} {less}"


def _claimed(times: float) -> tuple[float, float]:
    return times * ABOUT[0], times * ABOUT[1]


def block_verdicts(cells: Sequence[CellRow], which: str = "block") -> list[Verdict]:
    """Seed 003's and seed 000's claims from block-tier (or quick-tier) cells, each with its interval and tier."""
    tier = f"{which} tier"
    hint = "run --tier block --preset seed-003" if which == "block" else "run --quick (or --tier block --preset seed-003)"
    out: list[Verdict] = []
    w = "randwrite-4k" if which == "block" else "qemu-img-write-4k"
    none_aio = "native" if which == "block" else "threads"
    off = _values(cells, w, fmt="qcow2", prealloc="off", cache="writethrough", aio="threads", target="file")
    meta = _values(cells, w, fmt="qcow2", prealloc="metadata", cache="writethrough", aio="threads", target="file")
    r = ratio(meta, off) if off and meta else None
    if r is None:
        out.append(Verdict("seed:003", CLAIM_WT, None, hint=hint))
    else:
        verdict = _judge(r, _claimed(5.0))
        out.append(Verdict("seed:003", CLAIM_WT, f"[{tier}, {w}] qcow2+write-through without preallocation is "
                           f"{_times(r, 'slower', 'faster')} than with metadata preallocation: {verdict}", r.value))
    raw = _values(cells, w, fmt="raw", prealloc="off", cache="none", aio=none_aio, target="file")
    q_off = _values(cells, w, fmt="qcow2", prealloc="off", cache="none", aio=none_aio, target="file")
    q_meta = _values(cells, w, fmt="qcow2", prealloc="metadata", cache="none", aio=none_aio, target="file")
    r1 = ratio(raw, q_off) if raw and q_off else None
    if r1 is None:
        out.append(Verdict("seed:003", CLAIM_RAW, None, hint=hint))
    else:
        text = f"[{tier}, {w}, cache=none] qcow2 without preallocation is {_times(r1, 'slower', 'faster')} than raw: "
        text += _judge(r1, _claimed(5.0))
        r2 = ratio(raw, q_meta) if q_meta else None
        if r2 is not None:
            text += f"; with metadata preallocation raw is {_times(r2, 'faster', 'slower')}: tie " + _judge(r2, TIE)
        out.append(Verdict("seed:003", CLAIM_RAW, text, r1.value))
    parts = []
    first: float | None = None
    for wl in ("randread-4k", "randwrite-4k"):
        floor = _values(cells, wl, target="host")
        f = _values(cells, wl, fmt="raw", prealloc="off", cache="none", target="file")
        b = _values(cells, wl, fmt="raw", prealloc="off", cache="none", target="block")
        if not floor or not (f or b):
            continue
        pf = ratio(f, floor) if f else None
        pb = ratio(b, floor) if b else None
        bits = []
        if pf:
            bits.append(f"image file {100 * pf.value:.0f}% of bare metal{_pct_interval(pf)}")
            first = pf.value if first is None else first
        if pb:
            bits.append(f"block device (loop) {100 * pb.value:.0f}%{_pct_interval(pb)}")
        if pf and pb:
            rb = ratio(b, f)
            if rb is not None:
                bits.append(f"block/file {rb.text()}: 'block closer to bare metal' "
                            + _judge(rb, (1.0, math.inf)))
        parts.append(f"{wl}: " + ", ".join(bits))
    if parts:
        out.append(Verdict("seed:000", CLAIM_FILE, f"[{tier}] " + "; ".join(parts), first))
    elif which == "block":
        out.append(Verdict("seed:000", CLAIM_FILE, None, hint="run --tier block --preset file-vs-block"))
    return out


# --------------------------------------------------------------------------- verify's guest tier as seed evidence

# the rule whose verified fix is seed 000's "virtio-blk vs IDE": verify stores each cell's rule slug (the registry's
# name of it), so the claim is found by slug, never by a table of rule ids
VIRTIO_VS_IDE_SLUG = "disk-bus-emulated"
CLAIM_VIRTIO_IDE = "virtio_blk beats emulated IDE on random writes with 8 threads by 4.5× (85.8 vs 19.0 MB/s)"
TCG_NOT_SEED = "measured in a TCG guest, the seed measured KVM guests"


def verified_cells(cells: Sequence[CellRow], slug: str) -> list[CellRow]:
    """A verify run's measured guest-tier cells for the rule ``slug`` (cells stored before verify kept the slug have
    none to give)."""
    return [c for c in cells if c.status == "ok" and c.config.get("slug") == slug and c.config.get("tier") == "guest"
            and "ratio" in c.metrics]


def verified_where(cell: CellRow) -> str:
    """'guest tier, accelerator tcg': where a verified fix was measured, for its seed line."""
    return f"guest tier, accelerator {cell.config.get('accel') or cell.accel or '?'}"


def verified_ratio(cell: CellRow, higher_first: bool = True) -> Ratio:
    """A verified fix's ratio (after/before) with its 95 % interval, turned so that more is better when the stored
    metric is one where less is better (``higher_first``)."""
    m = cell.metrics
    low, high = m.get("ratio_ci_low"), m.get("ratio_ci_high")
    r = Ratio(m["ratio"], low, high, int(m.get("n", 0)), paired=False)
    if higher_first and cell.config.get("higher_is_better") is False and r.value > 0:
        r = Ratio(1 / r.value, None if high is None or high <= 0 else 1 / high, None if low is None or low <= 0 else 1 / low,
                  r.n, paired=False)
    return r


def verified_subject(cell: CellRow) -> str:
    cfg = cell.config
    return (f"[verify run {cell.run_id}, {verified_where(cell)}] {cfg.get('rule')} {cfg.get('target')}: "
            f"{cfg.get('change')} ({cell.workload})")


def seed000_verified(cell: CellRow) -> Verdict:
    """Seed 000's "virtio-blk vs IDE" from one bus fix measured on verify's guest tier. Under KVM the ratio's
    interval is judged against "about 4.5×" (half to twice it, as the block tier judges seed 003's "about 5×"); under
    TCG the guest's emulation dominates: not comparable, whatever the interval says."""
    r = verified_ratio(cell)
    spread = (f"95% interval {r.low:.2f}–{r.high:.2f}×, {r.n} rounds a side" if r.low is not None and r.high is not None
              else "no interval")
    text = (f"{verified_subject(cell)}: as fixed it delivers {r.value:.2f}× ({spread}) the {cell.config.get('metric')} "
            "of the disk as it was")
    if (cell.config.get("accel") or cell.accel) == "tcg":
        text = f"{NOT_COMPARABLE} ({TCG_NOT_SEED}): {text}"
    else:
        text += f"; 'about 4.5×': {_judge(r, _claimed(4.5))}"
    return Verdict("seed:000", CLAIM_VIRTIO_IDE, text, r.value)
