"""Reporters: text, JSON, SARIF, Prometheus textfile."""

from __future__ import annotations

from kvmtune.audit.engine import AuditResult
from kvmtune.audit.report.json_report import render_json
from kvmtune.audit.report.prometheus import render_prometheus
from kvmtune.audit.report.sarif import render_sarif
from kvmtune.audit.report.text import render_text

FORMATS = ("text", "json", "sarif", "prometheus")


def render(result: AuditResult, fmt: str, color: bool = False, width: int | None = None) -> str:
    if fmt == "json":
        return render_json(result)
    if fmt == "prometheus":
        return render_prometheus(result, result.host or "localhost")
    if fmt == "sarif":
        return render_sarif(result)
    return render_text(result, color=color, width=width)
