from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime

from kvmtune import __version__
from kvmtune.audit.engine import AuditResult

SCHEMA_VERSION = 1


def render_json(result: AuditResult) -> str:
    counts = Counter(str(f.severity) for f in result.findings)
    doc = {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "kvmtune", "version": __version__},
        "host": result.host,
        "generated": datetime.now(UTC).isoformat(timespec="seconds"),
        "looked_at": result.looked_at,
        "summary": {"findings": len(result.findings), "by_severity": dict(counts), "errors": len(result.errors)},
        "findings": [f.to_json() for f in result.findings],
        "errors": result.errors,
    }
    return json.dumps(doc, indent=2, sort_keys=False) + "\n"
