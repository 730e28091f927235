"""Journal entries: one typed record per kind of change, the only shape a journal holds.

A change's ``snapshot`` builds its entry (:mod:`kvmtune.fix.plan`,
:mod:`kvmtune.fix.images`), ``apply`` fills in what it learns while making the
change, the journal stores ``to_json()`` and reads back ``entry_from_json()``
(which refuses anything malformed with one line), and the change kind's ``undo``
reads the entry's fields. The JSON keys are those of journal format 1, so journals
written before these types existed are still undone.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import ClassVar

from kvmtune.fix.effect import Planned, TakesEffect, parse

STATUSES = ("planned", "done", "failed", "undone")


def b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode("ascii")


def unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text.encode("ascii"), validate=True)


class _Reader:
    """Typed access to one JSON object of the journal; every problem is a ValueError naming the change."""

    def __init__(self, doc: dict[str, object], label: str) -> None:
        self.doc = doc
        self.label = label

    def bad(self, key: str, what: str) -> ValueError:
        return ValueError(f"{self.label} has {what} {key!r}")

    def text(self, key: str) -> str:
        value = self.doc.get(key)
        if not isinstance(value, str):
            raise ValueError(f"{self.label} has no {key!r} string")
        return value

    def opt_text(self, key: str) -> str | None:
        value = self.doc.get(key)
        if value is not None and not isinstance(value, str):
            raise self.bad(key, "a non-string")
        return value

    def opt_int(self, key: str) -> int | None:
        value = self.doc.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise self.bad(key, "a non-integer")
        return value

    def flag(self, key: str) -> bool:
        value = self.doc.get(key, False)
        if not isinstance(value, bool):
            raise self.bad(key, "a non-boolean")
        return value

    def texts(self, key: str) -> list[str]:
        value = self.doc.get(key, [])
        if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
            raise self.bad(key, "a bad")
        return list(value)

    def blob(self, key: str, *, missing_ok: bool = True) -> bytes | None:
        if key not in self.doc and not missing_ok:
            raise ValueError(f"{self.label} has no prior content")
        value = self.doc.get(key)
        if value is None:
            return None
        if not isinstance(value, str):
            raise ValueError(f"{self.label} has no prior content")
        try:
            return unb64(value)
        except (ValueError, UnicodeEncodeError, binascii.Error):
            raise ValueError(f"{self.label} has undecodable prior content") from None


@dataclass
class Entry:
    """What every entry has: a title, and how far the change got."""

    kind: ClassVar[str] = ""
    what: str
    status: str = "planned"  # planned | done | failed | undone
    error: str | None = None
    # when the change takes effect (fix/effect.py) and what it answers; None in journals written before it
    takes_effect: TakesEffect | None = None
    planned: list[Planned] = field(default_factory=list)

    def _common(self) -> dict[str, object]:
        out: dict[str, object] = {"kind": self.kind, "what": self.what, "status": self.status}
        if self.error is not None:
            out["error"] = self.error
        if self.takes_effect is not None:
            out["takes_effect"] = self.takes_effect
            out["planned"] = [p.to_json() for p in self.planned]
        return out

    def to_json(self) -> dict[str, object]:
        raise NotImplementedError

    @staticmethod
    def _status(r: _Reader) -> str:
        status = r.text("status")
        if status not in STATUSES:
            raise ValueError(f"{r.label} has unknown status {status!r}")
        return status


@dataclass
class FileEntry(Entry):
    """A file written atomically (domain XML, a drop-in): its prior bytes, or that it did not exist."""

    kind: ClassVar[str] = "file"
    path: str = ""
    shown: str = ""
    prior: bytes | None = None  # None: the file did not exist
    prior_mode: int | None = None
    prior_uid: int | None = None
    prior_gid: int | None = None
    after_sha256: str | None = None
    temp: str = ""
    created_dirs: list[str] = field(default_factory=list)  # outermost first
    # (st_dev, st_ino) of the directory the file was written in: undo writes there or nowhere (None: a journal
    # from before kvmtune recorded it)
    dir_dev: int | None = None
    dir_ino: int | None = None

    def to_json(self) -> dict[str, object]:
        return {
            **self._common(), "path": self.path, "shown": self.shown, "prior_b64": b64(self.prior),
            "prior_mode": self.prior_mode, "prior_uid": self.prior_uid, "prior_gid": self.prior_gid,
            "after_sha256": self.after_sha256, "temp": self.temp, "created_dirs": self.created_dirs,
            "dir_dev": self.dir_dev, "dir_ino": self.dir_ino,
        }

    @classmethod
    def from_json(cls, r: _Reader) -> FileEntry:
        return cls(
            what=r.opt_text("what") or "", status=cls._status(r), error=r.opt_text("error"),
            path=r.text("path"), shown=r.opt_text("shown") or r.text("path"), prior=r.blob("prior_b64", missing_ok=False),
            prior_mode=r.opt_int("prior_mode"), prior_uid=r.opt_int("prior_uid"), prior_gid=r.opt_int("prior_gid"),
            after_sha256=r.opt_text("after_sha256"), temp=r.text("temp"), created_dirs=r.texts("created_dirs"),
            dir_dev=r.opt_int("dir_dev"), dir_ino=r.opt_int("dir_ino"),
        )


@dataclass(frozen=True)
class Restore:
    """One value undo writes back: the file written (below --root), the value, how the plan names the file."""

    target: str
    value: str
    shown: str


@dataclass
class RuntimeEntry(Entry):
    """A value written to /proc/sys or /sys (or to its copy in a tree)."""

    kind: ClassVar[str] = "runtime"
    path: str = ""  # the host path (/proc/sys/vm/swappiness)
    real_path: str = ""  # where it was written (below --root)
    parse: str = "plain"  # plain | bracket | mask: how the value is read back
    prior: str = ""
    new: str = ""
    restore: list[Restore] = field(default_factory=list)  # written in order by undo
    tree_prior: bytes | None = None  # in a tree these are plain files: their prior bytes

    def to_json(self) -> dict[str, object]:
        out = {
            **self._common(), "path": self.path, "real_path": self.real_path, "parse": self.parse,
            "prior": self.prior, "new": self.new, "restore": [[r.target, r.value, r.shown] for r in self.restore],
        }
        if self.tree_prior is not None:
            out["tree_prior_b64"] = b64(self.tree_prior)
        return out

    @classmethod
    def from_json(cls, r: _Reader) -> RuntimeEntry:
        raw = r.doc.get("restore")
        if not isinstance(raw, list) or not all(
            isinstance(x, list) and len(x) == 3 and all(isinstance(v, str) for v in x) for x in raw
        ):
            raise ValueError(f"{r.label} has a bad restore list")
        parse = r.opt_text("parse") or "plain"
        if parse not in ("plain", "bracket", "mask"):
            raise r.bad("parse", "an unknown")
        return cls(
            what=r.opt_text("what") or "", status=cls._status(r), error=r.opt_text("error"),
            path=r.text("path"), real_path=r.text("real_path"), parse=parse, prior=r.text("prior"), new=r.text("new"),
            restore=[Restore(t, v, s) for t, v, s in raw], tree_prior=r.blob("tree_prior_b64"),
        )


@dataclass
class DomainEntry(Entry):
    """A libvirt domain redefined: its definition before, the one kvmtune defined, and what libvirt made of it."""

    kind: ClassVar[str] = "domain"
    uri: str = ""
    name: str = ""
    uuid: str = ""
    prior_xml: str = ""
    new_xml: str = ""
    after_xml: str | None = None  # libvirt's definition after defineXML (undo's conflict check)
    was_active: bool = False

    def to_json(self) -> dict[str, object]:
        return {
            **self._common(), "uri": self.uri, "name": self.name, "uuid": self.uuid, "prior_xml": self.prior_xml,
            "new_xml": self.new_xml, "after_xml": self.after_xml, "was_active": self.was_active,
        }

    @classmethod
    def from_json(cls, r: _Reader) -> DomainEntry:
        return cls(
            what=r.opt_text("what") or "", status=cls._status(r), error=r.opt_text("error"),
            uri=r.text("uri"), name=r.text("name"), uuid=r.text("uuid"), prior_xml=r.text("prior_xml"),
            new_xml=r.opt_text("new_xml") or "", after_xml=r.opt_text("after_xml"), was_active=r.flag("was_active"),
        )


@dataclass
class ImageEntry(Entry):
    """An image converted in place: the original kept as a hard link until undo or --purge-backups."""

    kind: ClassVar[str] = "image"
    path: str = ""
    format: str = ""
    options: str = ""
    backup: str = ""
    temp: str = ""
    prior_ino: int | None = None
    prior_size: int | None = None
    after_ino: int | None = None
    purged: bool = False

    def to_json(self) -> dict[str, object]:
        return {
            **self._common(), "path": self.path, "format": self.format, "options": self.options,
            "backup": self.backup, "temp": self.temp, "prior_ino": self.prior_ino, "prior_size": self.prior_size,
            "after_ino": self.after_ino, "purged": self.purged,
        }

    @classmethod
    def from_json(cls, r: _Reader) -> ImageEntry:
        return cls(
            what=r.opt_text("what") or "", status=cls._status(r), error=r.opt_text("error"),
            path=r.text("path"), format=r.opt_text("format") or "", options=r.opt_text("options") or "",
            backup=r.text("backup"), temp=r.text("temp"), prior_ino=r.opt_int("prior_ino"),
            prior_size=r.opt_int("prior_size"), after_ino=r.opt_int("after_ino"), purged=r.flag("purged"),
        )


def _values(r: _Reader, key: str) -> dict[str, str | None]:
    value = r.doc.get(key, {})
    if not isinstance(value, dict) or not all(isinstance(k, str) and (v is None or isinstance(v, str))
                                              for k, v in value.items()):
        raise r.bad(key, "a bad")
    return dict(value)


@dataclass
class QmEntry(Entry):
    """A Proxmox VE VM changed with ``qm set`` on a running node: the changed keys' values before (as
    ``qm config`` showed them, pending changes applied, and without them) and after (``None``: not set)."""

    kind: ClassVar[str] = "qm"
    vmid: str = ""
    guest: str = ""
    digest: str = ""  # qm config's digest the plan was made from (qm set --digest)
    prior: dict[str, str | None] = field(default_factory=dict)  # qm config (pending applied)
    prior_current: dict[str, str | None] = field(default_factory=dict)  # qm config --current
    new: dict[str, str | None] = field(default_factory=dict)
    pending: list[str] = field(default_factory=list)  # keys PVE kept as pending (the VM runs)

    def to_json(self) -> dict[str, object]:
        return {
            **self._common(), "vmid": self.vmid, "guest": self.guest, "digest": self.digest, "prior": self.prior,
            "prior_current": self.prior_current, "new": self.new, "pending": self.pending,
        }

    @classmethod
    def from_json(cls, r: _Reader) -> QmEntry:
        return cls(
            what=r.opt_text("what") or "", status=cls._status(r), error=r.opt_text("error"),
            vmid=r.text("vmid"), guest=r.opt_text("guest") or "", digest=r.opt_text("digest") or "",
            prior=_values(r, "prior"), prior_current=_values(r, "prior_current"), new=_values(r, "new"),
            pending=r.texts("pending"),
        )


def _mapping(r: _Reader, key: str) -> dict[str, object]:
    value = r.doc.get(key)
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        raise r.bad(key, "a bad")
    return dict(value)


@dataclass
class KubectlEntry(Entry):
    """A KubeVirt object changed with ``kubectl patch --type merge``: the patch sent and its reverse (the prior
    values, ``null`` where a field was absent), the resourceVersions before and after, and, for a VirtualMachine,
    whether it showed ``RestartRequired`` after the patch."""

    kind: ClassVar[str] = "kubectl"
    context: str | None = None
    obj_kind: str = ""
    namespace: str | None = None
    name: str = ""
    prior_version: str = ""
    after_version: str | None = None
    patch: dict[str, object] = field(default_factory=dict)
    reverse: dict[str, object] = field(default_factory=dict)
    shared: bool = False  # an instancetype or preference
    restart_required: bool = False

    def to_json(self) -> dict[str, object]:
        return {
            **self._common(), "context": self.context, "obj_kind": self.obj_kind, "namespace": self.namespace,
            "name": self.name, "prior_version": self.prior_version, "after_version": self.after_version,
            "patch": self.patch, "reverse": self.reverse, "shared": self.shared,
            "restart_required": self.restart_required,
        }

    @classmethod
    def from_json(cls, r: _Reader) -> KubectlEntry:
        return cls(
            what=r.opt_text("what") or "", status=cls._status(r), error=r.opt_text("error"),
            context=r.opt_text("context"), obj_kind=r.text("obj_kind"), namespace=r.opt_text("namespace"),
            name=r.text("name"), prior_version=r.text("prior_version"), after_version=r.opt_text("after_version"),
            patch=_mapping(r, "patch"), reverse=_mapping(r, "reverse"), shared=r.flag("shared"),
            restart_required=r.flag("restart_required"),
        )


# what a running libvirt domain can have set live by kvmtune (fix/live.py's LIVE_PATHS), and the bounds of a value
LIVE_SETTINGS = ("memory-stats-period",)
LIVE_MAX = 2**31 - 1  # libvirt's int


@dataclass
class LiveEntry(Entry):
    """A running libvirt domain's live setting changed through libvirt (``fix --live``): its value before and after,
    and which run of the domain it was (``virDomainGetID``, new at every start): undo puts it back on that run only."""

    kind: ClassVar[str] = "live"
    uri: str = ""
    name: str = ""
    uuid: str = ""
    setting: str = ""
    prior: int = 0
    new: int = 0
    domain_id: int = -1

    def to_json(self) -> dict[str, object]:
        return {
            **self._common(), "uri": self.uri, "name": self.name, "uuid": self.uuid, "setting": self.setting,
            "prior": self.prior, "new": self.new, "domain_id": self.domain_id,
        }

    @classmethod
    def from_json(cls, r: _Reader) -> LiveEntry:
        setting = r.text("setting")
        if setting not in LIVE_SETTINGS:
            raise ValueError(f"{r.label} has unknown setting {setting[:40]!r}")
        values: dict[str, int] = {}
        for key, low in (("prior", 0), ("new", 0), ("domain_id", -1)):
            value = r.opt_int(key)
            if value is None or not low <= value <= LIVE_MAX:
                raise r.bad(key, "no or an out-of-range")
            values[key] = value
        return cls(
            what=r.opt_text("what") or "", status=cls._status(r), error=r.opt_text("error"),
            uri=r.text("uri"), name=r.text("name"), uuid=r.text("uuid"), setting=setting, prior=values["prior"],
            new=values["new"], domain_id=values["domain_id"],
        )


KINDS: dict[str, type[FileEntry] | type[RuntimeEntry] | type[DomainEntry] | type[ImageEntry] | type[QmEntry]
            | type[KubectlEntry] | type[LiveEntry]] = {
    "file": FileEntry, "runtime": RuntimeEntry, "domain": DomainEntry, "image": ImageEntry, "qm": QmEntry,
    "kubectl": KubectlEntry, "live": LiveEntry,
}
AnyEntry = FileEntry | RuntimeEntry | DomainEntry | ImageEntry | QmEntry | KubectlEntry | LiveEntry


def entry_from_json(doc: object, n: int) -> AnyEntry:
    """The entry for change ``n`` of a journal; ValueError (one line) if it is not a well-formed one."""
    if not isinstance(doc, dict):
        raise ValueError(f"change {n} is not an object")
    kind = doc.get("kind")
    cls = KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(f"change {n} has unknown kind {kind!r}")
    r = _Reader(doc, f"change {n} ({kind})")
    entry = cls.from_json(r)
    _read_effect(entry, r)
    return entry


def _read_effect(entry: Entry, r: _Reader) -> None:
    """``takes_effect`` and ``planned``, both optional (format 1 journals have neither); anything else refused."""
    raw = r.doc.get("takes_effect")
    if raw is None:
        return
    try:
        entry.takes_effect = parse(raw)
    except ValueError as exc:
        raise ValueError(f"{r.label} has {exc}") from None
    items = r.doc.get("planned", [])
    if not isinstance(items, list):
        raise r.bad("planned", "a bad")
    for item in items:
        keys = ("guest", "rule", "target", "what", "takes_effect")
        if not isinstance(item, dict) or set(item) != set(keys) or not all(isinstance(item[k], str) for k in keys):
            raise r.bad("planned", "a bad")
        try:
            when = parse(item["takes_effect"])
        except ValueError as exc:
            raise ValueError(f"{r.label} has in 'planned' {exc}") from None
        entry.planned.append(Planned(item["guest"], item["rule"], item["target"], item["what"], when))
