from __future__ import annotations

import io
import json
import uuid
from collections import Counter
from datetime import UTC, datetime
from typing import TextIO

from kvmtune import __version__
from kvmtune.audit.engine import AuditResult
from kvmtune.audit.waivers import uuid_of

SCHEMA_VERSION = 1


def write_json(result: AuditResult, out: TextIO) -> None:
    """Write the JSON document to ``out`` piece by piece: a fleet host's audit of thousands of domains
    never holds the whole document in memory. One finding per line, through the C encoder (``indent=``
    falls back to the pure-Python encoder, which was most of a 1,000-domain audit's time)."""
    counts = Counter(str(f.severity) for f in result.findings if f.waiver is None)
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
        "summary": {"findings": len(result.findings) - waived, "by_severity": dict(counts), "waived": waived,
                    "errors": len(result.errors)},
        "findings": token,
        "errors": result.errors,
        "waiver_notes": result.waiver_notes,
    }
    if result.baseline is not None:
        doc["baseline"] = {"report": result.baseline, "new": sum(1 for f in result.findings if f.new and not f.waiver),
                           "resolved": result.resolved}
    head, tail = json.dumps(doc, indent=2, sort_keys=False).split(json.dumps(token), 1)
    out.write(head)
    out.write("[")
    for i, f in enumerate(result.findings):
        out.write(",\n    " if i else "\n    ")
        data = f.to_json()
        guest_uuid = uuids.get(f.target.domain or "")
        if guest_uuid:  # so a later --new-since matches the guest by UUID, whatever its name
            data["target"]["uuid"] = guest_uuid
        out.write(json.dumps(data))
    out.write("\n  ]" if result.findings else "]")
    out.write(tail)
    out.write("\n")


def render_json(result: AuditResult) -> str:
    buf = io.StringIO()
    write_json(result, buf)
    return buf.getvalue()
