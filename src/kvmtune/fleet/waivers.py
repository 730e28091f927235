"""A fleet-wide waiver file, applied to every host's findings in the fleet report.

The same ``[[waiver]]`` tables as the settings file (``kvmtune report DIR --waivers FILE``, or the settings
file's own): ``rule`` an id or id prefix; ``host``, ``guest`` (name or UUID) and ``target`` globs. A finding its
host already waived keeps that host's waiver; the first live fleet waiver matching any other one waives it. An
expired waiver waives nothing and says so; one that matched no finding of the fleet is stale, said so too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import date
from fnmatch import fnmatchcase
from typing import Protocol

from kvmtune.fleet.collect import FleetFinding, HostResult


class Waiver(Protocol):
    """What the fleet needs of a waiver (:class:`kvmtune.audit.finding.Waiver`, read by the settings reader)."""

    @property
    def rule(self) -> str: ...
    @property
    def reason(self) -> str: ...
    @property
    def host(self) -> str | None: ...
    @property
    def guest(self) -> str | None: ...
    @property
    def target(self) -> str | None: ...
    @property
    def expires(self) -> date | None: ...
    @property
    def origin(self) -> str: ...
    def label(self) -> str: ...


def _glob(pattern: str | None, *values: str) -> bool:
    return pattern is None or any(v and fnmatchcase(v, pattern) for v in values)


def matches(w: Waiver, f: FleetFinding) -> bool:
    if not f.rule.startswith(w.rule) or (w.guest is not None and not f.domain):
        return False
    return _glob(w.host, f.host) and _glob(w.guest, f.domain, f.uuid) and _glob(w.target, f.device)


def describe(w: Waiver) -> str:
    """What the report shows for a finding this waiver accepted: why, until when, where it was written."""
    return w.reason + (f" (until {w.expires.isoformat()})" if w.expires else "") + f" [fleet {w.origin}]"


def apply(hosts: Sequence[HostResult], waivers: Sequence[Waiver], today: date) -> list[str]:
    """Waive the matching open findings of every audited host; one line per expired or stale waiver."""
    used: set[int] = set()
    expired_hits: dict[int, int] = {}
    for h in hosts:
        for n, f in enumerate(h.findings):
            if f.waiver:
                continue
            for i, w in enumerate(waivers):
                if not matches(w, f):
                    continue
                if w.expires is not None and w.expires < today:
                    expired_hits[i] = expired_hits.get(i, 0) + 1
                    continue
                h.findings[n] = dataclasses.replace(f, waiver=describe(w))
                used.add(i)
                break
    notes = []
    for i, w in enumerate(waivers):
        if w.expires is not None and w.expires < today:
            notes.append(f"expired waiver {w.label()}: ended {w.expires.isoformat()}; "
                         f"{expired_hits.get(i, 0)} finding(s) it matched count again")
        elif i not in used:
            notes.append(f"stale waiver {w.label()}: matched no finding of this fleet; remove it")
    return notes
