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
from kvmtune.fix.entries import DomainEntry, FileEntry, ImageEntry, KubectlEntry, LiveEntry, QmEntry, RuntimeEntry
from kvmtune.fix.images import ImageConvert
from kvmtune.fix.journal import Journal
from kvmtune.fix.kubevirt import KubectlPatch
from kvmtune.fix.live import LiveSet
from kvmtune.fix.plan import FileChange, SysfsWrite, UndoConflict, UndoContext, XmlEdit
from kvmtune.fix.pve import QmSet
from kvmtune.runner import Runner, default_runner

__all__ = ["UndoConflict", "UndoContext", "purge_backups", "undo_journal"]

# each kind of change undoes its own entries (the entry's type says which)
UNDO: dict[type, Callable[[Any, UndoContext], None]] = {
    FileEntry: FileChange.undo,
    RuntimeEntry: SysfsWrite.undo,
    DomainEntry: XmlEdit.undo,
    ImageEntry: ImageConvert.undo,
    QmEntry: QmSet.undo,
    KubectlEntry: KubectlPatch.undo,
    LiveEntry: LiveSet.undo,
}


def undo_journal(journal: Journal, *, force: bool = False, runner: Runner | None = None) -> tuple[list[str], list[str]]:
    """Undo every change of ``journal``; returns (what was done, problems)."""
    ctx = UndoContext(runner=runner or default_runner(), force=force)
    problems: list[str] = []
    unsaved: list[OSError] = []

    def record() -> None:
        # restore first, record after: a journal file system that is full (ENOSPC) must not stop the
        # restores; undo is idempotent, so a journal that could not say "undone" is only out of date
        try:
            journal.save()
        except OSError as exc:
            unsaved.append(exc)

    journal.state = "undoing"
    journal.log("undo started" + (" (--force)" if force else ""))
    record()
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
            record()
    finally:
        ctx.close()
    journal.state = "undone" if not problems else "undo-incomplete"
    journal.log(journal.state)
    unsaved.clear()
    record()
    if unsaved:
        problems.append(
            f"the journal {journal.path} could not be updated ({unsaved[0].strerror or unsaved[0]}); what is listed "
            f"above was restored, but the journal does not say so: free space there and run 'kvmtune undo "
            f"{journal.id}' again (it finds those changes already undone)"
        )
    return ctx.done, problems


def purge_backups(journal: Journal) -> list[str]:
    """Delete the image originals a journal keeps; its image changes can no longer be undone."""
    out = []
    for e in journal.entries:
        if not isinstance(e, ImageEntry) or e.purged:
            continue
        backup = Path(e.backup)
        if e.status == "undone":
            if _same_file(backup, Path(e.path)):  # an orphan link left by a crash before the swap
                os.unlink(backup)
                out.append(f"{backup}: deleted (a second name of {e.path} left by an interrupted fix)")
            continue
        if backup.exists():
            os.unlink(backup)
            out.append(f"{backup}: deleted")
        e.purged = True
    if out:
        journal.log(f"purged {len(out)} image backup(s)")
        journal.save()
    return out



def _same_file(a: Path, b: Path) -> bool:
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)
