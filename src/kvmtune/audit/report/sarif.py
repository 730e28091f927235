"""SARIF 2.1.0 output, so CI systems and code-scanning UIs can show findings."""

from __future__ import annotations

import json
from typing import Any

from kvmtune import __version__
from kvmtune.audit.engine import AuditResult
from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import all_rules

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"

_LEVEL = {
    Severity.CRITICAL: "error",
    Severity.HIGH: "error",
    Severity.MEDIUM: "warning",
    Severity.LOW: "note",
    Severity.INFO: "note",
}


def _uri(source: str) -> str:
    if "://" in source:
        return source
    return source.lstrip("/") if source.startswith("/") else source


def render_sarif(result: AuditResult) -> str:
    rules = all_rules()
    index = {r.id: i for i, r in enumerate(rules)}
    driver_rules: list[dict[str, Any]] = [
        {
            "id": r.id,
            "name": r.slug,
            "shortDescription": {"text": r.title},
            "fullDescription": {"text": r.why},
            "help": {"text": r.fix_description or r.title, "markdown": r.doc()},
            "defaultConfiguration": {"level": _LEVEL[r.severity]},
            "properties": {"topic": r.topic, "severity": str(r.severity), "tags": [r.topic]},
        }
        for r in rules
    ]
    results: list[dict[str, Any]] = []
    for f in result.findings:
        loc: dict[str, Any] = {
            "logicalLocations": [
                {"name": f.target.device or f.target.domain or f.target.host,
                 "fullyQualifiedName": "/".join(p for p in (f.target.host, f.target.domain, f.target.device) if p),
                 "kind": "resource"}
            ]
        }
        if f.source:
            loc["physicalLocation"] = {"artifactLocation": {"uri": _uri(f.source)}}
        res: dict[str, Any] = {
            "ruleId": f.rule,
            "level": _LEVEL[f.severity],
            "message": {"text": f"{f.summary}: actual {f.actual}, expected {f.expected} ({f.evidence})"},
            "locations": [loc],
            "properties": {"topic": f.topic, "severity": str(f.severity), "confidence": f.confidence,
                           "actual": f.actual, "expected": f.expected, "evidence": f.evidence},
        }
        if f.rule in index:
            res["ruleIndex"] = index[f.rule]
        if f.waiver is not None:  # SARIF's own way to say "accepted, and why": code-scanning UIs show it
            w = f.waiver
            until = f" (until {w.expires.isoformat()})" if w.expires else ""
            res["suppressions"] = [{"kind": "external", "status": "accepted", "justification": f"{w.reason}{until}",
                                    "properties": w.to_json()}]
        if f.new is not None:
            res["baselineState"] = "new" if f.new else "unchanged"
        results.append(res)
    doc = {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {"driver": {"name": "kvmtune", "version": __version__,
                                    "informationUri": "https://example.invalid/kvmtune", "rules": driver_rules}},
                "results": results,
                "invocations": [
                    {
                        "executionSuccessful": not result.errors,
                        "toolExecutionNotifications": [
                            {"level": "error", "message": {"text": e}} for e in result.errors
                        ] + [{"level": "warning", "message": {"text": n}} for n in result.waiver_notes],
                    }
                ],
            }
        ],
    }
    return json.dumps(doc, indent=2) + "\n"
