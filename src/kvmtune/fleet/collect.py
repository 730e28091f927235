"""Reading one collection: a directory (or list) of per-host files written by the Ansible playbook.

Each host leaves either its ``kvmtune audit --format json`` document, or a status document saying why
there is none (unreachable, no Python, kvmtune exited 2). Files are untrusted: each is size-limited,
must be a regular file, and a bad one becomes one line naming it; the rest of the fleet is still read.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvmtune.errors import InputError

MAX_FILE = 64 * 1024 * 1024
SEVERITY_WEIGHT = {"critical": 100, "high": 10, "medium": 3, "low": 1, "info": 0}
STATUS_KIND = "kvmtune-fleet-status"


@dataclass(frozen=True)
class FleetFinding:
    host: str
    rule: str
    severity: str
    topic: str
    domain: str
    device: str
    summary: str

    @property
    def key(self) -> tuple[str, str, str, str]:
        """What identifies "the same problem" across collections."""
        return (self.host, self.rule, self.domain, self.device)


@dataclass
class HostResult:
    host: str
    file: str
    status: str = "ok"  # ok | failed (with ``problem``)
    problem: str = ""
    findings: list[FleetFinding] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    generated: str = ""

    @property
    def score(self) -> int:
        return sum(SEVERITY_WEIGHT.get(f.severity, 0) for f in self.findings)


def _read_json(path: Path) -> Any:
    try:
        st = os.stat(path)
    except OSError as exc:
        raise InputError(str(path), f"cannot read ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(str(path), "not a regular file")
    if st.st_size > MAX_FILE:
        raise InputError(str(path), f"larger than {MAX_FILE // 2**20} MiB")
    try:
        with open(path, "rb") as fh:
            return json.loads(fh.read(MAX_FILE + 1))
    except OSError as exc:
        raise InputError(str(path), f"cannot read ({exc.strerror})") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(str(path), f"not JSON ({str(exc).splitlines()[0]})") from None


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def host_result(path: Path) -> HostResult:
    doc = _read_json(path)
    if not isinstance(doc, dict):
        raise InputError(str(path), "not a kvmtune audit or fleet status document")
    if doc.get("kind") == STATUS_KIND:
        host = _text(doc.get("host")) or path.stem
        return HostResult(host=host, file=str(path), status="failed", problem=_text(doc.get("problem")) or "failed")
    if doc.get("schema_version") != 1 or not isinstance(doc.get("findings"), list):
        raise InputError(str(path), "not a kvmtune audit JSON document (schema_version 1)")
    host = _text(doc.get("host")) or path.stem
    out = HostResult(host=host, file=str(path), generated=_text(doc.get("generated")))
    out.errors = [e for e in doc.get("errors", []) if isinstance(e, str)]
    for f in doc["findings"]:
        if not isinstance(f, dict):
            continue
        raw_target = f.get("target")
        target: dict[str, Any] = raw_target if isinstance(raw_target, dict) else {}
        out.findings.append(FleetFinding(
            host=host, rule=_text(f.get("rule")), severity=_text(f.get("severity")), topic=_text(f.get("topic")),
            domain=_text(target.get("domain")), device=_text(target.get("device")), summary=_text(f.get("summary")),
        ))
    return out


def expand(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            out.extend(sorted(q for q in p.iterdir() if q.suffix == ".json"))
        else:
            out.append(p)
    return out


def read_collection(paths: list[str]) -> tuple[list[HostResult], list[str]]:
    """Every host's result, and one line per file that could not be used."""
    hosts: dict[str, HostResult] = {}
    errors: list[str] = []
    for path in expand(paths):
        try:
            r = host_result(path)
        except InputError as exc:
            errors.append(str(exc))
            continue
        if r.host in hosts:
            errors.append(f"{path}: host {r.host!r} already read from {hosts[r.host].file}; this file is skipped")
            continue
        hosts[r.host] = r
    return sorted(hosts.values(), key=lambda h: h.host), errors
