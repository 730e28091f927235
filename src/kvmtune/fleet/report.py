"""The fleet view: findings per rule across hosts, the worst hosts, what changed, the trend.

Files the collection rejected (a host's name that disagrees with its file, a host read twice, a bad finding)
head the text and the HTML report alike: those hosts are not in it. A name that is only its document's claim
(a file named on the command line) is shown as "(claimed)". Text from host files goes through ``safe()``.
"""

from __future__ import annotations

import html
import time
from collections import Counter
from dataclasses import dataclass, field

from kvmtune.fleet.collect import SEVERITY_WEIGHT, FleetFinding, HostResult
from kvmtune.fleet.history import Collection
from kvmtune.textsafe import safe

SEVERITIES = ("critical", "high", "medium", "low", "info")
COLOURS = {"critical": "#8b0000", "high": "#d9480f", "medium": "#f59f00", "low": "#74c0fc", "info": "#adb5bd"}


@dataclass
class RuleRow:
    rule: str
    severity: str
    topic: str
    hosts: set[str] = field(default_factory=set)
    findings: int = 0


@dataclass
class FleetView:
    hosts: list[HostResult]
    rules: list[RuleRow]
    new: list[FleetFinding]
    resolved: list[FleetFinding]
    previous: Collection | None
    trend: list[tuple[int, float, str, dict[str, int]]]
    collection: int | None
    rejected: list[str] = field(default_factory=list)  # one line per file not used, naming it

    @property
    def claimed(self) -> set[str]:
        return {h.host for h in self.hosts if h.claimed}


def build(hosts: list[HostResult], previous: Collection | None,
          trend: list[tuple[int, float, str, dict[str, int]]], collection: int | None,
          rejected: list[str] | None = None) -> FleetView:
    rows: dict[str, RuleRow] = {}
    for h in hosts:
        for f in h.findings:
            row = rows.setdefault(f.rule, RuleRow(f.rule, f.severity, f.topic))
            row.hosts.add(h.host)
            row.findings += 1
            if SEVERITY_WEIGHT.get(f.severity, 0) > SEVERITY_WEIGHT.get(row.severity, 0):
                row.severity = f.severity
    ordered = sorted(rows.values(), key=lambda r: (-SEVERITY_WEIGHT.get(r.severity, 0), -len(r.hosts), r.rule))
    new: list[FleetFinding] = []
    resolved: list[FleetFinding] = []
    if previous is not None:
        # only hosts audited both times: a host that failed now has not "resolved" its findings; and
        # under the same kind of name: a claimed "web01" is not compared with the fleet's own web01
        now_ok = {h.host: h.claimed for h in hosts if h.status == "ok"}
        before_ok = {host: host in previous.claimed for host, (status, _) in previous.hosts.items() if status == "ok"}
        both = {host for host, claimed in now_ok.items() if before_ok.get(host) == claimed}
        now_keys = {f.key: f for h in hosts for f in h.findings if f.host in both}
        before = {f.key: f for f in previous.findings if f.host in both}
        new = [f for k, f in now_keys.items() if k not in before]
        resolved = [f for k, f in before.items() if k not in now_keys]
    return FleetView(hosts, ordered, new, resolved, previous, trend, collection, list(rejected or []))


def _counts(h: HostResult) -> Counter[str]:
    return Counter(f.severity for f in h.findings)


CLAIMED = " (claimed)"


def _name(host: str, claimed: bool, width: int | None = None) -> str:
    """``host`` for a terminal, marked when it is only its document's claim; cut to ``width`` keeping the mark."""
    mark = CLAIMED if claimed else ""
    text = safe(host)
    return (text if width is None else text[:width - len(mark)]) + mark


def render_text(v: FleetView) -> str:
    ok = [h for h in v.hosts if h.status == "ok"]
    failed = [h for h in v.hosts if h.status != "ok"]
    lines = [f"fleet: {len(v.hosts)} host(s), {len(ok)} audited, {len(failed)} failed"
             + (f", {len(v.rejected)} file(s) rejected (their hosts are not in this report)" if v.rejected else "")
             + (f"; stored as collection {v.collection}" if v.collection is not None else "")]
    for problem in v.rejected:
        lines.append(f"  REJECTED {safe(problem)}")
    for h in failed:
        lines.append(f"  FAILED {_name(h.host, h.claimed)}: {safe(h.problem)}")
    lines.append("")
    lines.append("Worst hosts (critical=100, high=10, medium=3, low=1):")
    lines.append(f"  {'HOST':<28} {'SCORE':>6} " + " ".join(f"{s.upper():>8}" for s in SEVERITIES) + "  ERRORS")
    for h in sorted(ok, key=lambda h: (-h.score, h.host)):
        c = _counts(h)
        lines.append(f"  {_name(h.host, h.claimed, 28):<28} {h.score:>6} " + " ".join(f"{c.get(s, 0):>8}" for s in SEVERITIES)
                     + f"  {len(h.errors)}")
    lines.append("")
    lines.append("Findings per rule across hosts:")
    lines.append(f"  {'RULE':<13} {'SEVERITY':<9} {'TOPIC':<20} {'HOSTS':>5} {'FINDINGS':>8}")
    for r in v.rules:
        lines.append(f"  {safe(r.rule):<13} {safe(r.severity):<9} {safe(r.topic)[:20]:<20} {len(r.hosts):>5} "
                     f"{r.findings:>8}")
    if v.previous is not None:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(v.previous.created))
        lines.append("")
        lines.append(f"Since collection {v.previous.id} ({when}): {len(v.new)} new, {len(v.resolved)} resolved")
        claimed = v.claimed
        for tag, items in (("+", v.new), ("-", v.resolved)):
            for f in sorted(items, key=lambda f: f.key):
                where = "/".join(x for x in (f.domain, f.device) if x)
                lines.append(f"  {tag} {_name(f.host, f.host in claimed)} {safe(f.rule)} {safe(f.severity)} {safe(where)}")
    if len(v.trend) > 1:
        lines.append("")
        lines.append("Trend (findings per collection): " + "  ".join(
            f"#{cid}: {sum(c.values())} ({c.get('critical', 0)} critical)" for cid, _, _, c in v.trend))
    return "\n".join(lines) + "\n"


def _bars_svg(v: FleetView) -> str:
    """One stacked bar per host: findings by severity (inline SVG, no fetches)."""
    ok = sorted((h for h in v.hosts if h.status == "ok"), key=lambda h: (-h.score, h.host))
    if not ok:
        return ""
    top = max((len(h.findings) for h in ok), default=1) or 1
    bar_w, gap, height, left = 28, 18, 180, 40
    width = left + len(ok) * (bar_w + gap) + 20
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 90}" role="img" '
             f'aria-label="findings per host by severity">']
    parts.append(f'<text x="4" y="12" font-size="11">findings</text><line x1="{left - 4}" y1="20" x2="{left - 4}" '
                 f'y2="{height + 20}" stroke="#333"/>')
    for i, h in enumerate(ok):
        x = left + i * (bar_w + gap)
        y = float(height + 20)
        c = _counts(h)
        for s in reversed(SEVERITIES):
            n = c.get(s, 0)
            if not n:
                continue
            hpx = n / top * height
            y -= hpx
            parts.append(f'<rect x="{x}" y="{y:.1f}" width="{bar_w}" height="{hpx:.1f}" fill="{COLOURS[s]}">'
                         f'<title>{_e(h.host)}{CLAIMED if h.claimed else ""}: {n} {s}</title></rect>')
        parts.append(f'<text x="{x + bar_w / 2}" y="{height + 34}" font-size="10" text-anchor="end" '
                     f'transform="rotate(-40 {x + bar_w / 2} {height + 34})">{_e(h.host[:24])}</text>')
    parts.append("</svg>")
    legend = " ".join(f'<span style="background:{COLOURS[s]};color:#fff;padding:1px 6px">{s}</span>'
                      for s in SEVERITIES)
    return "".join(parts) + f"<p>{legend}</p>"


def _e(text: str) -> str:
    return html.escape(safe(text))


def render_html(v: FleetView) -> str:
    e = _e

    def name(host: str, claimed: bool) -> str:
        return e(host) + (f"<em>{CLAIMED}</em>" if claimed else "")

    ok = [h for h in v.hosts if h.status == "ok"]
    failed = [h for h in v.hosts if h.status != "ok"]
    rows_hosts = "".join(
        f"<tr><td>{name(h.host, h.claimed)}</td><td>{h.score}</td>"
        + "".join(f"<td>{_counts(h).get(s, 0)}</td>" for s in SEVERITIES)
        + f"<td>{len(h.errors)}</td></tr>" for h in sorted(ok, key=lambda h: (-h.score, h.host)))
    rows_failed = "".join(f"<tr><td>{name(h.host, h.claimed)}</td><td>{e(h.problem)}</td></tr>" for h in failed)
    rejected = ""
    if v.rejected:
        rejected = ('<div style="border:2px solid #8b0000;padding:0 1em;margin-bottom:1em">'
                    f"<h2>{len(v.rejected)} file(s) rejected: their hosts are not in this report</h2><ul>"
                    + "".join(f"<li>{e(p)}</li>" for p in v.rejected) + "</ul></div>")
    rows_rules = "".join(
        f"<tr><td>{e(r.rule)}</td><td>{e(r.severity)}</td><td>{e(r.topic)}</td><td>{len(r.hosts)}</td>"
        f"<td>{r.findings}</td></tr>" for r in v.rules)
    also = f", {len(v.rejected)} file(s) rejected" if v.rejected else ""
    changes = ""
    if v.previous is not None:
        items = "".join(
            f"<li>{tag} {name(f.host, f.host in v.claimed)} {e(f.rule)} {e(f.severity)} "
            f"{e('/'.join(x for x in (f.domain, f.device) if x))}</li>"
            for tag, fs in (("new", v.new), ("resolved", v.resolved)) for f in fs)
        changes = (f"<h2>Since collection {v.previous.id}</h2><p>{len(v.new)} new, {len(v.resolved)} resolved</p>"
                   f"<ul>{items}</ul>")
    trend = ""
    if len(v.trend) > 1:
        trend = "<h2>Trend</h2><table><tr><th>collection</th><th>findings</th><th>critical</th></tr>" + "".join(
            f"<tr><td>{cid}</td><td>{sum(c.values())}</td><td>{c.get('critical', 0)}</td></tr>"
            for cid, _, _, c in v.trend) + "</table>"
    head = "".join(f"<th>{s}</th>" for s in SEVERITIES)
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>kvmtune fleet report</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;margin-bottom:1em}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:left}}</style></head><body>
<h1>kvmtune fleet report</h1>
{rejected}<p>{len(v.hosts)} host(s): {len(ok)} audited, {len(failed)} failed{also}.</p>
{_bars_svg(v)}
<h2>Worst hosts</h2><table><tr><th>host</th><th>score</th>{head}<th>input errors</th></tr>{rows_hosts}</table>
{"<h2>Hosts that failed</h2><table><tr><th>host</th><th>why</th></tr>" + rows_failed + "</table>" if failed else ""}
<h2>Findings per rule across hosts</h2>
<table><tr><th>rule</th><th>severity</th><th>topic</th><th>hosts</th><th>findings</th></tr>{rows_rules}</table>
{changes}{trend}</body></html>
"""
