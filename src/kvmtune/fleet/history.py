"""Each collection kept in the results database, so the fleet report can say what changed and show trends.

Tables of their own (``fleet_*``) beside the benchmark tables, created when first needed. Only the hosts
the collection accepted are kept, under the name it accepted (``claimed`` when that name is a document's own
claim, not a fleet directory's file name); a rejected file leaves nothing here.

A collection has a name (``label``: ``--label``, else the fleet directory's, see
:func:`kvmtune.fleet.collect.collection_name`) and a scope (host, guests, both, or mixed, from its hosts'
audits); it is only ever compared with, and trended beside, collections of the same name and scope.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvmtune.errors import KvmtuneError
from kvmtune.fleet.collect import FleetFinding, HostResult
from kvmtune.lab.store import Store


@dataclass
class Collection:
    id: int
    created: float
    label: str
    hosts: dict[str, tuple[str, str]]  # host -> (status, problem)
    findings: list[FleetFinding]
    claimed: set[str] = field(default_factory=set)  # hosts named by their document's claim
    scope: str = ""
    scopes: dict[str, str] = field(default_factory=dict)  # host -> what its audit was asked for


class History:
    def __init__(self, path: Path) -> None:
        """Through :class:`~kvmtune.lab.store.Store`: a file that is not a kvmtune results database (views,
        triggers, foreign tables) is refused before anything is written to it."""
        self.store = Store(path)
        self.db = self.store.db
        try:
            self.store.ensure_fleet_tables()
        except sqlite3.DatabaseError as exc:
            self.store.close()
            raise KvmtuneError(f"{path}: cannot use as a results database ({exc})") from None

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def save(self, hosts: list[HostResult], label: str, scope: str) -> int:
        with self.db:
            cur = self.db.execute("INSERT INTO fleet_collections (created, label, scope) VALUES (?, ?, ?)",
                                  (time.time(), label, scope))
            cid = int(cur.lastrowid or 0)
            self.db.executemany(
                "INSERT INTO fleet_hosts (collection, host, status, problem, claimed, scope) VALUES (?, ?, ?, ?, ?, ?)",
                [(cid, h.host, h.status, h.problem, int(h.claimed), h.scope) for h in hosts])
            self.db.executemany(
                "INSERT INTO fleet_findings (collection, host, rule, severity, topic, domain, device, summary, uuid, "
                "waiver) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(cid, f.host, f.rule, f.severity, f.topic, f.domain, f.device, f.summary, f.uuid, f.waiver)
                 for h in hosts for f in h.findings])
        return cid

    def load(self, cid: int) -> Collection:
        row = self.db.execute("SELECT id, created, label, scope FROM fleet_collections WHERE id = ?", (cid,)).fetchone()
        if row is None:
            raise KvmtuneError(f"no fleet collection {cid}")
        rows = self.db.execute("SELECT host, status, problem, claimed, scope FROM fleet_hosts WHERE collection = ?",
                               (cid,)).fetchall()
        hosts = {h: (s, p) for h, s, p, _, _ in rows}
        findings = [FleetFinding(*r) for r in self.db.execute(
            "SELECT host, rule, severity, topic, domain, device, summary, uuid, waiver FROM fleet_findings "
            "WHERE collection = ?", (cid,))]
        return Collection(row[0], row[1], row[2], hosts, findings, {h for h, _, _, c, _ in rows if c}, row[3],
                          {h: sc for h, _, _, _, sc in rows})

    def newest(self, label: str) -> Collection | None:
        """The newest collection of this name, whatever its scope (``audit --new-since db:LABEL``)."""
        row = self.db.execute("SELECT max(id) FROM fleet_collections WHERE label = ?", (label,)).fetchone()
        return self.load(row[0]) if row and row[0] is not None else None

    def previous(self, cid: int | None, label: str, scope: str) -> Collection | None:
        """The newest collection of this name and scope before ``cid`` (``None``: before none, the newest)."""
        row = self.db.execute("SELECT max(id) FROM fleet_collections WHERE id < ? AND label = ? AND scope = ?",
                              (cid if cid is not None else 2**62, label, scope)).fetchone()
        return self.load(row[0]) if row and row[0] is not None else None

    def trend(self, label: str, scope: str, last: int = 10) -> list[tuple[int, float, str, dict[str, int]]]:
        """(collection, created, label, open findings per severity) for the newest ``last`` collections of this
        name and scope (a waived finding is not counted)."""
        rows = self.db.execute("SELECT id, created, label FROM fleet_collections WHERE label = ? AND scope = ? "
                               "ORDER BY id DESC LIMIT ?", (label, scope, last)).fetchall()
        out = []
        for cid, created, name in sorted(rows):
            counts = dict(self.db.execute(
                "SELECT severity, count(*) FROM fleet_findings WHERE collection = ? AND waiver = '' GROUP BY severity",
                (cid,)))
            out.append((cid, created, name, counts))
        return out
