"""Benchmark and verify figures as node_exporter textfile gauges, each with its unit and direction from
the metrics catalogue: ``kvmtune results show RUN --format prometheus``."""

from __future__ import annotations

from collections.abc import Sequence

from kvmtune.bench.verdicts import cell_tier
from kvmtune.lab.metrics import lookup
from kvmtune.lab.stats import mean
from kvmtune.lab.store import CellRow, RunRow
from kvmtune.prometheus import Metrics


def render_run(run: RunRow, cells: Sequence[CellRow]) -> str:
    m = Metrics()
    base = {"run": str(run.id), "kind": run.kind}
    m.add("kvmtune_benchmark_run_info", "A stored run (1): its kind, preset, status and accelerator.",
          {**base, "preset": run.preset or "", "status": run.status, "accel": run.accel or "none"}, 1)
    m.add("kvmtune_benchmark_run_started_seconds", "When the run started (Unix time).", base, run.started)
    values: dict[tuple[str, str, str, str], list[float]] = {}
    for c in cells:
        if c.status != "ok":
            continue
        for name, value in c.metrics.items():
            values.setdefault((c.key.split("|")[0], c.workload, cell_tier(c), name), []).append(value)
    for (config, workload, tier, name), vs in sorted(values.items()):
        about = lookup(name)
        if about is None or not about.measured:
            continue  # a name no tier documents, or a placeholder: not a figure to graph
        labels = {**base, "tier": tier, "configuration": config, "workload": workload, "metric": name,
                  "unit": about.unit, "better": about.better.value}
        m.add("kvmtune_benchmark_value", "Mean over repetitions of one measured figure; unit and direction as labels.",
              labels, mean(vs))
        m.add("kvmtune_benchmark_repetitions", "How many repetitions the mean is over.", labels, len(vs))
    return m.text()
