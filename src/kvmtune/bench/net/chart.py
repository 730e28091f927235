"""Seed 002's comparison: run B against run A, test by test.

Seed 002 (seed:002, figures 10-18) draws one group of bars per test, 20 on
the x axis, four bars each — throughput, transaction time, client CPU
efficiency, server CPU efficiency — as the % difference of B against A with
positive meaning B is better. The two runs normally differ in configuration
(bridge vs OVS, MTU 1500 vs 9000), so tests are matched by name, not by the
store's configuration key. A run with several pairs is summed over pairs for
throughput and averaged for the per-transaction and per-MB figures.

For a higher-is-better metric the difference is ``B/A - 1``; for transaction
time and CPU per MB it is ``A/B - 1``, i.e. computed on the rate (transactions
per second of latency budget, MB per CPU second), which is how the seed
speaks of "CPU efficiency".
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from kvmtune.bench.net.catalog import SEED_USERS, SEED_WORKLOADS
from kvmtune.lab.metrics import lookup
from kvmtune.lab.metrics import metric as catalogue_metric
from kvmtune.lab.store import CellRow, RunRow, Store

# (label, metric): seed 002's four bars; direction comes from the metrics catalogue
BARS = (
    ("throughput", "throughput_Bps"),
    ("transaction time", "lat_avg_us"),
    ("client CPU efficiency", "client_cpu_s_per_mb"),
    ("server CPU efficiency", "server_cpu_s_per_mb"),
)


def _summed(name: str) -> bool:
    entry = lookup(name)
    return entry is not None and entry.summed_over_pairs


def aggregate(cells: Sequence[CellRow]) -> dict[str, dict[str, float]]:
    """Per test: within a run, pairs summed (throughput, tx/s) or averaged (the rest); then the median over runs."""
    per_run: dict[tuple[int, str], dict[str, list[float]]] = {}
    for c in cells:
        if c.status != "ok":
            continue
        for name, value in c.metrics.items():
            per_run.setdefault((c.run_id, c.workload), {}).setdefault(name, []).append(value)
    acc: dict[str, dict[str, list[float]]] = {}
    for (_run, test), metrics in per_run.items():
        for n, v in metrics.items():
            acc.setdefault(test, {}).setdefault(n, []).append(sum(v) if _summed(n) else sum(v) / len(v))
    return {test: {n: statistics.median(v) for n, v in metrics.items()} for test, metrics in acc.items()}


def _order(test: str) -> tuple[int, int, str]:
    base, _, users = test.partition("--")
    w = SEED_WORKLOADS.index(base) if base in SEED_WORKLOADS else len(SEED_WORKLOADS)
    u = int(users) if users.isdigit() else 0
    return (w, SEED_USERS.index(u) if u in SEED_USERS else u, test)


@dataclass(frozen=True)
class Row:
    test: str
    a: dict[str, float]
    b: dict[str, float]
    pct: dict[str, float | None]  # per BARS label: + means B better


def pct_better(a: float | None, b: float | None, name: str) -> float | None:
    """B against A in %, positive = B better, in the catalogue's direction of ``name``."""
    return catalogue_metric(name).pct_better(a, b)


def seed002_rows(cells_a: Sequence[CellRow], cells_b: Sequence[CellRow]) -> list[Row]:
    ga, gb = aggregate(cells_a), aggregate(cells_b)
    rows = []
    for test in sorted(set(ga) & set(gb), key=_order):
        pct = {label: pct_better(ga[test].get(m), gb[test].get(m), m) for label, m in BARS}
        rows.append(Row(test, ga[test], gb[test], pct))
    return rows


def _describe(run: RunRow) -> str:
    a = run.args
    bits = [str(a.get("topology", run.kind)), f"MTU {a.get('mtu', '?')}", f"{a.get('hosts', '?')} host(s)",
            f"{a.get('pairs', '?')} pair(s)"]
    if a.get("tune"):
        bits.append(str(a["tune"]))
    return f"run {run.id}: " + ", ".join(bits) + f" [{run.accel}]"


def text_table(rows: Sequence[Row]) -> str:
    head = f"{'test':24}" + "".join(f"{label:>24}" for label, _ in BARS)
    lines = [head]
    for r in rows:
        cells = "".join(f"{'n/a' if r.pct[label] is None else f'{r.pct[label]:+.1f}%':>24}" for label, _ in BARS)
        lines.append(f"{r.test:24}{cells}")
    return "\n".join(lines)


def compare_net(store: Store, run_a: RunRow, run_b: RunRow) -> tuple[list[Row], str]:
    """Rows and the text table for two network runs."""
    rows = seed002_rows(store.cells(run_a.id), store.cells(run_b.id))
    return rows, text_table(rows)
