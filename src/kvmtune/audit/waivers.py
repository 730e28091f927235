"""Waivers and the baseline: which findings a CI gate counts.

A waiver (a settings file's ``[[waiver]]`` or a guest's ``<metadata>``) marks the findings it matches:
they are still computed and shown, counted apart, and never fail ``--fail-on``. An expired waiver stops
waiving and says so; one that matched nothing in a run is stale, said so too (ruff's unused ``noqa``).

A baseline (``audit --new-since FILE``, an earlier JSON report) marks each finding new or not, matched by
rule, host, guest (UUID where both sides know it, else name) and target, never by message text; the
baseline's findings that are gone are listed as resolved.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from fnmatch import fnmatchcase
from typing import Any

from kvmtune.audit.finding import Finding, Waiver
from kvmtune.audit.settings import as_date, waiver_rule
from kvmtune.errors import InputError
from kvmtune.inputs import read_regular
from kvmtune.model.guest import Guest

# A baseline is an earlier report: a 10,000-domain audit's JSON is 148 MiB (measured on the fleet scale bench's
# domains, bench/fleet/audit_scale.py; 105,000 findings, each with its guest's UUID) and takes 645 MiB to read.
# The cap leaves 1.7x that for waivers, baseline marks and longer names (docs/settings.md names it).
MAX_BASELINE_BYTES = 256 * 1024 * 1024


@dataclass
class WaiverNotes:
    """What the waivers did in one run: one line each for the expired and the stale ones."""

    waived: int = 0
    expired: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        return self.expired + self.stale


def _glob(pattern: str | None, *values: str | None) -> bool:
    return pattern is None or any(v is not None and fnmatchcase(v, pattern) for v in values)


def matches(w: Waiver, f: Finding, uuid: str | None) -> bool:
    t = f.target
    if not f.rule.startswith(w.rule):
        return False
    if w.guest_source is not None:  # a guest's own <metadata> waiver: that guest's findings, by name and source
        return t.domain == w.guest and f.source == w.guest_source and _glob(w.target, t.device)
    if w.guest is not None and t.domain is None:
        return False
    return _glob(w.host, t.host) and _glob(w.guest, t.domain, uuid) and _glob(w.target, t.device)


# the rule groups (KVM-STO, KVM-NET, ...): a <metadata> waiver names at least one
_CATEGORY = re.compile(r"KVM-[A-Z]{3}")


def guest_waivers(guests: Iterable[Guest], errors: list[str], notes: list[str] | None = None) -> list[Waiver]:
    """The waivers guests carry in their ``<metadata>`` (kvmtune's namespace), each bound to the guest it came
    from (its name and the file, URI or process it was read from), never a pattern: a guest named ``*`` waives
    its own findings only. A malformed one is an error line naming the guest and is not used; one whose rule
    names less than a category (``KVM-``) is ignored with a line in ``notes``."""
    out: list[Waiver] = []
    for g in guests:
        for i, attrs in enumerate(g.waivers, 1):
            where = f"{g.origin}: <metadata> waiver {i} of guest {g.name}"
            rule, reason = attrs.get("rule", "").strip(), attrs.get("reason", "").strip()
            problem = "no rule attribute" if not rule else "no reason attribute (every waiver says why)" if not reason \
                else None
            if problem is None:
                rule, problem = waiver_rule(rule)  # an id, id prefix or slug, as in a settings file
            expires = as_date(attrs["expires"]) if "expires" in attrs else None
            if problem is None and "expires" in attrs and expires is None:
                problem = f"expires {attrs['expires']!r} is not a date (YYYY-MM-DD)"
            if problem is not None:
                errors.append(f"{where}: {problem}")
                continue
            if not _CATEGORY.match(rule.upper()):
                if notes is not None:
                    notes.append(f"{where}: rule {rule!r} names less than a rule group (KVM-STO, KVM-NET, …); "
                                 "ignored")
                continue
            out.append(Waiver(rule=rule.upper(), reason=reason, host=None, guest=g.name,
                              target=attrs.get("target") or None, expires=expires, by=attrs.get("by") or None,
                              origin=f"<metadata> of {g.name}", guest_source=g.origin))
    return out


def live_waiver(f: Finding, waivers: Sequence[Waiver], guest: Guest | None, today: date) -> Waiver | None:
    """The first waiver, not expired, that matches ``f`` (fix asks this per finding)."""
    uuid = guest.uuid.lower() if guest is not None and guest.uuid else None
    return next((w for w in waivers if matches(w, f, uuid) and (w.expires is None or w.expires >= today)), None)


def apply_waivers(findings: Sequence[Finding], waivers: Sequence[Waiver], guests: Iterable[Guest], *,
                  today: date, host: str, rule_ids: Iterable[str]) -> WaiverNotes:
    """Mark each finding the first live waiver matching it; say which waivers expired or matched nothing.

    A waiver is stale only where it could have matched: its rule among ``rule_ids`` (those that ran) and its
    host glob matching ``host`` (the audited host), so a fleet-wide file is not stale on every other host."""
    guests = list(guests)
    by_source = {(g.name, g.origin): g.uuid.lower() for g in guests if g.uuid}
    names = Counter(g.name for g in guests)
    uuids = {name: uuid for name, uuid in _uuids(guests).items() if names[name] == 1}
    notes = WaiverNotes()
    used: set[int] = set()
    expired_hits: dict[int, int] = {}
    for f in findings:
        # the UUID of the guest the finding is about: by name and source, a name two guests share names neither
        uuid = by_source.get((f.target.domain or "", f.source)) or uuids.get(f.target.domain or "")
        for i, w in enumerate(waivers):
            if not matches(w, f, uuid):
                continue
            if w.expires is not None and w.expires < today:
                expired_hits[i] = expired_hits.get(i, 0) + 1
                continue
            f.waiver = w
            used.add(i)
            notes.waived += 1
            break
    ran = tuple(rule_ids)
    for i, w in enumerate(waivers):
        if w.expires is not None and w.expires < today:
            n = expired_hits.get(i, 0)
            notes.expired.append(f"expired waiver {w.label()}: ended {w.expires.isoformat()}; "
                                 f"{n} finding(s) it matched count again")
        elif i not in used and any(r.startswith(w.rule) for r in ran) and _glob(w.host, host):
            notes.stale.append(f"stale waiver {w.label()}: matched no finding in this run; remove it")
    return notes


def counted(findings: Iterable[Finding]) -> list[Finding]:
    """What ``--fail-on`` judges: not waived, and new when a baseline was given."""
    return [f for f in findings if f.waiver is None and f.new is not False]


# -- the baseline -------------------------------------------------------------------------------------------

Key = tuple[str, str, str, str]


def _uuids(guests: Iterable[Guest]) -> dict[str, str]:
    return {g.name: g.uuid.lower() for g in guests if g.uuid}


def finding_key(f: Finding, uuid: str | None) -> tuple[Key, Key]:
    """(by UUID, by name) keys of a finding; the UUID key is empty-guested when the UUID is unknown."""
    t = f.target
    return (f.rule, t.host, uuid or "", t.device or ""), (f.rule, t.host, t.domain or "", t.device or "")


@dataclass
class Baseline:
    source: str
    entries: list[dict[str, Any]]  # the baseline's findings: rule, target (host, domain, device, uuid)
    # a fleet collection's findings of this one host: matched without the host part (the fleet keeps its
    # inventory name per host, not each finding's target host)
    any_host: bool = False

    def host(self, target: Mapping[str, Any]) -> str:
        return "" if self.any_host else str(target["host"])

    def keys(self) -> tuple[set[Key], set[Key]]:
        by_uuid, by_name = set(), set()
        for e in self.entries:
            t = e["target"]
            if t.get("uuid"):
                by_uuid.add((e["rule"], self.host(t), t["uuid"].lower(), t.get("device") or ""))
            by_name.add((e["rule"], self.host(t), t.get("domain") or "", t.get("device") or ""))
        return by_uuid, by_name


def read_baseline(path: str) -> Baseline:
    """An earlier ``audit --format json`` report; :class:`InputError` (one line) for anything else."""
    raw = read_regular(path, MAX_BASELINE_BYTES, " (a baseline report)")
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(path, f"not a JSON report ({exc})") from None
    except RecursionError:
        raise InputError(path, "JSON nested too deeply to read; not a kvmtune audit report") from None
    except MemoryError:
        raise InputError(path, "too large to read into memory; not used as a baseline") from None
    finally:
        del raw
    if not isinstance(doc, dict) or not isinstance(doc.get("findings"), list) or "schema_version" not in doc:
        raise InputError(path, "not a kvmtune audit JSON report (no schema_version and findings list)")
    entries: list[dict[str, Any]] = []
    for i, e in enumerate(doc["findings"], 1):
        t = e.get("target") if isinstance(e, dict) else None
        if not (isinstance(t, dict) and isinstance(e.get("rule"), str) and isinstance(t.get("host"), str)
                and all(isinstance(t.get(k), str | None) for k in ("domain", "device", "uuid"))):
            raise InputError(path, f"finding {i}: expected a rule and a target with host, domain, device")
        entries.append({"rule": e["rule"], "target": t, "summary": str(e.get("summary", ""))})
    return Baseline(path, entries)


def apply_baseline(findings: Sequence[Finding], baseline: Baseline, guests: Iterable[Guest]) -> list[dict[str, Any]]:
    """Mark each finding new or not; return the baseline's findings this run no longer has (resolved)."""
    uuids = _uuids(guests)
    by_uuid, by_name = baseline.keys()
    seen_uuid: set[Key] = set()
    seen_name: set[Key] = set()
    for f in findings:
        ku, kn = finding_key(f, uuids.get(f.target.domain or ""))
        if baseline.any_host:
            ku, kn = (ku[0], "", ku[2], ku[3]), (kn[0], "", kn[2], kn[3])
        f.new = not ((ku[2] and ku in by_uuid) or kn in by_name)
        if ku[2]:
            seen_uuid.add(ku)
        seen_name.add(kn)
    resolved = []
    for e in baseline.entries:
        t = e["target"]
        ku = (e["rule"], baseline.host(t), (t.get("uuid") or "").lower(), t.get("device") or "")
        kn = (e["rule"], baseline.host(t), t.get("domain") or "", t.get("device") or "")
        if not ((ku[2] and ku in seen_uuid) or kn in seen_name):
            resolved.append(e)
    return resolved


def uuid_of(guests: Iterable[Guest]) -> Mapping[str, str]:
    """Guest name -> UUID (lower case), for reports that key findings by UUID."""
    return _uuids(guests)
