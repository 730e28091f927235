"""Reading one collection: a directory (or list) of per-host files written by the Ansible playbook.

Each host leaves either its ``kvmtune audit --format json`` document, or a status document saying why
there is none (unreachable, no Python, kvmtune exited 2). Files are untrusted: each is size-limited,
must be a regular file, and a bad one becomes one line naming it; the rest of the fleet is still read.

Who a file speaks for: in a fleet directory (contrib/ansible fetches ``<inventory_hostname>.json``) the
file's name is the host's identity and the document's ``host`` only a claim, which must agree with it
(the same name, ignoring case, or one the other's first DNS label: ``web01`` in ``web01.example.com.json``);
a file named on the command line keeps the document's ``host``, marked as claimed. A document whose claim
disagrees, and every file of a host read more than once, are rejected, so no file can stand in for
another host. A finding whose rule id is not ``KVM-XXX-NNN`` or whose severity is not one of the five,
a key written twice in one object, and any field of the wrong JSON type, reject the file too: it is reported,
never silently thinned. ``staged`` (``audit --staged``: the host's journaled fixes not in force yet) is optional;
where it is there, its counts must be whole numbers within bounds that add up, or the file is rejected.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvmtune.errors import InputError
from kvmtune.inputs import read_regular

MAX_FILE = 64 * 1024 * 1024
SEVERITY_WEIGHT = {"critical": 100, "high": 10, "medium": 3, "low": 1, "info": 0}
# fix/effect.py's words, which a host's staged changes are counted by (fleet/ may not import fix/)
TAKES_EFFECT = ("live", "restart", "new-instances", "host-boot", "guest-offline")
MAX_COUNT = 10_000_000  # a count above this is no host's journal: rejected
STATUS_KIND = "kvmtune-fleet-status"
RULE_ID = re.compile(r"KVM-[A-Z]{3}-[0-9]{3}")  # the catalogue's ids (tests/rules/test_rule_docs.py), ASCII only


@dataclass(frozen=True)
class FleetFinding:
    host: str
    rule: str
    severity: str
    topic: str
    domain: str
    device: str
    summary: str
    uuid: str = ""  # the guest's UUID where the audit knew it
    waiver: str = ""  # why a waiver accepted it ("" : open): the host's own, or the fleet's (report --waivers)

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
    claimed: bool = False  # the name is the document's own claim (a file named on the command line)
    scope: str = ""  # what its audit was asked for: host, guests, both ("": a document from before kvmtune said)
    staged: int | None = None  # its journaled fixes not in force yet (audit --staged); None: not reported
    staged_by: dict[str, int] = field(default_factory=dict)  # those by takes_effect

    @property
    def open(self) -> list[FleetFinding]:
        """The findings no waiver accepted: what the score and the counts are made of."""
        return [f for f in self.findings if not f.waiver]

    @property
    def waived(self) -> list[FleetFinding]:
        return [f for f in self.findings if f.waiver]

    @property
    def score(self) -> int:
        return sum(SEVERITY_WEIGHT.get(f.severity, 0) for f in self.open)


SCOPES = ("host", "guests")


def scope_name(parts: list[str] | set[str]) -> str:
    """``["host", "guests"]`` -> ``both``; one part -> its name."""
    return "both" if set(parts) == set(SCOPES) else next(iter(parts), "")


def covers(scope: str, f: FleetFinding) -> bool:
    """Whether an audit of ``scope`` looks where ``f`` was found (a guest's finding names its domain);
    an unknown scope ("") covers everything, as before kvmtune recorded it."""
    return scope in ("", "both") or scope == ("guests" if f.domain else "host")


@dataclass(frozen=True)
class Source:
    path: Path
    in_directory: bool  # found in a fleet directory: its name is the host's identity


class DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are each written once: Python's json keeps the last of two, so a second
    ``"staged"`` or ``"severity"`` could say something else than the first that another reader sees."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKey(f"key {key[:60]!r} written twice in one object; rejected")
        out[key] = value
    return out


def _read_json(path: Path) -> Any:
    data = read_regular(str(path), MAX_FILE)
    try:
        return json.loads(data, object_pairs_hook=_no_duplicates)
    except DuplicateKey as exc:
        raise InputError(str(path), str(exc)) from None
    except RecursionError:
        raise InputError(str(path), "JSON nested too deeply to read") from None
    except MemoryError:
        raise InputError(str(path), "too large to read into memory") from None
    except ValueError as exc:  # UnicodeDecodeError too
        raise InputError(str(path), f"not JSON ({str(exc).splitlines()[0]})") from None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def _wrong(path: Path, where: str, want: str, value: Any) -> InputError:
    return InputError(str(path), f"{where}: expected {want}, found {_json_type(value)}; rejected")


def _string(path: Path, obj: dict[str, Any], key: str, where: str, *, optional: bool = False) -> str:
    """``obj[key]``, a string; ``optional``: may also be missing or null (then "")."""
    if key not in obj and not optional:
        raise InputError(str(path), f"{where}{key}: missing; rejected")
    value = obj.get(key)
    if isinstance(value, str):
        return value
    if value is None and optional:
        return ""
    raise _wrong(path, f"{where}{key}", "a string" + (" or null" if optional else ""), value)


def same_host(claim: str, name: str) -> bool:
    """Whether a document's ``host`` agrees with the file name it was fetched under."""
    a, b = claim.casefold(), name.casefold()
    return a == b or a.split(".")[0] == b or b.split(".")[0] == a


def host_result(path: Path, identity: str | None = None) -> HostResult:
    """One host file. ``identity``: the host's name from a fleet directory's file name (the document's
    ``host`` must agree); ``None``: the document's own ``host``, kept as claimed."""
    doc = _read_json(path)
    if not isinstance(doc, dict):
        raise InputError(str(path), "not a kvmtune audit or fleet status document")
    claim = _string(path, doc, "host", "")
    if not claim:
        raise InputError(str(path), "host: empty; rejected")
    if identity is not None and not same_host(claim, identity):
        raise InputError(str(path), f"the document says host {claim!r}, its file name says {identity!r} "
                                    "(a fleet directory's files are named after their inventory host); rejected")
    host = claim if identity is None else identity
    claimed = identity is None
    if doc.get("kind") == STATUS_KIND:
        problem = _string(path, doc, "problem", "", optional=True)
        return HostResult(host=host, file=str(path), status="failed", problem=problem or "failed", claimed=claimed)
    if type(doc.get("schema_version")) is not int or doc.get("schema_version") != 1:
        raise InputError(str(path), "not a kvmtune audit JSON document (schema_version 1)")
    scope = _scope(path, doc.get("scope", []))
    findings, errors = doc.get("findings"), doc.get("errors", [])
    if not isinstance(findings, list):
        raise _wrong(path, "findings", "an array", findings)
    if not isinstance(errors, list):
        raise _wrong(path, "errors", "an array", errors)
    out = HostResult(host=host, file=str(path), generated=_string(path, doc, "generated", "", optional=True),
                     claimed=claimed, scope=scope)
    out.staged, out.staged_by = _staged(path, doc.get("staged"))
    for i, e in enumerate(errors):
        if not isinstance(e, str):
            raise _wrong(path, f"errors[{i}]", "a string", e)
        out.errors.append(e)
    for i, f in enumerate(findings):
        where = f"findings[{i}]"
        if not isinstance(f, dict):
            raise _wrong(path, where, "an object", f)
        rule = _string(path, f, "rule", f"{where}.")
        if not RULE_ID.fullmatch(rule):
            raise InputError(str(path), f"{where}.rule: {rule!r} is not a kvmtune rule id (KVM-XXX-NNN); rejected")
        severity = _string(path, f, "severity", f"{where}.")
        if severity not in SEVERITY_WEIGHT:
            raise InputError(str(path), f"{where}.severity: {severity!r} is not one of "
                                        f"{', '.join(SEVERITY_WEIGHT)}; rejected")
        target = f.get("target", {})
        if not isinstance(target, dict):
            raise _wrong(path, f"{where}.target", "an object", target)
        out.findings.append(FleetFinding(
            host=host, rule=rule, severity=severity, topic=_string(path, f, "topic", f"{where}.", optional=True),
            domain=_string(path, target, "domain", f"{where}.target.", optional=True),
            device=_string(path, target, "device", f"{where}.target.", optional=True),
            summary=_string(path, f, "summary", f"{where}.", optional=True),
            uuid=_string(path, target, "uuid", f"{where}.target.", optional=True).lower(),
            waiver=_waiver(path, f.get("waiver"), f"{where}.waiver"),
        ))
    return out


def _count(path: Path, value: Any, where: str, most: int = MAX_COUNT) -> int:
    if type(value) is not int:  # not a bool, not 2.0
        raise _wrong(path, where, "a whole number", value)
    if not 0 <= value <= most:
        raise InputError(str(path), f"{where}: {value} is not between 0 and {most}; rejected")
    return value


def _staged(path: Path, staged: Any) -> tuple[int | None, dict[str, int]]:
    """``staged``: {"changes": N, "by_takes_effect": {WORD: n, ...}, ...}, the counts adding up to N; (None, {})
    where the host did not report it (absent or null: an audit without --staged)."""
    if staged is None:
        return None, {}
    if not isinstance(staged, dict):
        raise _wrong(path, "staged", "an object", staged)
    if "changes" not in staged:
        raise InputError(str(path), "staged.changes: missing; rejected")
    total = _count(path, staged["changes"], "staged.changes")
    by = staged.get("by_takes_effect", {})
    if not isinstance(by, dict):
        raise _wrong(path, "staged.by_takes_effect", "an object", by)
    counts: dict[str, int] = {}
    for word, n in by.items():
        if word not in TAKES_EFFECT and word != "?":  # "?": a journal from before takes_effect
            raise InputError(str(path), f"staged.by_takes_effect: {word[:40]!r} is not one of "
                                        f"{', '.join(TAKES_EFFECT)}; rejected")
        counts[word] = _count(path, n, f"staged.by_takes_effect.{word}")
    if sum(counts.values()) != total:
        raise InputError(str(path), f"staged: by_takes_effect adds up to {sum(counts.values())}, not the "
                                    f"{total} changes; rejected")
    for key in ("cannot_tell",):
        if key in staged:
            _count(path, staged[key], f"staged.{key}", total)
    for key in ("journals", "refused_journals"):
        if key in staged:
            _count(path, staged[key], f"staged.{key}")
    return total, counts


def _scope(path: Path, scope: Any) -> str:
    if not isinstance(scope, list) or not all(isinstance(x, str) and x in SCOPES for x in scope):
        raise InputError(str(path), f"scope: expected an array of {' and '.join(map(repr, SCOPES))}; rejected")
    return scope_name(scope)


def _waiver(path: Path, w: Any, where: str) -> str:
    """A finding's ``waiver`` object (the host's audit applied it) as one line: its reason, until when, and
    where it was written; "" when there is none."""
    if w is None:
        return ""
    if not isinstance(w, dict):
        raise _wrong(path, where, "an object or null", w)
    reason = _string(path, w, "reason", f"{where}.")
    if not reason:
        raise InputError(str(path), f"{where}.reason: empty (every waiver says why); rejected")
    until = _string(path, w, "expires", f"{where}.", optional=True)
    origin = _string(path, w, "origin", f"{where}.", optional=True)
    return reason + (f" (until {until})" if until else "") + (f" [{origin}]" if origin else "")


def expand(paths: list[str]) -> list[Source]:
    """The files to read: a directory's ``*.json`` (named after their hosts), and files named as such.
    A file reached twice (the same directory given twice) is read once."""
    out: list[Source] = []
    seen: set[str] = set()
    for raw in paths:
        p = Path(raw)
        found = [Source(q, True) for q in sorted(p.iterdir()) if q.suffix == ".json"] if p.is_dir() else [Source(p, False)]
        for src in found:
            real = os.path.realpath(src.path)
            if real not in seen:
                seen.add(real)
                out.append(src)
    return out


MARKER = ".kvmtune-collection"  # in a fleet directory: {"name": "..."}, the inventory the role collected it for
MAX_NAME = 200


def collection_name(paths: list[str]) -> str:
    """The name a collection is kept under when ``--label`` gives none: each fleet directory's own (its
    :data:`MARKER`, which contrib/ansible writes with the inventory's name), else the directory's real path.
    Files named one by one add nothing: a collection of only those is unnamed ("")."""
    names: list[str] = []
    for raw in paths:
        p = Path(raw)
        if not p.is_dir():
            continue
        marker = p / MARKER
        name = os.path.realpath(p)
        if os.path.lexists(marker):
            doc = _read_json(marker)
            found = doc.get("name") if isinstance(doc, dict) else None
            if not isinstance(found, str) or not found.strip() or len(found) > MAX_NAME:
                raise InputError(str(marker), f"expected {{\"name\": \"...\"}} (1 to {MAX_NAME} characters)")
            name = found.strip()
        if name not in names:
            names.append(name)
    return ", ".join(names)


def read_collection(paths: list[str]) -> tuple[list[HostResult], list[str]]:
    """Every accepted host's result, and one line per file that could not be used (path order)."""
    read: list[HostResult] = []
    problems: list[tuple[str, str]] = []
    for src in expand(paths):
        try:
            read.append(host_result(src.path, src.path.stem if src.in_directory else None))
        except InputError as exc:
            problems.append((str(src.path), str(exc)))
    by_host: dict[str, list[HostResult]] = {}
    for r in read:
        by_host.setdefault(r.host.casefold(), []).append(r)
    hosts: list[HostResult] = []
    for group in by_host.values():
        if len(group) == 1:
            hosts.append(group[0])
            continue
        for r in group:  # which one is the host's own cannot be told: none is used
            others = ", ".join(o.file for o in group if o is not r)
            problems.append((r.file, f"{r.file}: host {r.host!r} comes from {others} too; every file of this host "
                                     "is rejected"))
    return sorted(hosts, key=lambda h: h.host), [line for _, line in sorted(problems, key=lambda p: p[0])]
