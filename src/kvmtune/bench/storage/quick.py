"""``kvmtune bench storage --quick``: the QEMU block layer alone, with ``qemu-img bench``.

No guest, no accelerator: each cell creates a fresh image, writes 4 KiB at
every 64 KiB (so every write lands in a cluster qcow2 has not allocated yet,
the case seed 003 is about), then reads the same blocks back. ``qemu-img
bench`` prints only the elapsed time; IOPS and bandwidth are derived.
"""

from __future__ import annotations

import math
import re
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvmtune.bench.storage.guest import StorageContext, describe, storage_cell, storage_environment
from kvmtune.bench.storage.matrix import StorageConfig, build_matrix
from kvmtune.errors import KvmtuneError
from kvmtune.lab.runner import Cell, CellSink
from kvmtune.lab.stats import mean, stdev, t95
from kvmtune.lab.workdir import check_free_space
from kvmtune.qemuopts import Preallocation, keyval, member

BLOCK = 4096
STEP = 64 * 1024
QUICK_IMAGES = (("raw", "off"), ("raw", "falloc"), ("qcow2", "off"), ("qcow2", "metadata"))
QUICK_MODES = (
    ("none", "threads"),
    ("none", "native"),
    ("writeback", "threads"),
    ("writethrough", "threads"),
    ("directsync", "threads"),
    ("directsync", "native"),
)


TIGHT = 0.05  # issue 18: a quick figure is kept when its 95 % interval is within ±5 %
QUICK_CAP_S = 1.5  # seconds of passes per configuration at most (--runtime sets it)
FIRST_PASS_IOS, MIN_PASS_IOS = 256, 128


@dataclass(frozen=True)
class QuickPlan:
    configs: list[StorageConfig]
    count: int  # I/Os per pass at most (passes are sized to the time cap)
    depth: int = 16
    cap_s: float = QUICK_CAP_S
    max_passes: int = 50


def default_quick_configs() -> list[StorageConfig]:
    """The 24 valid cells: 4 image kinds × 6 cache/aio modes."""
    return [
        StorageConfig(bus="none", cache=c, aio=a, fmt=f, prealloc=p, tier="quick")
        for f, p in QUICK_IMAGES
        for c, a in QUICK_MODES
    ]


def quick_configs(
    caches: Sequence[str] | None,
    aios: Sequence[str] | None,
    formats: Sequence[str] | None,
    preallocs: Sequence[str] | None,
) -> list[StorageConfig]:
    if not any((caches, aios, formats, preallocs)):
        return default_quick_configs()
    cfgs = build_matrix({
        "cache": caches or ["none", "writeback", "writethrough"],
        "aio": aios or ["threads", "native"],
        "fmt": formats or ["raw", "qcow2"],
        "prealloc": preallocs or (["off", "metadata"] if not formats or "qcow2" in formats else ["off"]),
    })
    return [StorageConfig(bus="none", cache=c.cache, aio=c.aio, fmt=c.fmt, prealloc=c.prealloc, tier="quick") for c in cfgs]


_DONE = re.compile(r"Run completed in ([0-9.]+) seconds")


def parse_bench_output(text: str) -> float:
    m = _DONE.search(text)
    if not m:
        raise ValueError("qemu-img bench printed no 'Run completed in N seconds' line")
    return float(m.group(1))


def _bench(ctx: StorageContext, cfg: StorageConfig, image: str, write: bool, count: int, depth: int) -> Cell:
    name = f"qemu-img-{'write' if write else 'read'}-4k"
    argv = ["qemu-img", "bench", "-f", cfg.fmt, "-t", cfg.cache, "-i", cfg.aio, "-c", str(count), "-d", str(depth)]
    argv += ["-s", str(BLOCK), "-S", str(STEP)] + (["-w"] if write else []) + [image]
    res = ctx.runner.run(argv, timeout=120)
    cell = storage_cell(cfg, name, "ok", duration_s=res.duration_s)
    if not res.ok:
        cell.status, cell.error = "error", f"qemu-img bench failed: {res.describe_failure()}"
        return cell
    try:
        secs = parse_bench_output(res.stdout + res.stderr)
    except ValueError as exc:
        cell.status, cell.error = "error", str(exc)
        return cell
    iops = count / secs if secs > 0 else 0.0
    d = "write" if write else "read"
    cell.metrics = {
        "iops": iops,
        f"iops_{d}": iops,
        "bw_Bps": iops * BLOCK,
        f"bw_{d}_Bps": iops * BLOCK,
        "elapsed_s": secs,
        "lat_mean_us": 1e6 * secs * depth / count if count else 0.0,
    }
    cell.raw = res.stdout
    return cell


def tight(values: Sequence[float], within: float = TIGHT) -> bool:
    """Whether the 95 % interval of the mean lies within ±``within`` of it (needs three passes at least)."""
    if len(values) < 3:
        return False
    m = mean(values)
    return m > 0 and t95(len(values) - 1) * stdev(values) / math.sqrt(len(values)) <= within * m


def _one_pass(ctx: StorageContext, plan: QuickPlan, cfg: StorageConfig, tag: str, count: int) -> list[Cell]:
    """A fresh image (the writes must find unallocated clusters), then the write and read benches."""
    span_mib = max(1, count * STEP >> 20)
    size = ctx.disk_mib if ctx.disk_mib >= span_mib else span_mib
    if cfg.prealloc in ("full", "falloc"):
        check_free_space(ctx.scratch.root, (size + 64) << 20, f"a {size} MiB preallocated image")
    mark = ctx.scratch.mark()
    path = ctx.scratch.path(f"quick-{tag}.{cfg.fmt}")
    ctx.scratch.add_file(path)
    try:
        argv = ["qemu-img", "create", "-q", "-f", cfg.fmt]
        if cfg.prealloc != "off":
            argv += ["-o", keyval(("preallocation", member("preallocation", Preallocation, cfg.prealloc)))]
        r = ctx.runner.run([*argv, str(path), f"{size}M"], timeout=300)
        if not r.ok:
            raise KvmtuneError(f"{path.name}: qemu-img create failed: {r.describe_failure()}")
        return [_bench(ctx, cfg, str(path), True, count, plan.depth),
                _bench(ctx, cfg, str(path), False, count, plan.depth)]
    finally:
        ctx.scratch.cleanup(mark)


def run_quick(ctx: StorageContext, plan: QuickPlan) -> int:
    """Per configuration, passes until both figures have a tight interval (±5 %) or the time cap is spent.

    Every pass is stored as a cell of its own (``rep`` counts passes), so compare and the verdicts see
    the spread; a configuration that got only one pass has no interval and gets no verdict.
    """
    failed = 0
    for rep in range(ctx.repeat):
        for i, cfg in enumerate(plan.configs):
            names = [f"qemu-img-{d}-4k" for d in ("write", "read")]
            problem = cfg.problem()
            if problem:
                for name in names:
                    cell = storage_cell(cfg, name, "error", error=problem, rep=rep)
                    failed += 1
                    ctx.record(cell)
                continue
            iops: dict[str, list[float]] = {n: [] for n in names}
            start, k, count = time.monotonic(), 0, min(plan.count, FIRST_PASS_IOS)
            while True:
                began = time.monotonic()
                try:
                    cells = _one_pass(ctx, plan, cfg, f"{rep}-{i}-{k}", count)
                except KvmtuneError as exc:
                    cells = [storage_cell(cfg, n, "error", error=str(exc)) for n in names]
                # size the next passes so that about five fit in the cap (slow modes such as write-through
                # would otherwise spend the whole cap on one pass and have no interval)
                took = max(1e-3, time.monotonic() - began)
                count = max(MIN_PASS_IOS, min(plan.count, int(count * plan.cap_s / 5 / took)))
                done = (
                    any(not c.ok for c in cells)
                    or all(tight(v) for v in iops.values())
                    or time.monotonic() - start >= plan.cap_s
                    or k + 1 >= plan.max_passes
                )
                for c in cells:
                    if c.ok:
                        iops[c.workload].append(c.metrics["iops"])
                done = done or all(tight(v) for v in iops.values())
                for c in cells:
                    failed += not c.ok
                    c.rep = rep * plan.max_passes + k
                    if done and c.ok:
                        c.metrics["passes"] = float(len(iops[c.workload]))
                    ctx.record(c, show=done)
                if done:
                    break
                k += 1
    return failed


@dataclass
class QuickBenchmark:
    """``kvmtune bench storage --quick``: qemu-img bench per configuration, no guest."""

    ctx: StorageContext
    quick: QuickPlan
    kind: str = "quick"

    def planned_cells(self) -> int:
        return len(self.quick.configs) * 2 * self.ctx.repeat

    def plan(self) -> str:
        return f"{self.planned_cells()} cells, accelerator {self.ctx.accel.accel}"

    def environment(self) -> dict[str, Any]:
        return storage_environment(self.ctx)

    def describe(self, cell: Cell) -> str:
        passes = int(cell.metrics.get("passes", 1))
        return describe(cell) + f" (last of {passes} pass{'es' if passes > 1 else ''})"

    def execute(self, sink: CellSink) -> None:
        self.ctx.sink = sink
        run_quick(self.ctx, self.quick)

    def space_needed(self) -> tuple[Path, int, str] | None:
        """A sparse image and qemu-img's writes: the margin every quick cell needs."""
        return self.ctx.scratch.root, 64 << 20, "a quick-bench image"

    def cleanup(self) -> list[str]:
        problems = self.ctx.scratch.cleanup()
        shutil.rmtree(self.ctx.scratch.root, ignore_errors=True)
        return problems
