"""A ``Plan`` is an ordered list of ``Change``s the user sees before anything is written.

Each kind of change owns its whole life: how it shows itself (a unified diff, or
``old → new`` for a runtime value), its snapshot of what is there now (a typed
journal entry, :mod:`kvmtune.fix.entries`, checked against the plan), how it is
carried out and checked, and how it is undone from its journal entry alone
(``undo``, a static method: undo never has the plan, only the journal).
:mod:`kvmtune.fix.undo` just walks a journal backwards and calls them.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from kvmtune.errors import KvmtuneError
from kvmtune.fix.diff import Reason, unified
from kvmtune.fix.effect import Planned, TakesEffect, latest
from kvmtune.fix.encoding import decode_text
from kvmtune.fix.entries import DomainEntry, Entry, FileEntry, Restore, RuntimeEntry
from kvmtune.fix.files import (
    FileState,
    dir_identity,
    make_dirs,
    open_dir,
    read_state,
    remove_file,
    temp_name,
    write_atomic,
)
from kvmtune.fix.libvirt_rw import Connections
from kvmtune.host.root import HostReadError, HostRoot

if TYPE_CHECKING:
    from kvmtune.fix.journal import Journal
    from kvmtune.runner import Runner


class ApplyError(KvmtuneError):
    """One change could not be made; nothing of it was written."""


@dataclass
class ApplyContext(Connections):
    journal: Journal
    runner: Runner
    purge_backups: bool = False
    dir_fds: list[int] = field(default_factory=list, kw_only=True, repr=False)  # held from snapshot to apply

    def close(self) -> None:
        super().close()
        for fd in self.dir_fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.dir_fds.clear()


class UndoConflict(KvmtuneError):
    """The target changed after kvmtune changed it; not restored without --force."""


@dataclass
class UndoContext(Connections):
    runner: Runner
    force: bool = False
    done: list[str] = field(default_factory=list)


E = TypeVar("E", bound=Entry)


class Change(Generic[E]):
    kind: ClassVar[str] = ""
    reasons: list[Reason]
    notes: list[str]
    planned: list[Planned]  # what it answers, each with when it takes effect (fix/effect.py)

    def title(self) -> str:
        raise NotImplementedError

    def takes_effect(self) -> TakesEffect:
        """The change's one word: the latest any of its items takes effect."""
        return latest(p.takes_effect for p in self.planned)

    def effect_line(self) -> str:
        """``restart``, or ``restart (KVM-NET-003 net0: live)`` where items differ from the change's word."""
        word = self.takes_effect()
        odd = [f"{p.rule} {p.target}: {p.takes_effect}" for p in self.planned if p.takes_effect != word]
        return word + (f" ({'; '.join(dict.fromkeys(odd))})" if odd else "")

    def render(self) -> str:
        raise NotImplementedError

    def lock_paths(self) -> list[Path]:
        """Files this change replaces: locked for the whole apply (see :func:`files.lock_target`)."""
        return []

    def snapshot(self, ctx: ApplyContext) -> E:
        """The journal entry: the prior state, read now and checked against the plan."""
        raise NotImplementedError

    def apply(self, entry: E, ctx: ApplyContext) -> None:
        """Make the change (and check it took); ``entry`` is what ``snapshot`` returned."""
        raise NotImplementedError


# --------------------------------------------------------------------------- files


@dataclass
class FileChange(Change[FileEntry]):
    path: Path  # where it is written (below --root for host files)
    shown: str  # how the plan names it
    before: FileState
    after: bytes
    reasons: list[Reason] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    planned: list[Planned] = field(default_factory=list)
    mode: int = 0o644
    # (st_dev, st_ino) of the directory the plan read the file in (None: not recorded, or not there yet)
    dir_id: tuple[int, int] | None = None
    _dir_fd: int | None = field(default=None, init=False, repr=False, compare=False)

    def render(self) -> str:
        old = decode_text(self.before.data or b"")
        new = decode_text(self.after)
        a = self.shown if self.before.data is not None else "/dev/null"
        return unified(old, new, a, self.shown, self.reasons)

    def lock_paths(self) -> list[Path]:
        return [self.path]

    def _open_dir(self, ctx: ApplyContext) -> int | None:
        """The file's directory, opened once for the snapshot and the write (``None``: not there yet, created by
        apply). It must be the directory the plan read the file in: a directory another user can change above the
        file could otherwise be swapped for a link between the plan, the snapshot and the write, and the write land
        in whatever directory the link names, with the file's old owner."""
        parent = self.path.parent
        try:
            fd = open_dir(parent)
        except FileNotFoundError:
            if self.dir_id is not None:
                raise ApplyError(f"{self.shown}: its directory {parent} is gone since the plan was made; nothing "
                                 "changed") from None
            return None
        except OSError as exc:
            raise ApplyError(f"{self.shown}: {parent}: {exc.strerror or exc}") from None
        ctx.dir_fds.append(fd)
        if self.dir_id is not None and dir_identity(fd) != self.dir_id:
            raise ApplyError(f"{self.shown}: {parent} is not the directory the plan read it in (replaced, or a "
                             "symbolic link put on the way since); nothing changed")
        return fd

    def snapshot(self, ctx: ApplyContext) -> FileEntry:
        self._dir_fd = self._open_dir(ctx)
        try:
            now = read_state(self.path, dir_fd=self._dir_fd)
        except OSError as exc:
            raise ApplyError(f"{self.shown}: {exc}") from None
        if now.data != self.before.data:
            raise ApplyError(f"{self.shown} changed since the plan was made; run kvmtune fix again")
        missing: list[str] = []
        p = self.path.parent
        while not p.exists():
            missing.append(str(p))
            p = p.parent
        if not os.access(p, os.W_OK):
            raise ApplyError(f"{self.shown}: {p} is not writable (run as root?); nothing changed")
        entry = FileEntry(
            what=self.title(), path=str(self.path), shown=self.shown, prior=now.data, prior_mode=now.mode,
            prior_uid=now.uid, prior_gid=now.gid, after_sha256=FileState(self.after).sha256,
            temp=str(temp_name(self.path, ctx.journal.id)), created_dirs=list(reversed(missing)),
        )
        if self._dir_fd is not None:
            entry.dir_dev, entry.dir_ino = dir_identity(self._dir_fd)
        return entry

    def apply(self, entry: FileEntry, ctx: ApplyContext) -> None:
        try:
            if self._dir_fd is None:  # its directory created now: recorded as it is once made
                make_dirs(self.path.parent)
                self._dir_fd = open_dir(self.path.parent)
                ctx.dir_fds.append(self._dir_fd)
                entry.dir_dev, entry.dir_ino = dir_identity(self._dir_fd)
            mode = self.before.mode if self.before.mode is not None else self.mode
            write_atomic(self.path, self.after, mode=mode, uid=self.before.uid, gid=self.before.gid, tag=ctx.journal.id,
                         dir_fd=self._dir_fd)  # the directory the snapshot read: never one swapped in since
        except OSError as exc:
            raise ApplyError(f"{self.shown}: cannot write ({exc.strerror or exc})") from None

    @staticmethod
    def undo(e: FileEntry, ctx: UndoContext) -> None:
        path = Path(e.path)
        dir_fd = _written_dir(e)
        try:
            if dir_fd is None and e.dir_dev is not None:  # its directory is gone, and the file with it
                ctx.done.append(f"{e.shown}: already as before" if e.prior is None else
                                f"{e.shown}: its directory {path.parent} is gone; nothing to restore it in")
                return
            with contextlib.suppress(FileNotFoundError):
                os.unlink(Path(e.temp).name if dir_fd is not None else e.temp, dir_fd=dir_fd)  # left by a crash
            now = read_state(path, dir_fd=dir_fd)
            if now.data == e.prior and (e.prior is None or now.mode == e.prior_mode):
                ctx.done.append(f"{e.shown}: already as before")
            else:
                if e.status == "done" and now.sha256 != e.after_sha256 and not ctx.force:
                    raise UndoConflict(f"{e.shown} was changed after kvmtune wrote it; not restored (--force)")
                if e.prior is None:
                    remove_file(path, dir_fd=dir_fd)
                    ctx.done.append(f"{e.shown}: removed (kvmtune created it)")
                else:
                    # mode 000 is a mode too: only a missing one falls back to 0644
                    mode = e.prior_mode if e.prior_mode is not None else 0o644
                    write_atomic(path, e.prior, mode=mode, uid=e.prior_uid, gid=e.prior_gid, dir_fd=dir_fd)
                    ctx.done.append(f"{e.shown}: restored")
        finally:
            if dir_fd is not None:
                os.close(dir_fd)
        for d in reversed(e.created_dirs):
            with contextlib.suppress(OSError):
                os.rmdir(d)  # only if empty


def _written_dir(e: FileEntry) -> int | None:
    """The directory ``e``'s file was written in, opened (``O_PATH``), checked to be that very directory: undo
    restores there or nowhere. A directory on the way that another user can change could otherwise be swapped for
    a link between the fix and its undo, and the old bytes, owner and mode written wherever the link names.
    ``None``: gone, or a journal from before the directory was recorded (its path as it is now)."""
    if e.dir_dev is None or e.dir_ino is None:
        return None
    parent = Path(e.path).parent
    try:
        fd = open_dir(parent)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UndoConflict(f"{e.shown}: {parent}: {exc.strerror or exc}; not restored") from None
    if dir_identity(fd) != (e.dir_dev, e.dir_ino):
        os.close(fd)
        raise UndoConflict(f"{e.shown}: {parent} is not the directory kvmtune wrote it in (replaced, or a symbolic "
                           "link put on the way since); not restored (restore it by hand if that was on purpose)")
    return fd


@dataclass
class XmlFileEdit(FileChange):
    """A domain XML file rewritten in place (atomically)."""

    domain: str = ""

    def title(self) -> str:
        return f"domain {self.domain}: rewrite {self.shown}"


@dataclass
class DropIn(FileChange):
    """A configuration file kvmtune owns (created, rewritten; undo restores or deletes it)."""

    def title(self) -> str:
        return f"{'create' if self.before.data is None else 'rewrite'} {self.shown}"


# --------------------------------------------------------------------------- libvirt


@dataclass
class XmlEdit(Change[DomainEntry]):
    """A libvirt domain's persistent definition replaced with ``defineXML``."""

    kind: ClassVar[str] = "domain"
    uri: str
    name: str
    uuid: str
    before: str
    after: str
    active: bool
    reasons: list[Reason] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    planned: list[Planned] = field(default_factory=list)

    def title(self) -> str:
        return f"domain {self.name} ({self.uri}): redefine"

    def render(self) -> str:
        label = f"{self.uri}#{self.name}"
        return unified(self.before, self.after, label, label + " (new definition)", self.reasons)

    def _current(self, ctx: ApplyContext) -> tuple[Any, str]:
        from kvmtune.fix.libvirt_rw import inactive_xml, lookup_uuid

        dom = lookup_uuid(ctx.libvirt(self.uri), self.uuid, self.uri)
        return dom, inactive_xml(dom)

    def snapshot(self, ctx: ApplyContext) -> DomainEntry:
        _dom, xml = self._current(ctx)
        if xml != self.before:
            raise ApplyError(f"domain {self.name}: its definition changed since the plan was made; run kvmtune fix again")
        return DomainEntry(
            what=self.title(), uri=self.uri, name=self.name, uuid=self.uuid, prior_xml=xml, new_xml=self.after,
            was_active=self.active,
        )

    def apply(self, entry: DomainEntry, ctx: ApplyContext) -> None:
        from kvmtune.fix.libvirt_rw import define, inactive_xml

        conn = ctx.libvirt(self.uri)
        dom = define(conn, self.after, f"domain {self.name}")
        entry.after_xml = inactive_xml(dom)

    @staticmethod
    def undo(e: DomainEntry, ctx: UndoContext) -> None:
        from kvmtune.fix.libvirt_rw import define, inactive_xml, lookup_uuid

        conn = ctx.libvirt(e.uri)
        dom = lookup_uuid(conn, e.uuid, e.uri)
        now = inactive_xml(dom)
        if now == e.prior_xml:
            ctx.done.append(f"domain {e.name}: already as before")
            return
        if e.status == "done" and e.after_xml is not None and now != e.after_xml and not ctx.force:
            raise UndoConflict(f"domain {e.name} was redefined after kvmtune changed it; not restored (--force)")
        define(conn, e.prior_xml, f"domain {e.name}")
        back = inactive_xml(lookup_uuid(conn, e.uuid, e.uri))
        if back != e.prior_xml:
            raise KvmtuneError(f"domain {e.name}: redefined, but libvirt's definition differs from the journaled one")
        note = " (running: takes effect at its next start)" if dom.isActive() else ""
        ctx.done.append(f"domain {e.name}: definition restored{note}")


# --------------------------------------------------------------------------- runtime values


@dataclass
class SysfsWrite(Change[RuntimeEntry]):
    """A runtime value in /proc/sys or /sys, written now (the drop-in makes it last)."""

    kind: ClassVar[str] = "runtime"
    path: str  # host path, e.g. /proc/sys/vm/swappiness
    root: Path  # --root: the value is written at root/path
    prior: str  # current value as read (normalised)
    new: str
    restore: list[tuple[str, str]]  # host path, value: what undo writes, in order
    parse: str = "plain"  # plain | bracket (the [selected] word of a choice list) | mask (hex CPU mask)
    reasons: list[Reason] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    planned: list[Planned] = field(default_factory=list)

    @property
    def real(self) -> Path:
        return self.root / self.path.lstrip("/")

    def title(self) -> str:
        return f"write {self.path}"

    def render(self) -> str:
        why = "".join(f"# {r.text}\n" for r in self.reasons)
        return f"{why}{self.path}: {self.prior} → {self.new}\n"

    def snapshot(self, ctx: ApplyContext) -> RuntimeEntry:
        now = read_value(self.real, self.parse)
        if now is None:
            raise ApplyError(f"{self.path}: cannot read it")
        if now != self.prior:
            raise ApplyError(f"{self.path} changed since the plan was made ({self.prior} → {now}); run kvmtune fix again")
        if not os.access(self.real, os.W_OK):
            raise ApplyError(f"{self.path}: not writable (run as root?); nothing changed")
        # In a tree these are plain files, not sysfs: undo puts back their bytes
        # ("mq-deadline kyber [bfq] none"), where the live kernel takes the value ("bfq").
        # A tree entry that leads into the live /sys or /proc is the kernel's value, restored as such.
        in_tree = self.root.resolve() != Path("/") and not kernel_attribute(self.real)
        tree_prior = read_value_bytes(self.real) if in_tree else None
        if in_tree and tree_prior is None:
            raise ApplyError(f"{self.path}: cannot read it")
        return RuntimeEntry(
            what=self.title(), path=self.path, real_path=str(self.real), parse=self.parse, prior=now, new=self.new,
            restore=[Restore(str(self.root / p.lstrip("/")), v, p) for p, v in self.restore], tree_prior=tree_prior,
        )

    def apply(self, entry: RuntimeEntry, ctx: ApplyContext) -> None:
        try:
            HostRoot(str(self.root)).beneath(self.path)  # again: the tree may have changed since the plan
        except HostReadError as exc:
            raise ApplyError(f"{exc}; nothing written") from None
        try:
            write_value(self.real, self.new)
        except OSError as exc:
            raise ApplyError(f"{self.path}: cannot write {self.new!r} ({exc.strerror or exc})") from None
        now = read_value(self.real, self.parse)  # verify, as tuned does: the kernel may clamp or ignore
        if now != normalise(self.new):
            raise ApplyError(f"{self.path}: wrote {self.new!r} but it reads {now!r}")

    @staticmethod
    def undo(e: RuntimeEntry, ctx: UndoContext) -> None:
        real = Path(e.real_path)
        now = read_value(real, e.parse)
        if e.tree_prior is not None:  # a captured or fixture tree: its plain files get their bytes back
            _undo_tree_value(e, real, now, e.tree_prior, ctx)
            return
        if now == e.prior:
            ctx.done.append(f"{e.path}: already {e.prior}")
            return
        if e.status == "done" and now != normalise(e.new) and not ctx.force:
            raise UndoConflict(f"{e.path} is {_shown(now)}, not the {e.new} kvmtune wrote; not restored (--force)")
        for r in e.restore:
            try:
                write_value(Path(r.target), r.value)
            except OSError as exc:
                raise KvmtuneError(f"{r.shown}: cannot write {r.value!r} ({exc.strerror or exc})") from None
        ctx.done.append(f"{e.path}: {now} → {read_value(real, e.parse)}")


def _undo_tree_value(e: RuntimeEntry, real: Path, now: str | None, prior: bytes, ctx: UndoContext) -> None:
    current = read_value_bytes(real)
    if current == prior:
        ctx.done.append(f"{e.path}: already as before")
        return
    if e.status == "done" and now != normalise(e.new) and not ctx.force:
        raise UndoConflict(f"{e.path} is {_shown(now)}, not the {e.new} kvmtune wrote; not restored (--force)")
    try:
        write_atomic(real, prior, mode=real.stat().st_mode & 0o7777, tag="undo")
    except OSError as exc:
        raise KvmtuneError(f"{real}: cannot restore it ({exc.strerror or exc})") from None
    ctx.done.append(f"{e.path}: {now} → {e.prior} (prior bytes of {real})")


def kernel_attribute(path: Path) -> bool:
    """True when ``path`` is a sysfs or procfs attribute (same file system as the live /sys or /proc), however it is
    reached: a tree may mount the live kernel's attributes into itself (a bind mount); those take a value, not bytes."""
    try:
        dev = os.stat(path).st_dev
        return dev in {os.stat("/sys").st_dev, os.stat("/proc").st_dev}
    except OSError:
        return False


def normalise(text: str) -> str:
    return " ".join(text.split())


# a kernel value (a sysfs attribute's show(), a /proc/sys number, word or CPU mask) fits in a page: a file that holds
# more, in a tree anyone may have written, is not one, and is not read whole
MAX_VALUE_BYTES = 4096


def read_value_bytes(path: Path) -> bytes | None:
    """At most :data:`MAX_VALUE_BYTES` of a value file, through :class:`HostRoot` (a regular file opened ``O_NONBLOCK``:
    a FIFO a tree holds is refused, not waited on); ``None`` when it cannot be read or holds more."""
    data = HostRoot("/").read_bytes(os.path.abspath(path), limit=MAX_VALUE_BYTES + 1)
    return data if data is not None and len(data) <= MAX_VALUE_BYTES else None


def _shown(value: str | None) -> str:
    return value if value is not None else f"no value kvmtune reads (not a regular file of at most {MAX_VALUE_BYTES} bytes)"


def read_value(path: Path, parse: str = "plain") -> str | None:
    data = read_value_bytes(path)
    if data is None:
        return None
    text = data.decode("utf-8", errors="replace")
    if parse == "mask":  # a CPU mask: the kernel shows 00000000,0000000f for the f written
        try:
            return f"{int(text.strip().replace(',', ''), 16):x}"
        except ValueError:
            return normalise(text)
    if parse == "bracket":
        for word in text.split():
            if word.startswith("[") and word.endswith("]"):
                return word[1:-1]
        words = text.split()
        return words[0] if len(words) == 1 else normalise(text)
    return normalise(text)


def write_value(path: Path, value: str) -> None:
    """Write a sysfs/procfs value the way ``echo value > file`` does (no temp file: these are not files)."""
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
    try:
        os.write(fd, (value + "\n").encode())
    finally:
        os.close(fd)


# --------------------------------------------------------------------------- plan


@dataclass
class Plan:
    changes: list[Change[Any]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # findings or settings left alone, one line each, with why
    notes: list[str] = field(default_factory=list)
    manual: int = 0  # findings with no automatic fix
    refused: list[str] = field(default_factory=list)  # inputs or edits refused (also in skipped): fix exits 3

    def __bool__(self) -> bool:
        return bool(self.changes)

    def render(self) -> str:
        out: list[str] = []
        for n, change in enumerate(self.changes, 1):
            out.append(f"## {n}. {change.title()}\n")
            out.append(f"#  takes effect: {change.effect_line()}\n")
            out.extend(f"#  note: {note}\n" for note in change.notes)
            out.append(change.render())
            out.append("\n")
        return "".join(out)

    def to_json(self) -> dict[str, Any]:
        """``fix --format json``: every planned item with when it takes effect, then what was left alone."""
        return {
            "changes": [{"change": n, **p.to_json()} for n, c in enumerate(self.changes, 1) for p in c.planned],
            "skipped": list(self.skipped),
            "notes": list(self.notes),
            "manual": self.manual,
        }
