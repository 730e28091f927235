"""``kvmtune canary fleet FILE…``: many hosts' ``canary run --format json`` documents in one view, hosts with a
settled regression grouped by the environment change they share ("2 hosts that took qemu-system-x86 1:10.0.3 →
1:10.0.6: block.randread4k.qd32.iops -12 % [-15 %, -9 %] …").

The documents come from other hosts: each is read bounded, a regular file, checked field by field; one that does not
fit is refused with one line naming it. Names and versions are printed through ``textsafe``."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from kvmtune.canary.metrics import SUITE_VERSION
from kvmtune.errors import InputError
from kvmtune.inputs import read_regular
from kvmtune.textsafe import safe

MAX_BYTES = 4 << 20
VERDICTS = ("baseline", "regression", "improvement", "no-change", "inconclusive", "not-judged")


@dataclass(frozen=True)
class HostRun:
    host: str
    verdict: str
    regressions: tuple[tuple[str, float, float, float], ...]  # metric, ratio, low, high
    changed: tuple[tuple[str, str, str], ...]  # what, before, after


def _text(where: str, doc: dict[str, Any], key: str, limit: int = 200) -> str:
    value = doc.get(key)
    if not isinstance(value, str) or not value or len(value) > limit:
        raise InputError(where, f"{key!r} is not a string of 1..{limit} characters")
    return value


def _number(where: str, value: Any) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
        raise InputError(where, "a ratio or interval bound is not a positive number")
    return float(value)


def load(path: str) -> HostRun:
    raw = read_regular(path, MAX_BYTES, "a canary JSON document")
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise InputError(path, "not JSON (kvmtune canary run --format json writes it)") from None
    if not isinstance(doc, dict) or doc.get("suite") != SUITE_VERSION:
        raise InputError(path, f"not a canary document of suite {SUITE_VERSION}")
    env = doc.get("environment")
    if not isinstance(env, dict):
        raise InputError(path, "'environment' is not an object")
    host = _text(path, env, "hostname")
    verdict = _text(path, doc, "verdict", 40)
    if verdict not in (*VERDICTS, "no-regression"):
        raise InputError(path, f"verdict {safe(verdict)!r} is not one kvmtune writes")
    metrics, changed = doc.get("metrics"), doc.get("changed")
    if not isinstance(metrics, list) or not isinstance(changed, list) or len(metrics) > 100 or len(changed) > 1000:
        raise InputError(path, "'metrics' or 'changed' is not a list (of at most 100 / 1000)")
    regressions = []
    for m in metrics:
        if not isinstance(m, dict):
            raise InputError(path, "a metric is not an object")
        if m.get("verdict") == "regression":
            interval = m.get("interval")
            if not isinstance(interval, list) or len(interval) != 2:
                raise InputError(path, "a regression without its interval")
            regressions.append((_text(path, m, "name"), _number(path, m.get("ratio")), _number(path, interval[0]),
                                _number(path, interval[1])))
    changes = []
    for c in changed:
        if not isinstance(c, dict):
            raise InputError(path, "a change is not an object")
        changes.append((_text(path, c, "what"), _text(path, c, "before"), _text(path, c, "after")))
    return HostRun(host, verdict, tuple(regressions), tuple(changes))


def group(runs: list[HostRun]) -> list[dict[str, Any]]:
    """Regressed hosts by each change they share; the largest groups first. A host whose regression came with no
    change is grouped under "nothing changed"."""
    groups: dict[tuple[str, str, str] | None, list[HostRun]] = {}
    for run in runs:
        if run.verdict != "regression":
            continue
        for change in run.changed or (None,):
            groups.setdefault(change, []).append(run)
    out = []
    for change, members in sorted(groups.items(), key=lambda kv: (-len(kv[1]), str(kv[0]))):
        per_metric: dict[str, list[tuple[float, float, float]]] = {}
        for r in members:
            for name, ratio, lo, hi in r.regressions:
                per_metric.setdefault(name, []).append((ratio, lo, hi))
        out.append({
            "change": None if change is None else {"what": change[0], "before": change[1], "after": change[2]},
            "hosts": sorted(r.host for r in members),
            # per metric, over the group's hosts: the geometric mean of the ratios and the widest of the intervals
            "metrics": [{"name": name, "hosts": len(v), "ratio": math.exp(sum(math.log(x[0]) for x in v) / len(v)),
                         "interval": [min(x[1] for x in v), max(x[2] for x in v)]}
                        for name, v in sorted(per_metric.items())],
        })
    return out


def _pct(x: float) -> str:
    return f"{(x - 1) * 100:+.0f} %"


def render(groups: list[dict[str, Any]], hosts: int) -> str:
    if not groups:
        return f"{hosts} host(s): no settled regression\n"
    lines = []
    for g in groups:
        c = g["change"]
        what = ("nothing changed (load or hardware)" if c is None
                else f"took {safe(c['what'])} {safe(c['before'])} → {safe(c['after'])}")
        figures = "; ".join(f"{safe(m['name'])} {_pct(m['ratio'])} [{_pct(m['interval'][0])}, {_pct(m['interval'][1])}]"
                            + (f" ({m['hosts']} of them)" if m["hosts"] != len(g["hosts"]) else "")
                            for m in g["metrics"])
        lines.append(f"{len(g['hosts'])} host(s) that {what}: {figures}")
        lines.append(f"  {', '.join(safe(h) for h in g['hosts'])}")
    return "".join(f"{line}\n" for line in lines)
