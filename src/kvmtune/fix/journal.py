"""The journal: what was there before kvmtune changed it, written before the first change.

One JSON file per ``fix --apply`` in the journal directory (``/var/lib/kvmtune/journal``,
``$KVMTUNE_JOURNAL_DIR`` or ``--journal-dir``). It holds, per change, the prior state
(file bytes or their absence, runtime values, domain XML, image backup name), the
state after, and whether the change was carried out. It is rewritten atomically
after every change, so a crash leaves a journal ``undo`` can use.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import os
import re
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kvmtune.errors import KvmtuneError
from kvmtune.fix.entries import AnyEntry, entry_from_json
from kvmtune.fix.files import write_atomic

DEFAULT_DIR = "/var/lib/kvmtune/journal"
ENV_DIR = "KVMTUNE_JOURNAL_DIR"
FORMAT = 1
ID_RE = re.compile(r"^[0-9]{8}T[0-9]{6}Z-[0-9a-f]{6}$")
STATES = ("applying", "applied", "failed", "undoing", "undone", "undo-incomplete")


class JournalError(KvmtuneError):
    """A journal that is absent, unreadable or corrupt."""


@contextlib.contextmanager
def locked(directory: Path) -> Iterator[None]:
    """One ``fix --apply`` or ``undo`` at a time per journal directory (an flock, released on exit or crash)."""
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(directory / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise JournalError(f"cannot write the journal in {directory}: {exc.strerror or exc}; nothing changed") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise JournalError(f"another kvmtune fix --apply or undo is running (lock {directory / '.lock'})") from None
        _remove_stray_temps(directory)
        yield
    finally:
        os.close(fd)


def _remove_stray_temps(directory: Path) -> None:
    """A journal being written when kvmtune was killed leaves ``.ID.json.kvmtune-journal.tmp`` (0600, with
    the prior file contents in it). Only a holder of the directory lock writes journals, so under the lock
    every such file is a dead writer's and goes."""
    with contextlib.suppress(OSError):
        for p in directory.glob(".*.kvmtune-journal.tmp"):
            with contextlib.suppress(OSError):
                p.unlink()


def journal_dir(explicit: str | None = None, root: str = "/") -> Path:
    """``--journal-dir``, else ``$KVMTUNE_JOURNAL_DIR``, else the default directory below ``root``:
    a tree's journal stays in the tree, away from the real host's changes in ``undo --list``."""
    if explicit or os.environ.get(ENV_DIR):
        return Path(explicit or os.environ[ENV_DIR])
    return Path(root) / DEFAULT_DIR.lstrip("/")


def new_id() -> str:
    now = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{now}-{secrets.token_hex(3)}"


@dataclass
class Journal:
    id: str
    directory: Path
    argv: list[str] = field(default_factory=list)
    root: str = "/"
    created: str = ""
    state: str = "applying"
    entries: list[AnyEntry] = field(default_factory=list)
    error: str | None = None
    history: list[str] = field(default_factory=list)

    @property
    def path(self) -> Path:
        return self.directory / f"{self.id}.json"

    def to_json(self) -> dict[str, object]:
        return {
            "kvmtune_journal": FORMAT,
            "id": self.id,
            "created": self.created,
            "argv": self.argv,
            "root": self.root,
            "state": self.state,
            "error": self.error,
            "history": self.history,
            "changes": [e.to_json() for e in self.entries],
        }

    def save(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        data = (json.dumps(self.to_json(), indent=1, sort_keys=False) + "\n").encode()
        write_atomic(self.path, data, mode=0o600, tag="journal")

    def log(self, text: str) -> None:
        stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.history.append(f"{stamp} {text}")

    @classmethod
    def create(cls, directory: Path, argv: list[str], root: str) -> Journal:
        j = cls(id=new_id(), directory=directory, argv=list(argv), root=root)
        while j.path.exists():
            j.id = new_id()
        j.created = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return j

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for e in self.entries:
            counts[e.kind] = counts.get(e.kind, 0) + 1
        names = {"file": "file(s)", "runtime": "runtime value(s)", "domain": "domain(s)", "image": "image(s)"}
        return ", ".join(f"{n} {names.get(k, k)}" for k, n in counts.items()) or "nothing"


def load(journal_id: str, directory: Path) -> Journal:
    if not ID_RE.match(journal_id):
        raise JournalError(f"{journal_id!r} is not a journal id (see 'kvmtune undo --list')")
    path = directory / f"{journal_id}.json"
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise JournalError(f"no journal {journal_id} in {directory} (see 'kvmtune undo --list')") from None
    except OSError as exc:
        raise JournalError(f"{path}: cannot read the journal ({exc.strerror})") from None
    try:
        doc = json.loads(raw)
        if not isinstance(doc, dict) or doc.get("kvmtune_journal") != FORMAT:
            raise ValueError("not a kvmtune journal (format 1)")
        if doc.get("id") != journal_id:
            raise ValueError(f"its id is {doc.get('id')!r}")
        if doc.get("state") not in STATES:
            raise ValueError(f"unknown state {doc.get('state')!r}")
        changes = doc.get("changes")
        if not isinstance(changes, list):
            raise ValueError("no list of changes")
        entries = [entry_from_json(e, n) for n, e in enumerate(changes, 1)]
        root = doc.get("root")
        if not isinstance(root, str) or not root.startswith("/"):
            raise ValueError("no absolute root")
    except (ValueError, UnicodeDecodeError) as exc:
        raise JournalError(f"{path}: corrupt journal: {exc}") from None
    return Journal(
        id=journal_id,
        directory=directory,
        argv=list(doc.get("argv") or []),
        root=root,
        created=str(doc.get("created") or ""),
        state=doc["state"],
        entries=entries,
        error=doc.get("error"),
        history=list(doc.get("history") or []),
    )


def list_journals(directory: Path) -> list[tuple[str, Journal | None, str]]:
    """Every journal in ``directory``, oldest first: (id, journal or None, problem)."""
    out: list[tuple[str, Journal | None, str]] = []
    with contextlib.suppress(FileNotFoundError):
        for p in sorted(directory.iterdir()):
            if p.suffix != ".json" or not ID_RE.match(p.stem):
                continue
            try:
                out.append((p.stem, load(p.stem, directory), ""))
            except JournalError as exc:
                out.append((p.stem, None, str(exc)))
    return out
