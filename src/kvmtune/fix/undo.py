"""Undo from the journal alone: put back exactly what was there.

Entries are undone in reverse order. A change that was made (or may have been:
not marked done after a crash) is restored; one whose target was changed again
by someone else since is left alone and reported, unless ``force``. Undoing
twice does nothing the second time.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvmtune.errors import KvmtuneError
from kvmtune.fix.files import read_state, remove_file, write_atomic
from kvmtune.fix.journal import Journal
from kvmtune.fix.libvirt_rw import Connections
from kvmtune.fix.plan import normalise, read_value, unb64, write_value
from kvmtune.runner import Runner, default_runner


class UndoConflict(KvmtuneError):
    """The target changed after kvmtune changed it; not restored without --force."""


@dataclass
class UndoContext(Connections):
    runner: Runner
    force: bool = False
    done: list[str] = field(default_factory=list)


def _undo_file(e: dict[str, Any], ctx: UndoContext) -> None:
    path = Path(e["path"])
    prior = unb64(e["prior_b64"])
    with contextlib.suppress(FileNotFoundError):
        os.unlink(e["temp"])  # a temp file left by a crash mid-write
    now = read_state(path)
    if now.data == prior and (prior is None or now.mode == e.get("prior_mode")):
        ctx.done.append(f"{e.get('shown', path)}: already as before")
    else:
        if e["status"] == "done" and now.sha256 != e.get("after_sha256") and not ctx.force:
            raise UndoConflict(f"{e.get('shown', path)} was changed after kvmtune wrote it; not restored (--force)")
        if prior is None:
            remove_file(path)
            ctx.done.append(f"{e.get('shown', path)}: removed (kvmtune created it)")
        else:
            write_atomic(path, prior, mode=e.get("prior_mode") or 0o644, uid=e.get("prior_uid"), gid=e.get("prior_gid"))
            ctx.done.append(f"{e.get('shown', path)}: restored")
    for d in reversed(e.get("created_dirs") or []):
        with contextlib.suppress(OSError):
            os.rmdir(d)  # only if empty


def _undo_runtime(e: dict[str, Any], ctx: UndoContext) -> None:
    real = Path(e["real_path"])
    now = read_value(real, e.get("parse", "plain"))
    tree_prior = unb64(e.get("tree_prior_b64"))
    if tree_prior is not None:  # a captured or fixture tree: its plain files get their bytes back
        _undo_tree_value(e, real, now, tree_prior, ctx)
        return
    if now == e["prior"]:
        ctx.done.append(f"{e['path']}: already {e['prior']}")
        return
    if e["status"] == "done" and now != normalise(e["new"]) and not ctx.force:
        raise UndoConflict(f"{e['path']} is {now}, not the {e['new']} kvmtune wrote; not restored (--force)")
    for target, value, shown in e["restore"]:
        try:
            write_value(Path(target), value)
        except OSError as exc:
            raise KvmtuneError(f"{shown}: cannot write {value!r} ({exc.strerror or exc})") from None
    ctx.done.append(f"{e['path']}: {now} → {read_value(real, e.get('parse', 'plain'))}")


def _undo_tree_value(e: dict[str, Any], real: Path, now: str | None, prior: bytes, ctx: UndoContext) -> None:
    try:
        current = real.read_bytes()
    except OSError:
        current = None
    if current == prior:
        ctx.done.append(f"{e['path']}: already as before")
        return
    if e["status"] == "done" and now != normalise(e["new"]) and not ctx.force:
        raise UndoConflict(f"{e['path']} is {now}, not the {e['new']} kvmtune wrote; not restored (--force)")
    try:
        write_atomic(real, prior, mode=real.stat().st_mode & 0o7777, tag="undo")
    except OSError as exc:
        raise KvmtuneError(f"{real}: cannot restore it ({exc.strerror or exc})") from None
    ctx.done.append(f"{e['path']}: {now} → {e['prior']} (prior bytes of {real})")


def _undo_domain(e: dict[str, Any], ctx: UndoContext) -> None:
    from kvmtune.fix.libvirt_rw import define, inactive_xml, lookup_uuid

    conn = ctx.libvirt(e["uri"])
    dom = lookup_uuid(conn, e["uuid"], e["uri"])
    now = inactive_xml(dom)
    if now == e["prior_xml"]:
        ctx.done.append(f"domain {e['name']}: already as before")
        return
    after = e.get("after_xml")
    if e["status"] == "done" and after is not None and now != after and not ctx.force:
        raise UndoConflict(f"domain {e['name']} was redefined after kvmtune changed it; not restored (--force)")
    define(conn, e["prior_xml"], f"domain {e['name']}")
    back = inactive_xml(lookup_uuid(conn, e["uuid"], e["uri"]))
    if back != e["prior_xml"]:
        raise KvmtuneError(f"domain {e['name']}: redefined, but libvirt's definition differs from the journaled one")
    note = " (running: takes effect at its next start)" if dom.isActive() else ""
    ctx.done.append(f"domain {e['name']}: definition restored{note}")


def _undo_image(e: dict[str, Any], ctx: UndoContext) -> None:
    from kvmtune.fix.images import refuse_if_in_use

    path, backup, temp = Path(e["path"]), Path(e["backup"]), Path(e["temp"])
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temp)
    if e.get("purged"):
        raise KvmtuneError(f"{path}: the original was deleted (--purge-backups); cannot restore it")
    if not backup.exists():
        if e["status"] == "done":
            raise KvmtuneError(f"{path}: its backup {backup} is gone; cannot restore it")
        ctx.done.append(f"{path}: never replaced")
        return
    b = os.stat(backup)
    try:
        p = os.stat(path)
        same = (p.st_dev, p.st_ino) == (b.st_dev, b.st_ino)
    except FileNotFoundError:
        p, same = None, False
    if not same and p is not None and e.get("after_ino") is not None and p.st_ino != e["after_ino"] and not ctx.force:
        raise UndoConflict(f"{path} was replaced after kvmtune converted it; not restored (--force)")
    refuse_if_in_use(path, str(e.get("format") or "raw"), ctx.runner)
    os.replace(backup, path)
    with contextlib.suppress(OSError):
        fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        os.fsync(fd)
        os.close(fd)
    ctx.done.append(f"{path}: original restored" if not same else f"{path}: never replaced")


UNDO: dict[str, Callable[[dict[str, Any], UndoContext], None]] = {
    "file": _undo_file,
    "runtime": _undo_runtime,
    "domain": _undo_domain,
    "image": _undo_image,
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
            if e["status"] == "undone":
                continue
            try:
                UNDO[e["kind"]](e, ctx)
            except (KvmtuneError, OSError) as exc:
                msg = str(exc) if isinstance(exc, KvmtuneError) else f"{e.get('what', e['kind'])}: {exc}"
                problems.append(msg)
                journal.log(f"undo problem: {msg}")
                continue
            e["status"] = "undone"
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
        if e["kind"] != "image" or e.get("purged") or e["status"] == "undone":
            continue
        backup = Path(e["backup"])
        if backup.exists():
            os.unlink(backup)
            out.append(f"{backup}: deleted")
        e["purged"] = True
    if out:
        journal.log(f"purged {len(out)} image backup(s)")
        journal.save()
    return out

