"""SARIF 2.1.0 output, so CI systems and code-scanning UIs can show findings."""

from __future__ import annotations

import json
from json.encoder import encode_basestring_ascii
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
            where = f.extra.get("location")
            if isinstance(where, dict) and isinstance(where.get("line"), int):  # a manifest's field (KubeVirt)
                loc["physicalLocation"]["region"] = {"startLine": where["line"], "startColumn": where["column"]}
        res: dict[str, Any] = {
            "ruleId": f.rule,
            "level": _LEVEL[f.severity],
            "message": {"text": f"{f.summary}: actual {f.actual}, expected {f.expected} ({f.evidence})"},
            "locations": [loc],
            "properties": {"topic": f.topic, "severity": str(f.severity), "confidence": f.confidence,
                           "actual": f.actual, "expected": f.expected, "evidence": f.evidence},
        }
        if f.fix.takes_effect:  # when kvmtune fix's change applies (a property bag: SARIF's fix object needs edits)
            res["properties"]["fix"] = {"kind": f.fix.kind, "takes_effect": f.fix.takes_effect}
        if f.rule in index:
            res["ruleIndex"] = index[f.rule]
        if f.waiver is not None:  # SARIF's own way to say "accepted, and why": code-scanning UIs show it
            w = f.waiver
            until = f" (until {w.expires.isoformat()})" if w.expires else ""
            res["suppressions"] = [{"kind": "external", "status": "accepted", "justification": f"{w.reason}{until} [{w.origin}]",
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
    return dumps_indented(doc) + "\n"


def dumps_indented(obj: object) -> str:
    """``json.dumps(obj, indent=2)``, the same text in under half the time: with ``indent`` the standard
    library leaves its C encoder for a generator per nesting level, which made a 1,000-domain SARIF report
    cost four times its JSON one. Strings go through the same C escaper, each distinct one once; numbers and
    anything else through ``json.dumps`` itself (``tests/audit/test_report_encoders.py`` holds them equal)."""
    chunks: list[str] = []
    put = chunks.append
    escaped: dict[str, str] = {}
    constants: dict[object, str] = {None: "null", True: "true", False: "false"}

    def text(value: str) -> str:
        out = escaped.get(value)
        if out is None:
            out = escaped[value] = encode_basestring_ascii(value)
        return out

    def encode(o: object, indent: str) -> None:
        if isinstance(o, str):
            put(text(o))
        elif isinstance(o, dict):
            if not o:
                put("{}")
                return
            inner = indent + "  "
            sep = "{" + inner
            for k, v in o.items():
                put(sep)
                put(text(k) if isinstance(k, str) else _key(k))
                put(": ")
                if type(v) is str:  # most values: one call fewer
                    put(text(v))
                else:
                    encode(v, inner)
                sep = "," + inner
            put(indent + "}")
        elif isinstance(o, list | tuple):
            if not o:
                put("[]")
                return
            inner = indent + "  "
            sep = "[" + inner
            for v in o:
                put(sep)
                encode(v, inner)
                sep = "," + inner
            put(indent + "]")
        elif o is None or o is True or o is False:
            put(constants[o])
        elif type(o) is int:
            put(int.__repr__(o))
        else:  # floats, int subclasses as json.dumps writes them; anything else raises as it would
            put(json.dumps(o))

    encode(obj, "\n")
    return "".join(chunks)


def _key(k: object) -> str:
    """A dict key that is no string, as ``json.dumps`` writes it: a number or constant, quoted."""
    if k is None or isinstance(k, bool | int | float):
        return encode_basestring_ascii(json.dumps(k))
    raise TypeError(f"keys must be str, int, float, bool or None, not {k.__class__.__name__}")
