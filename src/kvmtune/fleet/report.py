"""The fleet view: findings per rule across hosts, the worst hosts, what changed, the trend.

Files the collection rejected (a host's name that disagrees with its file, a host read twice, a bad finding)
head the text and the HTML report alike: those hosts are not in it. A name that is only its document's claim
(a file named on the command line) is shown as "(claimed)". Text from host files goes through ``safe()``.

What changed is computed only against the previous collection of the same name and scope. A finding of that
collection is *resolved* only where this collection audited the same place again (the same host, under the
same kind of name, and its host or guest part within this audit's scope); otherwise it is *not audited this
time*, its own state. Waived findings (the host's own waivers, or the fleet's ``--waivers``) are shown apart
and count toward no score, severity column or trend.

A host whose audit ran with ``--staged`` reports how many of its journaled fixes are not in force yet
(``kvmtune fix --status``); where any host did, the hosts table has a STAGED column ("-": not reported), and the
text lists each such host's count by when the changes take effect.
"""

from __future__ import annotations

import html
import time
from collections import Counter
from dataclasses import dataclass, field

from kvmtune.fleet.collect import SEVERITY_WEIGHT, FleetFinding, HostResult, covers
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
    waived: int = 0


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
    unaudited: list[FleetFinding] = field(default_factory=list)  # the previous collection's, not looked at again
    label: str = ""
    scope: str = ""
    notes: list[str] = field(default_factory=list)  # the fleet waivers' expired and stale lines
    unsaved: str = ""  # why this collection was not stored

    @property
    def claimed(self) -> set[str]:
        return {h.host for h in self.hosts if h.claimed}


def collection_scope(hosts: list[HostResult]) -> str:
    """The scope of a collection: its audited hosts' one scope, or ``mixed``."""
    found = {h.scope for h in hosts if h.status == "ok"}
    return found.pop() if len(found) == 1 else ("mixed" if found else "")


def build(hosts: list[HostResult], previous: Collection | None,
          trend: list[tuple[int, float, str, dict[str, int]]], collection: int | None,
          rejected: list[str] | None = None, *, label: str = "", notes: list[str] | None = None) -> FleetView:
    rows: dict[str, RuleRow] = {}
    for h in hosts:
        for f in h.findings:
            row = rows.setdefault(f.rule, RuleRow(f.rule, f.severity, f.topic))
            if f.waiver:
                row.waived += 1
                continue
            row.hosts.add(h.host)
            row.findings += 1
            if SEVERITY_WEIGHT.get(f.severity, 0) > SEVERITY_WEIGHT.get(row.severity, 0):
                row.severity = f.severity
    ordered = sorted((r for r in rows.values() if r.findings),
                     key=lambda r: (-SEVERITY_WEIGHT.get(r.severity, 0), -len(r.hosts), r.rule))
    new: list[FleetFinding] = []
    resolved: list[FleetFinding] = []
    unaudited: list[FleetFinding] = []
    if previous is not None:
        # under the same kind of name only: a claimed "web01" is not the fleet's own web01
        now_ok = {h.host: h for h in hosts if h.status == "ok"}
        before_ok = {host for host, (status, _) in previous.hosts.items() if status == "ok"}

        def again(f: FleetFinding) -> bool:  # looked at where the previous collection found f
            h = now_ok.get(f.host)
            return h is not None and h.claimed == (f.host in previous.claimed) and covers(h.scope, f)

        now_keys = {f.key: f for h in now_ok.values() for f in h.findings}
        before = {f.key: f for f in previous.findings if f.host in before_ok}
        for k, f in before.items():
            if not again(f):
                unaudited.append(f)
            elif k not in now_keys:
                resolved.append(f)
        new = [f for k, f in now_keys.items() if k not in before and f.host in before_ok
               and now_ok[f.host].claimed == (f.host in previous.claimed)
               and covers(previous.scopes.get(f.host, ""), f)]
    return FleetView(hosts, ordered, new, resolved, previous, trend, collection, list(rejected or []), unaudited,
                     label, collection_scope(hosts), list(notes or []))


def _counts(h: HostResult) -> Counter[str]:
    return Counter(f.severity for f in h.open)


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
    lines.append(f"collection {_label(v.label)}, scope {v.scope or 'unknown'}"
                 + (f"; not stored ({v.unsaved})" if v.collection is None else ""))
    lines.append("")
    lines.append("Worst hosts (critical=100, high=10, medium=3, low=1):")
    staged = _any_staged(ok)
    lines.append(f"  {'HOST':<28} {'SCORE':>6} " + " ".join(f"{s.upper():>8}" for s in SEVERITIES) + "  ERRORS"
                 + ("  STAGED" if staged else ""))
    for h in sorted(ok, key=lambda h: (-h.score, h.host)):
        c = _counts(h)
        lines.append(f"  {_name(h.host, h.claimed, 28):<28} {h.score:>6} " + " ".join(f"{c.get(s, 0):>8}" for s in SEVERITIES)
                     + (f"  {len(h.errors):>6}  {_staged_cell(h):>6}" if staged else f"  {len(h.errors)}"))
    if staged:
        lines.append("")
        lines.append("Staged fixes (journaled by 'kvmtune fix', not in force yet; 'kvmtune fix --status' on the host):")
        for h in sorted((h for h in ok if h.staged), key=lambda h: (-(h.staged or 0), h.host)):
            by = ", ".join(f"{n} {word}" for word, n in sorted(h.staged_by.items()) if n)
            lines.append(f"  {_name(h.host, h.claimed)}: {h.staged} ({by})")
        quiet = sum(1 for h in ok if h.staged == 0)
        unreported = sum(1 for h in ok if h.staged is None)
        lines.append(f"  {quiet} host(s) with none staged" + (f"; {unreported} host(s) did not report it (an audit "
                                                                 "without --staged)" if unreported else ""))
    lines.append("")
    lines.append("Findings per rule across hosts:")
    lines.append(f"  {'RULE':<13} {'SEVERITY':<9} {'TOPIC':<20} {'HOSTS':>5} {'FINDINGS':>8}")
    for r in v.rules:
        lines.append(f"  {safe(r.rule):<13} {safe(r.severity):<9} {safe(r.topic)[:20]:<20} {len(r.hosts):>5} "
                     f"{r.findings:>8}")
    waived = [f for h in ok for f in h.waived]
    if waived or v.notes:
        lines.append("")
        lines.append(f"Waived findings ({len(waived)}, counted in no score or column above):")
        for f in sorted(waived, key=lambda f: f.key):
            lines.append(f"  {_name(f.host, f.host in v.claimed)} {safe(f.rule)} {safe(f.severity)} {safe(_where(f))}: "
                         f"waived: {safe(f.waiver)}")
        lines.extend(f"  {safe(note)}" for note in v.notes)
    if v.previous is not None:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(v.previous.created))
        lines.append("")
        lines.append(f"Since collection {v.previous.id} ({when}): {len(v.new)} new, {len(v.resolved)} resolved, "
                     f"{len(v.unaudited)} not audited this time")
        claimed = v.claimed
        for tag, items in (("+", v.new), ("-", v.resolved)):
            for f in sorted(items, key=lambda f: f.key):
                lines.append(f"  {tag} {_name(f.host, f.host in claimed)} {safe(f.rule)} {safe(f.severity)} {safe(_where(f))}"
                             + (" (waived)" if f.waiver else ""))
        for host, (n, why) in unaudited_hosts(v).items():
            lines.append(f"  ? {_name(host, host in v.previous.claimed)}: {n} finding(s) not audited this time ({why})")
    if len(v.trend) > 1:
        lines.append("")
        lines.append("Trend (findings per collection): " + "  ".join(
            f"#{cid}: {sum(c.values())} ({c.get('critical', 0)} critical)" for cid, _, _, c in v.trend))
    return "\n".join(lines) + "\n"


def _any_staged(hosts: list[HostResult]) -> bool:
    return any(h.staged is not None for h in hosts)


def _staged_cell(h: HostResult) -> str:
    return "-" if h.staged is None else str(h.staged)


def _label(label: str) -> str:
    return repr(safe(label)) if label else "(unnamed)"


def _where(f: FleetFinding) -> str:
    return "/".join(x for x in (f.domain, f.device) if x)


def unaudited_hosts(v: FleetView) -> dict[str, tuple[int, str]]:
    """Per host of the previous collection: how many of its findings were not looked at again, and why."""
    now = {h.host: h for h in v.hosts}
    out: dict[str, tuple[int, str]] = {}
    for f in sorted(v.unaudited, key=lambda f: f.key):
        h = now.get(f.host)
        why = ("not in this collection" if h is None else f"failed: {h.problem}" if h.status != "ok"
               else "named by a file's own claim one time, by the fleet directory the other"
               if h.claimed != (v.previous is not None and f.host in v.previous.claimed)
               else f"this audit's scope is {h.scope}")
        out[f.host] = (out.get(f.host, (0, ""))[0] + 1, why)
    return out


def _bars_svg(v: FleetView) -> str:
    """One stacked bar per host: open findings by severity (inline SVG, no fetches), hosts in the worst-hosts
    table's order (by score, which weighs severity; a bar's height is a count, so it can be shorter than the next);
    each bar's count is written over it."""
    ok = sorted((h for h in v.hosts if h.status == "ok"), key=lambda h: (-h.score, h.host))
    if not ok:
        return ""
    top = max((len(h.open) for h in ok), default=1) or 1
    bar_w, gap, height, left = 28, 18, 180, 40
    width = left + len(ok) * (bar_w + gap) + 20
    parts = ["<p>Open findings per host by severity, hosts in score order (waived findings not counted)</p>",
             f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 60}" role="img" '
             f'aria-label="open findings per host by severity">']
    parts.append(f'<line x1="{left - 4}" y1="20" x2="{left - 4}" y2="{height + 20}" stroke="#333"/>')
    for i, h in enumerate(ok):
        x = left + i * (bar_w + gap)
        y = float(height + 20)
        c = _counts(h)
        total = len(h.open)
        parts.append(f'<text x="{x + bar_w / 2}" y="{height + 20 - total / top * height - 3:.1f}" font-size="10" '
                     f'text-anchor="middle">{total}</text>')
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
    staged = _any_staged(ok)
    rows_hosts = "".join(
        f"<tr><td>{name(h.host, h.claimed)}</td><td>{h.score}</td>"
        + "".join(f"<td>{_counts(h).get(s, 0)}</td>" for s in SEVERITIES)
        + f"<td>{len(h.errors)}</td>"
        + (f"<td title=\"{e(', '.join(f'{n} {w}' for w, n in sorted(h.staged_by.items()) if n))}\">{_staged_cell(h)}</td>"
           if staged else "")
        + "</tr>" for h in sorted(ok, key=lambda h: (-h.score, h.host)))
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
            f"<li>{tag} {name(f.host, f.host in v.claimed)} {e(f.rule)} {e(f.severity)} {e(_where(f))}"
            f"{' (waived)' if f.waiver else ''}</li>"
            for tag, fs in (("new", v.new), ("resolved", v.resolved)) for f in sorted(fs, key=lambda f: f.key))
        items += "".join(f"<li>not audited this time: {name(host, host in v.previous.claimed)}: {n} finding(s) "
                         f"({e(why)})</li>" for host, (n, why) in unaudited_hosts(v).items())
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(v.previous.created))
        changes = (f"<h2>Since collection {v.previous.id} ({when})</h2><p>{len(v.new)} new, {len(v.resolved)} resolved, "
                   f"{len(v.unaudited)} not audited this time</p><ul>{items}</ul>")
    waived = sorted((f for h in ok for f in h.waived), key=lambda f: f.key)
    waivers = ""
    if waived or v.notes:
        waivers = (f"<h2>Waived findings ({len(waived)})</h2><p>Counted in no score or column above.</p>"
                   "<table><tr><th>host</th><th>rule</th><th>severity</th><th>where</th><th>waived because</th></tr>"
                   + "".join(f"<tr><td>{name(f.host, f.host in v.claimed)}</td>"
                             f"<td style=\"white-space:nowrap\">{e(f.rule)}</td><td>{e(f.severity)}"
                             f"</td><td>{e(_where(f))}</td><td>{e(f.waiver)}</td></tr>" for f in waived)
                   + "</table>" + "".join(f"<p>{e(n)}</p>" for n in v.notes))
    trend = ""
    if len(v.trend) > 1:
        trend = "<h2>Trend</h2><table><tr><th>collection</th><th>open findings</th><th>critical</th></tr>" + "".join(
            f"<tr><td>{cid}</td><td>{sum(c.values())}</td><td>{c.get('critical', 0)}</td></tr>"
            for cid, _, _, c in v.trend) + "</table>"
    head = "".join(f"<th>{s}</th>" for s in SEVERITIES)
    staged_head = "<th>staged fixes</th>" if staged else ""
    stored = f", stored as collection {v.collection}" if v.collection is not None else f", not stored ({e(v.unsaved)})"
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>kvmtune fleet report</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;margin-bottom:1em}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:left}}</style></head><body>
<h1>kvmtune fleet report</h1>
{rejected}<p>{len(v.hosts)} host(s): {len(ok)} audited, {len(failed)} failed{also}.
Collection {e(_label(v.label))}, scope {e(v.scope or "unknown")}{stored}.</p>
{_bars_svg(v)}
<h2>Worst hosts</h2><table><tr><th>host</th><th>score</th>{head}<th>input errors</th>{staged_head}</tr>{rows_hosts}</table>
{"<h2>Hosts that failed</h2><table><tr><th>host</th><th>why</th></tr>" + rows_failed + "</table>" if failed else ""}
<h2>Findings per rule across hosts</h2>
<table><tr><th>rule</th><th>severity</th><th>topic</th><th>hosts</th><th>findings</th></tr>{rows_rules}</table>
{waivers}{changes}{trend}</body></html>
"""
