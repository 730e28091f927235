"""``audit --format prometheus``: finding counts for node_exporter's textfile collector.

One series per (host, rule, severity) with the rule's topic, so alerts and dashboards can group by
any of them; plus totals per severity, the number of inputs that could not be read, and when the
audit ran. Rule ids and topics are kvmtune's stable vocabulary, so series keep their identity.
"""

from __future__ import annotations

import time
from collections import Counter

from kvmtune.audit.engine import AuditResult
from kvmtune.audit.finding import Severity
from kvmtune.prometheus import Metrics


def render_prometheus(result: AuditResult, host: str, now: float | None = None) -> str:
    m = Metrics()
    live = [f for f in result.findings if f.waiver is None]
    per_rule = Counter((f.rule, f.topic, str(f.severity)) for f in live)
    for (rule, topic, severity), n in sorted(per_rule.items()):
        m.add("kvmtune_audit_findings", "Findings of one rule at one severity on this host (waived ones not counted).",
              {"host": host, "rule": rule, "topic": topic, "severity": severity}, n)
    waived = Counter((f.rule, f.topic, str(f.severity), f.waiver.origin) for f in result.findings
                     if f.waiver is not None)
    for (rule, topic, severity, origin), n in sorted(waived.items()):
        m.add("kvmtune_audit_waived_findings",
              "Findings a waiver accepted, per rule and severity on this host, and where the waiver was written "
              "(FILE:LINE, or <metadata> of GUEST).",
              {"host": host, "rule": rule, "topic": topic, "severity": severity, "waiver": origin}, n)
    m.add("kvmtune_audit_waiver_notes", "Waivers that expired or matched nothing in this audit (stale).",
          {"host": host}, len(result.waiver_notes))
    by_severity = Counter(str(f.severity) for f in live)
    for level in Severity:
        m.add("kvmtune_audit_findings_by_severity", "Findings at each severity on this host.",
              {"host": host, "severity": str(level)}, by_severity.get(str(level), 0))
    m.add("kvmtune_audit_guests", "Guests audited.", {"host": host}, len(result.guests))
    m.add("kvmtune_audit_input_errors", "Inputs that could not be read (one line each in text output).",
          {"host": host}, len(result.errors))
    m.add("kvmtune_audit_timestamp_seconds", "When this audit ran (Unix time).", {"host": host},
          time.time() if now is None else now)
    return m.text()
