"""``kvmtune canary history``: every canary run and baseline reset in the results database, oldest first, with its
recorded verdict, each metric's median over its rounds, and what changed in the environment since the run before."""

from __future__ import annotations

import time
from typing import Any

from kvmtune.canary.environment import changes
from kvmtune.canary.judge import _median, figures, label_text, not_measured, recorded_verdict
from kvmtune.canary.metrics import BY_NAME, KIND, RESET_KIND, SUITE_VERSION
from kvmtune.lab.store import Store
from kvmtune.prometheus import Metrics
from kvmtune.textsafe import safe


def history(store: Store) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    previous: dict[str, Any] | None = None
    for r in store.runs():
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.started))
        if r.kind == RESET_KIND:
            out.append({"run": r.id, "started": when, "reset": safe(r.note or "")})
            continue
        if r.kind != KIND or r.args.get("suite") != SUITE_VERSION:
            continue
        got = figures(store, r) if r.status == "complete" else {}
        out.append({"run": r.id, "started": when, "status": r.status, "verdict": recorded_verdict(store, r.id),
                    "metrics": {name: _median(xs) for name, (_labels, xs) in sorted(got.items())},
                    "labels": {name: labels for name, (labels, _xs) in sorted(got.items()) if labels},
                    "not_measured": {name: safe(why) for name, why in sorted(not_measured(r.env).items())
                                     if name not in got},
                    "changed": changes(previous, r.env) if previous is not None else []})
        previous = r.env
    return out


def render_history(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no canary runs yet ('kvmtune canary run' makes one)\n"
    lines = []
    for row in rows:
        if "reset" in row:
            lines.append(f"{row['run']:>5} {row['started']}  baseline reset: {row['reset']}")
            continue
        shown = ", ".join(f"{name} {value:.4g}" + (f" ({label_text(row['labels'][name])})" if name in row["labels"] else "")
                          for name, value in row["metrics"].items())
        lines.append(f"{row['run']:>5} {row['started']}  {row['verdict'] or row['status']}: {shown}")
        for name, why in row.get("not_measured", {}).items():
            lines.append(f"{'':24}not measured: {name} ({why})")
        for c in row["changed"]:
            lines.append(f"{'':24}changed: {safe(c['what'])} {safe(c['before'])} → {safe(c['after'])}")
    return "".join(f"{line}\n" for line in lines)


def prometheus_lines(doc: dict[str, Any]) -> str:
    """One judged run as node_exporter textfile gauges (``kvmtune_canary_ratio``, ``kvmtune_canary_regression``)."""
    m = Metrics()

    def labels(metric: dict[str, Any]) -> dict[str, str]:
        # what a labelled figure ran under (accel, kvm_module: Metric.compared_within's names only)
        within = BY_NAME[metric["name"]].compared_within if metric["name"] in BY_NAME else ()
        return {"metric": metric["name"]} | {k: v for k, v in (metric.get("labels") or {}).items() if k in within}

    for metric in doc["metrics"]:
        if metric["ratio"] is not None:
            m.add("kvmtune_canary_ratio", "this run's figure against the baseline (geometric means)", labels(metric),
                  metric["ratio"])
    for metric in doc["metrics"]:
        m.add("kvmtune_canary_regression", "1: a settled regression against the baseline (docs/canary.md)",
              labels(metric), 1.0 if metric["verdict"] == "regression" else 0.0)
    m.add("kvmtune_canary_judged", "1: the run was judged (not a baseline run, not a busy host)", {},
          1.0 if doc["verdict"] in ("regression", "no-regression") else 0.0)
    return m.text()
