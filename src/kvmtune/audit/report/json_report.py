from __future__ import annotations

import io
import json
import uuid
from collections import Counter
from datetime import UTC, datetime
from typing import TextIO

from kvmtune import __version__
from kvmtune.audit.engine import AuditResult

SCHEMA_VERSION = 1


def write_json(result: AuditResult, out: TextIO) -> None:
    """Write the JSON document to ``out`` piece by piece: a fleet host's audit of thousands of domains
    never holds the whole document in memory. One finding per line, through the C encoder (``indent=``
    falls back to the pure-Python encoder, which was most of a 1,000-domain audit's time)."""
    counts = Counter(str(f.severity) for f in result.findings)
    token = f"kvmtune-findings-{uuid.uuid4().hex}"  # random, so no input string can be mistaken for it
    doc = {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "kvmtune", "version": __version__},
        "host": result.host,
        "generated": datetime.now(UTC).isoformat(timespec="seconds"),
        "looked_at": result.looked_at,
        "summary": {"findings": len(result.findings), "by_severity": dict(counts), "errors": len(result.errors)},
        "findings": token,
        "errors": result.errors,
    }
    head, tail = json.dumps(doc, indent=2, sort_keys=False).split(json.dumps(token), 1)
    out.write(head)
    out.write("[")
    for i, f in enumerate(result.findings):
        out.write(",\n    " if i else "\n    ")
        out.write(json.dumps(f.to_json()))
    out.write("\n  ]" if result.findings else "]")
    out.write(tail)
    out.write("\n")


def render_json(result: AuditResult) -> str:
    buf = io.StringIO()
    write_json(result, buf)
    return buf.getvalue()
