"""A ``Plan`` is an ordered list of ``Change``s the user sees before anything is written.

Each change knows how to show itself (a unified diff, or ``old → new`` for a
runtime value), how to take a snapshot of what is there now for the journal,
and how to carry itself out. Undo works from the journal alone
(:mod:`kvmtune.fix.undo`), never from these objects.
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from kvmtune.errors import KvmtuneError
from kvmtune.fix.diff import Reason, unified
from kvmtune.fix.files import FileState, make_dirs, read_state, temp_name, write_atomic
from kvmtune.fix.libvirt_rw import Connections

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


def b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text.encode("ascii"), validate=True)


class Change:
    kind: ClassVar[str] = ""
    reasons: list[Reason]
    notes: list[str]

    def title(self) -> str:
        raise NotImplementedError

    def render(self) -> str:
        raise NotImplementedError

    def snapshot(self, ctx: ApplyContext) -> dict[str, Any]:
        """The journal entry: the prior state, read now and checked against the plan."""
        raise NotImplementedError

    def apply(self, entry: dict[str, Any], ctx: ApplyContext) -> None:
        raise NotImplementedError


# --------------------------------------------------------------------------- files


@dataclass
class _FileChange(Change):
    path: Path  # where it is written (below --root for host files)
    shown: str  # how the plan names it
    before: FileState
    after: bytes
    reasons: list[Reason] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    mode: int = 0o644

    def render(self) -> str:
        old = (self.before.data or b"").decode("utf-8", "replace")
        new = self.after.decode("utf-8", "replace")
        a = self.shown if self.before.data is not None else "/dev/null"
        return unified(old, new, a, self.shown, self.reasons)

    def snapshot(self, ctx: ApplyContext) -> dict[str, Any]:
        try:
            now = read_state(self.path)
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
        return {
            "kind": "file",
            "what": self.title(),
            "path": str(self.path),
            "shown": self.shown,
            "prior_b64": b64(now.data),
            "prior_mode": now.mode,
            "prior_uid": now.uid,
            "prior_gid": now.gid,
            "after_sha256": FileState(self.after).sha256,
            "temp": str(temp_name(self.path, ctx.journal.id)),
            "created_dirs": list(reversed(missing)),
            "status": "planned",
        }

    def apply(self, entry: dict[str, Any], ctx: ApplyContext) -> None:
        try:
            make_dirs(self.path.parent)
            mode = self.before.mode if self.before.mode is not None else self.mode
            write_atomic(self.path, self.after, mode=mode, uid=self.before.uid, gid=self.before.gid, tag=ctx.journal.id)
        except OSError as exc:
            raise ApplyError(f"{self.shown}: cannot write ({exc.strerror or exc})") from None


@dataclass
class XmlFileEdit(_FileChange):
    """A domain XML file rewritten in place (atomically)."""

    domain: str = ""

    def title(self) -> str:
        return f"domain {self.domain}: rewrite {self.shown}"


@dataclass
class DropIn(_FileChange):
    """A configuration file kvmtune owns (created, rewritten; undo restores or deletes it)."""

    def title(self) -> str:
        return f"{'create' if self.before.data is None else 'rewrite'} {self.shown}"


# --------------------------------------------------------------------------- libvirt


@dataclass
class XmlEdit(Change):
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

    def title(self) -> str:
        return f"domain {self.name} ({self.uri}): redefine"

    def render(self) -> str:
        label = f"{self.uri}#{self.name}"
        return unified(self.before, self.after, label, label + " (new definition)", self.reasons)

    def _current(self, ctx: ApplyContext) -> tuple[Any, str]:
        from kvmtune.fix.libvirt_rw import inactive_xml, lookup_uuid

        dom = lookup_uuid(ctx.libvirt(self.uri), self.uuid, self.uri)
        return dom, inactive_xml(dom)

    def snapshot(self, ctx: ApplyContext) -> dict[str, Any]:
        _dom, xml = self._current(ctx)
        if xml != self.before:
            raise ApplyError(f"domain {self.name}: its definition changed since the plan was made; run kvmtune fix again")
        return {
            "kind": "domain",
            "what": self.title(),
            "uri": self.uri,
            "name": self.name,
            "uuid": self.uuid,
            "prior_xml": xml,
            "new_xml": self.after,
            "after_xml": None,
            "was_active": self.active,
            "status": "planned",
        }

    def apply(self, entry: dict[str, Any], ctx: ApplyContext) -> None:
        from kvmtune.fix.libvirt_rw import define, inactive_xml

        conn = ctx.libvirt(self.uri)
        dom = define(conn, self.after, f"domain {self.name}")
        entry["after_xml"] = inactive_xml(dom)


# --------------------------------------------------------------------------- runtime values


@dataclass
class SysfsWrite(Change):
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

    @property
    def real(self) -> Path:
        return self.root / self.path.lstrip("/")

    def title(self) -> str:
        return f"write {self.path}"

    def render(self) -> str:
        why = "".join(f"# {r.text}\n" for r in self.reasons)
        return f"{why}{self.path}: {self.prior} → {self.new}\n"

    def snapshot(self, ctx: ApplyContext) -> dict[str, Any]:
        now = read_value(self.real, self.parse)
        if now is None:
            raise ApplyError(f"{self.path}: cannot read it")
        if now != self.prior:
            raise ApplyError(f"{self.path} changed since the plan was made ({self.prior} → {now}); run kvmtune fix again")
        if not os.access(self.real, os.W_OK):
            raise ApplyError(f"{self.path}: not writable (run as root?); nothing changed")
        entry: dict[str, Any] = {
            "kind": "runtime",
            "what": self.title(),
            "path": self.path,
            "real_path": str(self.real),
            "parse": self.parse,
            "prior": now,
            "new": self.new,
            "restore": [[str(self.root / p.lstrip("/")), v, p] for p, v in self.restore],
            "status": "planned",
        }
        if self.root.resolve() != Path("/"):
            # In a tree these are plain files, not sysfs: undo puts back their bytes
            # ("mq-deadline kyber [bfq] none"), where the live kernel takes the value ("bfq").
            entry["tree_prior_b64"] = b64(self.real.read_bytes())
        return entry

    def apply(self, entry: dict[str, Any], ctx: ApplyContext) -> None:
        try:
            write_value(self.real, self.new)
        except OSError as exc:
            raise ApplyError(f"{self.path}: cannot write {self.new!r} ({exc.strerror or exc})") from None
        now = read_value(self.real, self.parse)  # verify, as tuned does: the kernel may clamp or ignore
        if now != normalise(self.new):
            raise ApplyError(f"{self.path}: wrote {self.new!r} but it reads {now!r}")


def normalise(text: str) -> str:
    return " ".join(text.split())


def read_value(path: Path, parse: str = "plain") -> str | None:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
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
    changes: list[Change] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # findings or settings left alone, one line each, with why
    notes: list[str] = field(default_factory=list)
    manual: int = 0  # findings with no automatic fix

    def __bool__(self) -> bool:
        return bool(self.changes)

    def render(self) -> str:
        out: list[str] = []
        for n, change in enumerate(self.changes, 1):
            out.append(f"## {n}. {change.title()}\n")
            out.extend(f"#  note: {note}\n" for note in change.notes)
            out.append(change.render())
            out.append("\n")
        return "".join(out)
