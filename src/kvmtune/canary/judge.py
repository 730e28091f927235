"""Judging a canary run against the host's baseline, by the one rule of docs/verdicts.md
(:func:`kvmtune.lab.stats.log_welch` for the ratio and its 95 % interval, :func:`kvmtune.lab.vocabulary.effect` for the
word, 5 % band).

The baseline: the first ``baseline_runs`` complete canary runs after the last ``canary baseline --reset``. A run on a
busy host is not judged (``BUSY_LOAD_PER_CPU``, ``BUSY_SPREAD``; docs/canary.md names them)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from kvmtune.canary.environment import changes
from kvmtune.canary.metrics import BY_NAME, JUDGEMENT_KEY, KIND, RESET_KIND, SUITE_VERSION
from kvmtune.lab import vocabulary
from kvmtune.lab.stats import log_welch
from kvmtune.lab.store import RunRow, Store
from kvmtune.textsafe import safe

THRESHOLD_PCT = 5.0
BUSY_LOAD_PER_CPU = 1.0  # 1-minute load average of other work (read before the run starts), per CPU it may use
BUSY_SPREAD = 0.35  # standard deviation of a metric's log figures over its rounds (about ±35 %)
WORDS = {vocabulary.HURTS: "regression", vocabulary.HELPS: "improvement", vocabulary.NO_EFFECT: "no-change",
         vocabulary.INCONCLUSIVE: "inconclusive"}


@dataclass
class Judged:
    run_id: int
    started: float
    metrics: list[dict[str, Any]]
    changed: list[dict[str, str]]
    environment: dict[str, Any]
    verdict: str  # baseline | regression | no-regression | not-judged
    busy: str | None = None
    baseline_runs: list[int] = field(default_factory=list)
    since: float | None = None  # the run `changed` compares with

    def to_json(self) -> dict[str, Any]:
        return {"suite": SUITE_VERSION, "run": self.run_id, "verdict": self.verdict, "busy": self.busy,
                "baseline_runs": self.baseline_runs, "metrics": self.metrics,
                "since": time.strftime("%Y-%m-%d %H:%M", time.localtime(self.since)) if self.since else None,
                "changed": self.changed,
                "environment": self.environment}


def labels_of(config: dict[str, Any], env: dict[str, Any], name: str) -> dict[str, str] | None:
    """What the figure of ``name`` in a cell is labelled with (its accelerator, its KVM module:
    ``Metric.compared_within``); a cell of an older kvmtune has none: the run's environment says. None: labels that are
    not kvmtune's (the figure is not believed)."""
    within = BY_NAME[name].compared_within
    if not within:
        return {}
    got = config.get("labels")
    if got is None:
        return {k: env[k] for k in within if isinstance(env.get(k), str)}
    if not isinstance(got, dict) or not all(k in within and isinstance(v, str) and 0 < len(v) <= 64
                                            for k, v in got.items()):
        return None
    return dict(got)


def figures(store: Store, run: RunRow) -> dict[str, tuple[dict[str, str], list[float]]]:
    """Each metric's labels and its rounds' figures in ``run``. A run's rounds of one metric share one label: a round
    with another one (not kvmtune's doing) is dropped."""
    out: dict[str, tuple[dict[str, str], list[float]]] = {}
    for c in store.cells(run.id):
        value = c.metrics.get("value")
        if c.status != "ok" or c.workload not in BY_NAME or not isinstance(value, float) or not value > 0 \
                or not math.isfinite(value):
            continue
        labels = labels_of(c.config, run.env, c.workload)
        if labels is None or (c.workload in out and out[c.workload][0] != labels):
            continue
        out.setdefault(c.workload, (labels, []))[1].append(value)
    return out


def _values(store: Store, run: RunRow) -> dict[str, list[float]]:
    return {name: xs for name, (_labels, xs) in figures(store, run).items()}


def not_measured(env: dict[str, Any]) -> dict[str, str]:
    """The run's metrics it could not measure here, with why (``not_measured`` in its environment: the suite's names
    and one line each; anything else there is not kvmtune's and is left out)."""
    raw = env.get("not_measured")
    if not isinstance(raw, dict):
        return {}
    return {k: v for k, v in raw.items() if k in BY_NAME and isinstance(v, str) and 0 < len(v) <= 300}


def _unmeasured(env: dict[str, Any], got: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"name": name, "value": None, "unit": BY_NAME[name].unit, "rounds": [], "labels": {},
             "note": f"not measured: {safe(why)}", "baseline": None, "ratio": None, "interval": None,
             "verdict": "not-judged"}
            for name, why in sorted(not_measured(env).items()) if name not in got]


def label_text(labels: dict[str, str]) -> str:
    """``accelerator tcg (emulation)``, ``accelerator kvm, kvm_module kvm_intel``: what a figure was measured under."""
    words = []
    for k, v in sorted(labels.items()):
        if k == "accel":
            words.append(f"accelerator {safe(v)}" + (" (emulation)" if v == "tcg" else ""))
        else:
            words.append(f"{safe(k)} {safe(v)}")
    return ", ".join(words)


def recorded_verdict(store: Store, run_id: int) -> str | None:
    for c in store.cells(run_id):
        if c.key == JUDGEMENT_KEY and isinstance(c.config.get("verdict"), str):
            return str(c.config["verdict"])
    return None


def canary_runs(store: Store) -> list[RunRow]:
    """The canary runs since the last baseline reset, complete ones only, oldest first."""
    runs: list[RunRow] = []
    for r in store.runs():
        if r.kind == RESET_KIND:
            runs = []
        elif r.kind == KIND and r.status == "complete" and r.args.get("suite") == SUITE_VERSION:
            runs.append(r)
    return runs


@dataclass(frozen=True)
class Busy:
    load_per_cpu: float = BUSY_LOAD_PER_CPU
    spread: float = BUSY_SPREAD


def unchanged_since(store: Store, env: dict[str, Any]) -> int | None:
    """The last complete canary run, when nothing in ``env`` changed since it (``--if-changed``); else None."""
    runs = [r for r in store.runs() if r.kind == KIND and r.status == "complete" and r.args.get("suite") == SUITE_VERSION]
    if not runs or changes(runs[-1].env, env):
        return None
    return runs[-1].id


def busy_reason(env: dict[str, Any], values: dict[str, list[float]], throttled: int, busy: Busy) -> str | None:
    """Why the host was too busy to judge the run, or None. The spread says nothing when the canary's own cgroup
    throttled it (``throttled`` > 0 during the run): that is its limit, part of the environment, judged."""
    load = env.get("loadavg")
    ncpu = env.get("ncpu") or 1
    if isinstance(load, list) and load and isinstance(load[0], float) and load[0] / ncpu > busy.load_per_cpu:
        return (f"load average {load[0]:.2f} on {ncpu} CPU(s) before the run (over {busy.load_per_cpu:g} per CPU)")
    if throttled > 0:
        return None
    for name, xs in values.items():
        if len(xs) >= 2 and BY_NAME[name].spread_judges_busy:
            logs = [math.log(x) for x in xs]
            m = sum(logs) / len(logs)
            sd = math.sqrt(sum((x - m) ** 2 for x in logs) / (len(logs) - 1))
            if sd > busy.spread:
                return (f"{name} varied ±{(math.exp(sd) - 1) * 100:.0f} % round to round "
                        f"(log spread over {busy.spread:g})")
    return None


def judge(store: Store, run: RunRow, baseline_runs: int, throttled: int = 0, busy_limits: Busy | None = None) -> Judged:
    """``run`` against the baseline formed before it; ``throttled``: the canary cgroup's ``nr_throttled`` during it.

    A labelled metric (``Metric.compared_within``: the probe guest's accelerator, the KVM module) is compared only with
    the baseline rounds of the same label: a TCG figure never with a KVM one, a kvm_pvm figure never with a kvm_intel
    one; with none of that label in the baseline it is ``not-judged``, and its ``note`` says why."""
    runs = [r for r in canary_runs(store) if r.id < run.id]
    base = runs[:baseline_runs]
    got = figures(store, run)
    values = {name: xs for name, (_labels, xs) in got.items()}
    env = run.env
    if len(base) < baseline_runs:
        metrics = [_metric(name, xs, None, None, "baseline", labels) for name, (labels, xs) in got.items()]
        metrics += _unmeasured(env, got)
        return Judged(run.id, run.started, metrics, [], env, "baseline", baseline_runs=[r.id for r in base])
    busy = busy_reason(env, values, throttled, busy_limits or Busy())
    pooled: dict[str, list[float]] = {}
    other: dict[str, set[str]] = {}  # labels of baseline figures not compared with this run's
    for r in base:
        for name, (labels, xs) in figures(store, r).items():
            if name not in got:
                continue
            if labels != got[name][0]:
                other.setdefault(name, set()).add(label_text(labels) or "no label")
                continue
            pooled.setdefault(name, []).extend(xs)
    metrics = []
    for name, (labels, xs) in got.items():
        ref = pooled.get(name) or []
        if busy is not None or not ref:
            note = None
            if not ref and busy is None:
                note = ("not compared: no baseline run measured it (baseline runs with --quick, or a metric newer "
                        "than the baseline)")
            if not ref and name in other:
                note = (f"not compared: the baseline measured it under {', '.join(sorted(other[name]))}, this run under "
                        f"{label_text(labels) or 'no label'} ('canary baseline --reset' starts a baseline under this one)")
            metrics.append(_metric(name, xs, ref, None, "not-judged", labels, note))
            continue
        ratio, interval = log_welch(ref, xs)
        word = WORDS[vocabulary.effect(interval, THRESHOLD_PCT, BY_NAME[name].higher_is_better)]
        metrics.append(_metric(name, xs, ref, (ratio, interval), word, labels))
    metrics += _unmeasured(env, got)
    regressed = any(m["verdict"] == "regression" for m in metrics)
    verdict = "not-judged" if busy else ("regression" if regressed else "no-regression")
    last_good = next((r for r in reversed(runs) if r in base or recorded_verdict(store, r.id) in ("no-regression", "baseline")),
                     None)
    changed = changes(last_good.env, env) if last_good is not None else []
    if throttled > 0:
        changed.append({"what": "cpu throttling of the canary's cgroup (nr_throttled during the run)", "before": "0",
                        "after": str(throttled)})
    return Judged(run.id, run.started, metrics, changed, env, verdict, busy, [r.id for r in base],
                  last_good.started if last_good else None)


def _median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _metric(name: str, xs: list[float], ref: list[float] | None, fit: tuple[float, Any] | None, verdict: str,
            labels: dict[str, str], note: str | None = None) -> dict[str, Any]:
    m = BY_NAME[name]
    return {"name": name, "value": _median(xs), "unit": m.unit, "rounds": xs, "labels": labels, "note": note,
            "baseline": _median(ref) if ref else None,
            "ratio": fit[0] if fit else None, "interval": list(fit[1]) if fit and fit[1] else None, "verdict": verdict}
