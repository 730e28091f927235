"""Each collection kept in the results database, so the fleet report can say what changed and show trends.

Tables of their own (``fleet_*``) beside the benchmark tables, created when first needed. Only the hosts
the collection accepted are kept, under the name it accepted (``claimed`` when that name is a document's own
claim, not a fleet directory's file name); a rejected file leaves nothing here.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from kvmtune.bench.store import Store
from kvmtune.errors import KvmtuneError
from kvmtune.fleet.collect import FleetFinding, HostResult


@dataclass
class Collection:
    id: int
    created: float
    label: str
    hosts: dict[str, tuple[str, str]]  # host -> (status, problem)
    findings: list[FleetFinding]
    claimed: set[str] = field(default_factory=set)  # hosts named by their document's claim


class History:
    def __init__(self, path: Path) -> None:
        """Through :class:`~kvmtune.bench.store.Store`: a file that is not a kvmtune results database (views,
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

    def save(self, hosts: list[HostResult], label: str) -> int:
        with self.db:
            cur = self.db.execute("INSERT INTO fleet_collections (created, label) VALUES (?, ?)", (time.time(), label))
            cid = int(cur.lastrowid or 0)
            self.db.executemany("INSERT INTO fleet_hosts (collection, host, status, problem, claimed) VALUES (?, ?, ?, ?, ?)",
                                [(cid, h.host, h.status, h.problem, int(h.claimed)) for h in hosts])
            self.db.executemany(
                "INSERT INTO fleet_findings VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(cid, f.host, f.rule, f.severity, f.topic, f.domain, f.device, f.summary)
                 for h in hosts for f in h.findings])
        return cid

    def load(self, cid: int) -> Collection:
        row = self.db.execute("SELECT id, created, label FROM fleet_collections WHERE id = ?", (cid,)).fetchone()
        if row is None:
            raise KvmtuneError(f"no fleet collection {cid}")
        rows = self.db.execute("SELECT host, status, problem, claimed FROM fleet_hosts WHERE collection = ?",
                               (cid,)).fetchall()
        hosts = {h: (s, p) for h, s, p, _ in rows}
        findings = [FleetFinding(*r) for r in self.db.execute(
            "SELECT host, rule, severity, topic, domain, device, summary FROM fleet_findings WHERE collection = ?",
            (cid,))]
        return Collection(row[0], row[1], row[2], hosts, findings, {h for h, _, _, c in rows if c})

    def previous(self, cid: int) -> Collection | None:
        row = self.db.execute("SELECT max(id) FROM fleet_collections WHERE id < ?", (cid,)).fetchone()
        return self.load(row[0]) if row and row[0] is not None else None

    def trend(self, last: int = 10) -> list[tuple[int, float, str, dict[str, int]]]:
        """(collection, created, label, findings per severity) for the newest ``last`` collections."""
        ids = [r[0] for r in self.db.execute("SELECT id FROM fleet_collections ORDER BY id DESC LIMIT ?", (last,))]
        out = []
        for cid in sorted(ids):
            c = self.db.execute("SELECT created, label FROM fleet_collections WHERE id = ?", (cid,)).fetchone()
            counts = dict(self.db.execute(
                "SELECT severity, count(*) FROM fleet_findings WHERE collection = ? GROUP BY severity", (cid,)))
            out.append((cid, c[0], c[1], counts))
        return out
