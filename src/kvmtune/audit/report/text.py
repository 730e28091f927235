"""The terminal report: grouped by host/domain and device, worst first."""

from __future__ import annotations

import re
import textwrap
from collections import Counter
from itertools import groupby

from kvmtune.audit.engine import AuditResult
from kvmtune.audit.finding import Finding, Severity
from kvmtune.textsafe import safe

_COLOR = {
    Severity.CRITICAL: "\033[1;41;97m",
    Severity.HIGH: "\033[1;31m",
    Severity.MEDIUM: "\033[33m",
    Severity.LOW: "\033[36m",
    Severity.INFO: "\033[2m",
}
_RESET = "\033[0m"
_LABEL = {s: f"{str(s).upper():8}" for s in Severity}  # the severity column, padded


_HANGING = re.compile(r"^(\s*)(?:(?:CRITICAL|HIGH|MEDIUM|LOW|INFO|WAIVED)\s+KVM-[A-Z]+-\d+ |[a-z]+: |Looked at: |hint: )")


def wrap(line: str, width: int | None) -> list[str]:
    """``line`` cut at ``width`` with a hanging indent: continuation lines start under the text
    after the severity and rule id, or after a ``label: ``."""
    if width is None or len(line) <= width:
        return [line]
    m = _HANGING.match(line)
    indent = len(m.group(0)) if m else len(line) - len(line.lstrip())
    if indent > width // 2:
        indent = len(line) - len(line.lstrip()) + 4
    return textwrap.wrap(line, width=width, subsequent_indent=" " * indent, break_on_hyphens=False,
                         drop_whitespace=True) or [line]


# what str.splitlines() ends a line at besides "\n": text holding none is its own lines joined again
_OTHER_LINE_BREAKS = re.compile("[\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")


def _other_line_breaks(text: str) -> bool:
    if text.isascii():  # each `in` a memchr-speed scan, together several times faster than the regex
        return any(c in text for c in "\r\x0b\x0c\x1c\x1d\x1e")
    return _OTHER_LINE_BREAKS.search(text) is not None


def render_text(result: AuditResult, color: bool = False, width: int | None = None) -> str:
    """``width``: wrap to it (a terminal's columns); None leaves lines whole (files, pipes)."""
    text = _render(result)
    if width is None and not color and not _other_line_breaks(text):
        return text  # what splitting it into lines and joining them again would give
    lines = [piece for line in text.splitlines() for piece in wrap(line, width)]
    if color:
        lines = [_colorize(line) for line in lines]
    return "\n".join(lines) + "\n"


def _colorize(line: str) -> str:
    m = re.match(r"^    (CRITICAL|HIGH|MEDIUM|LOW|INFO) +KVM-", line)
    if not m:
        return line
    label = line[4:12]  # the severity padded to 8, as written by _render
    return f"    {_COLOR[Severity.parse(m.group(1))]}{label}{_RESET}{line[12:]}"


def _waived(f: Finding) -> str:
    w = f.waiver
    assert w is not None
    until = f" (until {w.expires.isoformat()})" if w.expires else ""
    return f"waived: {safe(w.reason)}{until}"


class _Safe(dict[object, str]):
    """:func:`safe` of each value once: a report of thousands of findings repeats a few dozen rules' texts."""

    def __missing__(self, value: object) -> str:
        text = self[value] = safe(value)
        return text


def _finding(f: Finding, result: AuditResult, sf: _Safe) -> list[str]:
    if f.waiver is not None and not result.show_waived:
        return [f"    {'WAIVED':8} {f.rule} {sf[f.summary]}; {_waived(f)} [{sf[f.waiver.origin]}]"]
    new = "NEW " if f.new else ""  # --new-since: in the header, where a reader scanning findings sees it
    out = [f"    {_LABEL[f.severity]} {f.rule} {new}{sf[f.summary]}",
           f"             actual: {sf[f.actual]}   expected: {sf[f.expected]}",
           f"             at: {sf[f.evidence]}" + (f"  in {sf[f.source]}" if f.source else "")]
    if f.fix.description:
        when = f" ({f.fix.when})" if f.fix.when else ""
        out.append(f"             fix: {sf[f.fix.description]}{when}")
    if f.extra.get("guessed"):
        out.append(f"             guess: {safe(str(f.extra['guessed']))} (confidence: {f.confidence}); "
                   "kvmtune fix applies it only when the rule is named")
    if f.waiver is not None:
        by = f" by {safe(f.waiver.by)}" if f.waiver.by else ""
        out.append(f"             {_waived(f)}{by} [{safe(f.waiver.origin)}]")
    if f.new:
        out.append(f"             new: not in {safe(result.baseline or '')}")
    return out


def _render(result: AuditResult) -> str:
    out: list[str] = []
    if result.looked_at:
        out.append("Looked at: " + "; ".join(safe(x) for x in result.looked_at))
        out.append("")
    # (host, domain, source) then Finding.sort_key() (host, domain, device, worse first, rule), in one tuple
    def key(f: Finding) -> tuple[str, str, str, str, int, str]:
        t = f.target
        return (t.host, t.domain or "", f.source if t.domain else "", t.device or "", -int(f.severity), f.rule)

    sf = _Safe()
    keyed = sorted(((key(f), f) for f in result.findings), key=lambda kf: kf[0])
    for (host, domain, source), group in groupby(keyed, key=lambda kf: kf[0][:3]):
        head = f"== {sf[domain]}  [{sf[source]}]" if domain else f"== host {safe(host)}"
        out.append(head)
        for device, items in groupby(group, key=lambda kf: kf[0][3]):
            if device:
                out.append(f"  {sf[device]}")
            for _, f in items:
                out.extend(_finding(f, result, sf))
        out.append("")
    live = [f for f in result.findings if f.waiver is None]
    counts = Counter(f.severity for f in live)
    parts = [f"{counts[s]} {s!s}" for s in sorted(Severity, reverse=True) if counts[s]]
    targets = len({(f.target.host, f.target.domain) for f in live})
    summary = f"{len(live)} findings" + (f" ({', '.join(parts)})" if parts else "")
    if len(live) < len(result.findings):
        summary += f", {len(result.findings) - len(live)} waived"
    summary += f" on {targets} target(s); {len(result.guests)} guest(s) audited"
    if result.host_audited:
        summary += ", host audited"
    if result.images:
        summary += f", {len(result.images)} image(s) audited"
    if result.errors:
        summary += f"; {len(result.errors)} input error(s)"
    if result.baseline is not None:
        new = sum(1 for f in live if f.new)
        summary += f"; {new} new and {len(result.resolved)} resolved since {safe(result.baseline)}"
    out.append(summary)
    out.extend(f"note: {safe(line)}" for line in result.waiver_notes)
    for e in result.resolved:
        t = e["target"]
        where = " ".join(safe(p) for p in (t.get("host"), t.get("domain"), t.get("device")) if p)
        out.append(f"resolved: {safe(e['rule'])} {where}: {safe(e['summary'])}")
    out.extend(f"hint: {safe(hint)}" for hint in result.hints)
    return "\n".join(out) + "\n"
