"""Undo from the journal alone: put back exactly what was there.

Entries are undone in reverse order. A change that was made (or may have been:
not marked done after a crash) is restored; one whose target was changed again
by someone else since is left alone and reported, unless ``force``. Undoing
twice does nothing the second time.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvmtune.errors import KvmtuneError
from kvmtune.fix.entries import DomainEntry, FileEntry, ImageEntry, RuntimeEntry
from kvmtune.fix.images import ImageConvert
from kvmtune.fix.journal import Journal
from kvmtune.fix.plan import FileChange, SysfsWrite, UndoConflict, UndoContext, XmlEdit
from kvmtune.runner import Runner, default_runner

__all__ = ["UndoConflict", "UndoContext", "purge_backups", "undo_journal"]

# each kind of change undoes its own entries (the entry's type says which)
UNDO: dict[type, Callable[[Any, UndoContext], None]] = {
    FileEntry: FileChange.undo,
    RuntimeEntry: SysfsWrite.undo,
    DomainEntry: XmlEdit.undo,
    ImageEntry: ImageConvert.undo,
}


def undo_journal(journal: Journal, *, force: bool = False, runner: Runner | None = None) -> tuple[list[str], list[str]]:
    """Undo every change of ``journal``; returns (what was done, problems)."""
    ctx = UndoContext(runner=runner or default_runner(), force=force)
    problems: list[str] = []
    journal.state = "undoing"
    journal.log("undo started" + (" (--force)" if force else ""))
    journal.save()
    try:
        for e in reversed(journal.entries):
            if e.status == "undone":
                continue
            try:
                UNDO[type(e)](e, ctx)
            except (KvmtuneError, OSError) as exc:
                msg = str(exc) if isinstance(exc, KvmtuneError) else f"{e.what or e.kind}: {exc}"
                problems.append(msg)
                journal.log(f"undo problem: {msg}")
                continue
            e.status = "undone"
            journal.save()
    finally:
        ctx.close()
    journal.state = "undone" if not problems else "undo-incomplete"
    journal.log(journal.state)
    journal.save()
    return ctx.done, problems


def purge_backups(journal: Journal) -> list[str]:
    """Delete the image originals a journal keeps; its image changes can no longer be undone."""
    out = []
    for e in journal.entries:
        if not isinstance(e, ImageEntry) or e.purged or e.status == "undone":
            continue
        backup = Path(e.backup)
        if backup.exists():
            os.unlink(backup)
            out.append(f"{backup}: deleted")
        e.purged = True
    if out:
        journal.log(f"purged {len(out)} image backup(s)")
        journal.save()
    return out

