from __future__ import annotations

import io
import json
import uuid
from collections import Counter
from datetime import UTC, datetime
from json.encoder import encode_basestring_ascii
from typing import Any, TextIO

from kvmtune import __version__
from kvmtune.audit.engine import AuditResult
from kvmtune.audit.finding import Finding, Target
from kvmtune.audit.waivers import uuid_of

SCHEMA_VERSION = 1


def write_json(result: AuditResult, out: TextIO) -> None:
    """Write the JSON document to ``out`` piece by piece: a fleet host's audit of thousands of domains
    never holds the whole document in memory. One finding per line, each exactly as ``json.dumps`` writes
    ``Finding.to_json()`` (:class:`FindingEncoder`; ``indent=`` would fall back to the pure-Python encoder)."""
    counts = {str(s): n for s, n in Counter(f.severity for f in result.findings if f.waiver is None).items()}
    waived = sum(1 for f in result.findings if f.waiver is not None)
    uuids = uuid_of(result.guests)
    token = f"kvmtune-findings-{uuid.uuid4().hex}"  # random, so no input string can be mistaken for it
    doc = {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "kvmtune", "version": __version__},
        "host": result.host,
        "generated": datetime.now(UTC).isoformat(timespec="seconds"),
        "looked_at": result.looked_at,
        "scope": result.scope,  # "host", "guests": what this run was asked to audit
        "summary": {"findings": len(result.findings) - waived, "by_severity": counts, "waived": waived,
                    "errors": len(result.errors)},
        "findings": token,
        "errors": result.errors,
        "waiver_notes": result.waiver_notes,
    }
    if result.staged is not None:
        doc["staged"] = result.staged
    if result.baseline is not None:
        doc["baseline"] = {"report": result.baseline, "new": sum(1 for f in result.findings if f.new and not f.waiver),
                           "resolved": result.resolved}
    head, tail = json.dumps(doc, indent=2, sort_keys=False).split(json.dumps(token), 1)
    out.write(head)
    out.write("[")
    encode = FindingEncoder().encode
    for i, f in enumerate(result.findings):
        out.write(",\n    " if i else "\n    ")
        # the UUID, so a later --new-since matches the guest by UUID, whatever its name
        out.write(encode(f, uuids.get(f.target.domain or "")))
    out.write("\n  ]" if result.findings else "]")
    out.write(tail)
    out.write("\n")


def _value(value: object) -> str:
    """``value`` as ``json.dumps`` writes it inside a document (a plain ``str`` through its C escaper)."""
    return encode_basestring_ascii(value) if type(value) is str else json.dumps(value)


class _Escaped(dict[str, str]):
    def __missing__(self, value: str) -> str:
        out = self[value] = encode_basestring_ascii(value)
        return out


class FindingEncoder:
    """One finding as the line ``json.dumps(finding.to_json())`` is, built from pieces it has written before.

    A fleet audit's thousands of findings come from a few dozen rules: their rule, slug, topic, severity and
    confidence, and their why, fix and references, repeat; a target repeats for each finding on one device.
    Each such group is escaped once and reused, which makes a 1,000-domain report's findings cost a quarter
    of ``json.dumps`` per finding (``tests/audit/test_report_encoders.py`` holds them byte-identical)."""

    def __init__(self) -> None:
        # each key holds every value its piece is written from, with the types json.dumps tells apart where
        # equal values could differ (True == 1, Severity.HIGH == 3)
        self._heads: dict[tuple[Any, ...], str] = {}
        self._targets: dict[tuple[Any, ...], str] = {}
        self._tails: dict[tuple[Any, ...], str] = {}
        self._escaped = _Escaped()  # the strings that differ more: actual, expected, evidence, summary, source

    # pieces kept at most (~150 KiB); then forgotten and written anew: findings come target by target,
    # so what repeats is written again soon after, and a fleet of distinct guests never fills memory with them
    KEEP = 1024

    def encode(self, f: Finding, guest_uuid: str | None = None) -> str:
        if len(self._escaped) + len(self._targets) + len(self._tails) > self.KEEP:
            for pieces in (self._heads, self._targets, self._tails, self._escaped):
                pieces.clear()
        t, fix = f.target, f.fix
        try:
            head = self._heads.get(key := (f.rule, f.slug, f.topic, f.severity, type(f.severity), f.confidence))
            if head is None:
                head = self._heads[key] = (
                    f'{{"rule": {_value(f.rule)}, "slug": {_value(f.slug)}, "topic": {_value(f.topic)}, '
                    f'"severity": {_value(str(f.severity))}, "confidence": {_value(f.confidence)}, "target": ')
            target = self._targets.get(tkey := (t.host, t.domain, t.device, guest_uuid))
            if target is None:
                target = self._targets[tkey] = _target(t, guest_uuid)
            tail = self._tails.get(fkey := (f.why, fix.kind, fix.description, fix.safe, type(fix.safe), f.references,
                                            fix.takes_effect))
            if tail is None:
                tail = self._tails[fkey] = _tail(f)
        except TypeError:  # an unhashable value (a list where a tuple is typed): this finding written whole
            return json.dumps(_with_uuid(f.to_json(), guest_uuid))
        esc = self._escaped
        a, x, ev, su, so = f.actual, f.expected, f.evidence, f.summary, f.source
        line = (f'{head}{target}, "actual": {esc[a] if type(a) is str else _value(a)}, '
                f'"expected": {esc[x] if type(x) is str else _value(x)}, '
                f'"evidence": {esc[ev] if type(ev) is str else _value(ev)}, '
                f'"summary": {esc[su] if type(su) is str else _value(su)}, {tail}, '
                f'"source": {esc[so] if type(so) is str else _value(so)}')
        if f.extra:
            line += f', "extra": {json.dumps(dict(f.extra))}'
        if f.waiver is not None:
            line += f', "waiver": {json.dumps(f.waiver.to_json())}'
        if f.new is not None:
            line += f', "new": {_value(f.new)}'
        return line + "}"


def _target(t: Target, guest_uuid: str | None) -> str:
    with_uuid = f', "uuid": {_value(guest_uuid)}' if guest_uuid else ""
    return f'{{"host": {_value(t.host)}, "domain": {_value(t.domain)}, "device": {_value(t.device)}{with_uuid}}}'


def _tail(f: Finding) -> str:
    fix = f.fix
    when = f', "takes_effect": {_value(fix.takes_effect)}' if fix.takes_effect else ""
    return (f'"why": {_value(f.why)}, "fix": {{"kind": {_value(fix.kind)}, "description": {_value(fix.description)}, '
            f'"safe": {_value(fix.safe)}{when}}}, "references": {_value(list(f.references))}')


def _with_uuid(data: dict[str, Any], guest_uuid: str | None) -> dict[str, Any]:
    if guest_uuid:
        data["target"]["uuid"] = guest_uuid
    return data


def render_json(result: AuditResult) -> str:
    buf = io.StringIO()
    write_json(result, buf)
    return buf.getvalue()
