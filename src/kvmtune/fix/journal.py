"""The journal: what was there before kvmtune changed it, written before the first change.

One JSON file per ``fix --apply`` in the journal directory (``/var/lib/kvmtune/journal``,
``$KVMTUNE_JOURNAL_DIR`` or ``--journal-dir``). It holds, per change, the prior state
(file bytes or their absence, runtime values, domain XML, image backup name), the
state after, and whether the change was carried out. It is rewritten atomically
after every change, so a crash leaves a journal ``undo`` can use.

A journal is input to ``undo``, which runs as root: it is read only from a directory and a file
the invoking user owns and no one else can write (regular file, no link followed, size bounded),
below directories only root and the invoking user can change, and every path it names must lie
inside its root (:func:`refusals`): a journal in a host tree (``--root``) touches nothing outside that
tree, and restores only values the settings table sets.

Every use of the directory (the lock, a journal's write, read, listing) goes through one descriptor of
it, reached from ``/`` without following a link and checked on the way (:func:`open_directory`): what
was checked is what is written and read.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import json
import os
import re
import secrets
import shlex
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kvmtune.errors import InputError, KvmtuneError
from kvmtune.fix.entries import (
    AnyEntry,
    DomainEntry,
    FileEntry,
    ImageEntry,
    KubectlEntry,
    LiveEntry,
    QmEntry,
    Restore,
    RuntimeEntry,
    entry_from_json,
)
from kvmtune.fix.files import write_atomic
from kvmtune.host.root import HostReadError, HostRoot
from kvmtune.host.settings import known_runtime_path
from kvmtune.inputs import MissingPath, ancestor_rule, check_private, open_beneath, open_dir, read_private
from kvmtune.proxmox.config import DISK_KEY, NET_KEY, split_property_string
from kvmtune.proxmox.qm import same_value, settable, valid_vmid

DEFAULT_DIR = "/var/lib/kvmtune/journal"
ENV_DIR = "KVMTUNE_JOURNAL_DIR"
FORMAT = 1
ID_RE = re.compile(r"^[0-9]{8}T[0-9]{6}Z-[0-9a-f]{6}$")
STATES = ("applying", "applied", "failed", "undoing", "undone", "undo-incomplete")
MAX_BYTES = 64 * 1024 * 1024  # a journal holds prior file contents (domain XML is at most 16 MiB each)


class JournalError(KvmtuneError):
    """A journal that is absent, unreadable or corrupt."""


@contextlib.contextmanager
def locked(directory: Path) -> Iterator[None]:
    """One ``fix --apply`` or ``undo`` at a time per journal directory (an flock, released on exit or crash)."""
    try:
        dir_fd = open_directory(directory, create=True)
    except OSError as exc:
        raise JournalError(f"cannot write the journal in {directory}: {exc.strerror or exc}; nothing changed") from None
    try:
        fd = open_beneath(dir_fd, ".lock", os.O_RDWR | os.O_CREAT | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        os.close(dir_fd)
        raise JournalError(f"cannot write the journal in {directory}: {exc.strerror or exc}; nothing changed") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise JournalError(f"another kvmtune fix --apply or undo is running (lock {directory / '.lock'})") from None
        _remove_stray_temps(dir_fd)
        yield
    finally:
        os.close(fd)
        os.close(dir_fd)


def _remove_stray_temps(dir_fd: int) -> None:
    """A journal being written when kvmtune was killed leaves ``.ID.json.kvmtune-journal.tmp`` (0600, with
    the prior file contents in it). Only a holder of the directory lock writes journals, so under the lock
    every such file is a dead writer's and goes."""
    with contextlib.suppress(OSError):
        for name in _names(dir_fd):
            if name.startswith(".") and name.endswith(".kvmtune-journal.tmp"):
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=dir_fd)


def _names(dir_fd: int) -> list[str]:
    """The entries of the directory ``dir_fd`` (an ``O_PATH`` descriptor: listed through ``.`` opened in it)."""
    fd = open_beneath(dir_fd, ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)


def open_directory(directory: Path, *, create: bool = False) -> int:
    """A descriptor of the journal directory, reached from ``/`` one component at a time without following
    a link (made, 0700, with ``create``): every directory above it one only root and the invoking user can
    change, and itself the invoking user's, not writable by group or others (journals found there tell root
    what to write and delete). :class:`JournalError` (one line) when it is not; :class:`FileNotFoundError`
    when it is absent; another :class:`OSError` when it cannot be made or opened."""
    try:
        fd = open_dir(str(directory), create=0o700 if create else None, check=ancestor_rule(str(directory)))
    except MissingPath:
        raise FileNotFoundError(errno.ENOENT, "no such directory", str(directory)) from None
    except InputError as exc:
        raise JournalError(str(exc)) from None
    try:
        check_private(str(directory), os.fstat(fd), "a journal directory")
    except InputError as exc:
        os.close(fd)
        raise JournalError(str(exc)) from None
    return fd


def default_dir(root: str = "/") -> Path:
    """Where journals go without ``--journal-dir`` or ``$KVMTUNE_JOURNAL_DIR``."""
    return Path(root) / DEFAULT_DIR.lstrip("/")


def journal_dir(explicit: str | None = None, root: str = "/") -> Path:
    """``--journal-dir``, else ``$KVMTUNE_JOURNAL_DIR``, else the default directory below ``root``:
    a tree's journal stays in the tree, away from the real host's changes in ``undo --list``. A tree
    whose journal directory is a link out of the tree is refused."""
    if explicit or os.environ.get(ENV_DIR):
        return Path(explicit or os.environ[ENV_DIR])
    try:
        HostRoot(root).beneath(DEFAULT_DIR)
    except HostReadError as exc:
        raise JournalError(f"{exc}; no journal is read or written there") from None
    return default_dir(root)


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
        """Write the journal, atomically, in a descriptor of its directory (:func:`open_directory`); an
        :class:`OSError` when it cannot be written (a refused directory included: ``EPERM``)."""
        data = (json.dumps(self.to_json(), indent=1, sort_keys=False) + "\n").encode()
        if len(data) > MAX_BYTES:  # load() would refuse it: never write a journal undo cannot read
            raise OSError(errno.EFBIG, f"the journal would be larger than {MAX_BYTES // 2**20} MiB")
        try:
            dir_fd = open_directory(self.directory, create=True)
        except JournalError as exc:
            raise OSError(errno.EPERM, str(exc)) from None
        try:
            write_atomic(self.path, data, mode=0o600, tag="journal", dir_fd=dir_fd)
        finally:
            os.close(dir_fd)

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

    def undo_command(self) -> str:
        """The ``kvmtune undo`` command line that finds and undoes this journal (shell-quoted), from any directory."""
        cmd = ["kvmtune", "undo"]
        if self.root != "/":
            cmd += ["--root", self.root]
        if os.path.abspath(self.directory) != os.path.abspath(default_dir(self.root)):
            cmd += ["--journal-dir", os.path.abspath(self.directory)]
        return shlex.join([*cmd, self.id])

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for e in self.entries:
            counts[e.kind] = counts.get(e.kind, 0) + 1
        names = {"file": "file(s)", "runtime": "runtime value(s)", "domain": "domain(s)", "image": "image(s)",
                 "qm": "Proxmox VE VM(s)"}
        return ", ".join(f"{n} {names.get(k, k)}" for k, n in counts.items()) or "nothing"


def load(journal_id: str, directory: Path, root: str | None = None) -> Journal:
    """The journal ``journal_id`` of ``directory``, read as untrusted input.

    With ``root`` (the ``--root`` of ``undo``), a journal made for another root, or with an entry that
    reaches outside its root (:func:`refusals`), is refused as a whole: nothing of it is undone."""
    if not ID_RE.match(journal_id):
        raise JournalError(f"{journal_id!r} is not a journal id (see 'kvmtune undo --list')")
    try:
        dir_fd = open_directory(directory)
    except FileNotFoundError:
        raise JournalError(f"no journal {journal_id} in {directory} (see 'kvmtune undo --list')") from None
    except OSError as exc:
        raise JournalError(f"{directory}: cannot use the journal directory ({exc.strerror or exc})") from None
    try:
        return _load_at(dir_fd, journal_id, directory, root)
    finally:
        os.close(dir_fd)


def _load_at(dir_fd: int, journal_id: str, directory: Path, root: str | None) -> Journal:
    """:func:`load` in ``dir_fd``, the journal directory's descriptor."""
    path = directory / f"{journal_id}.json"
    try:
        raw = read_private(str(path), MAX_BYTES, " (a journal)", noun="a journal", dir_fd=dir_fd)
    except InputError as exc:
        if exc.problem == "no such file":
            raise JournalError(f"no journal {journal_id} in {directory} (see 'kvmtune undo --list')") from None
        raise JournalError(str(exc)) from None
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
        root_ = doc.get("root")
        if not isinstance(root_, str) or not _normal_absolute(root_):
            raise ValueError("no absolute root")
    except (ValueError, UnicodeDecodeError) as exc:
        raise JournalError(f"{path}: corrupt journal: {exc}") from None
    journal = Journal(
        id=journal_id,
        directory=directory,
        argv=list(doc.get("argv") or []),
        root=root_,
        created=str(doc.get("created") or ""),
        state=doc["state"],
        entries=entries,
        error=doc.get("error"),
        history=list(doc.get("history") or []),
    )
    if root is not None:
        problems = refusals(journal, root)
        if problems:
            raise JournalError(f"{path}: refused, nothing restored: {'; '.join(problems)}")
    return journal


# --------------------------------------------------------------------------- what a journal may touch


def _normal_absolute(p: str) -> bool:
    """An absolute path with no ``.``, ``..``, empty or trailing component (``os.path.normpath`` keeps it as is)."""
    return p.startswith("/") and not p.startswith("//") and os.path.normpath(p) == p and "\0" not in p


def refusals(journal: Journal, given_root: str | None = None) -> list[str]:
    """Why ``journal`` must not be carried out or undone: one line per refused entry (none: it may be).

    A journal's root is the real path of the ``--root`` it was made for; ``given_root`` (``undo --root``,
    default ``/``) must be that same directory. Every path an entry names (file, temp file, directories it
    created, runtime value and the values undo writes back, image, its backup and temp file) must lie inside
    the root, the way :class:`HostRoot` maps paths (no link leading out of a tree). Values written back are only
    the /proc/sys and /sys files of the settings table. A tree's journal may not redefine libvirt domains;
    a host's libvirt entry must name a UUID and (a redefinition) its prior definition's domain (:func:`libvirt_refusals`).
    Each entry's printed name (``shown``) is set here from its path, never taken from the file."""
    root = journal.root
    if given_root is not None and os.path.realpath(given_root) != root:
        made = "this host (/)" if root == "/" else f"the tree {root}"
        flag = "without --root" if root == "/" else f"with --root {root}"
        return [f"journal {journal.id} was made for {made}, not --root {given_root} (run kvmtune undo {flag})"]
    tree = root != "/"
    host = HostRoot(root)
    problems: list[str] = []

    def host_path(p: str, what: str) -> str | None:
        """``p`` as a host path below the root (``/etc/x``), or None after adding the problem."""
        if not _normal_absolute(p):
            problems.append(f"{label}: {what} {p!r} is not a normal absolute path")
            return None
        if not tree:
            return p
        if not p.startswith(root + "/"):
            problems.append(f"{label}: {what} {p} is outside the tree {root}")
            return None
        hp = p[len(root):]
        try:
            host.beneath(hp)
        except HostReadError as exc:
            problems.append(f"{label}: {what} {p} {exc.problem}")
            return None
        return hp

    def beside(p: str, other: str, what: str, pattern: str) -> None:
        """``other`` must be a kvmtune file next to ``p``, named by ``pattern`` (``{name}``: p's file name)."""
        if host_path(other, what) is None:
            return
        directory, name = os.path.split(p)
        prefix, suffix = pattern.format(name=name).split("*")
        base = os.path.basename(other)
        if os.path.dirname(other) != directory or not (base.startswith(prefix) and base.endswith(suffix)) \
                or len(base) < len(prefix) + len(suffix):
            problems.append(f"{label}: {what} {other} is not a file kvmtune names beside {p}")

    for n, e in enumerate(journal.entries, 1):
        label = f"change {n} ({e.kind})"
        if isinstance(e, FileEntry):
            if host_path(e.path, "file") is None:
                continue
            beside(e.path, e.temp, "temp file", ".{name}.kvmtune-*.tmp")
            for d in e.created_dirs:
                if host_path(d, "created directory") is not None and not e.path.startswith(d.rstrip("/") + "/"):
                    problems.append(f"{label}: created directory {d} is not a directory above {e.path}")
                elif d in ("/", root):
                    problems.append(f"{label}: created directory {d} is the root itself")
            e.shown = e.path
        elif isinstance(e, RuntimeEntry):
            hp = host_path(e.real_path, "runtime value")
            if hp is None:
                continue
            if not known_runtime_path(hp):
                problems.append(f"{label}: {hp} is not a value kvmtune sets")
                continue
            if e.path != hp:
                problems.append(f"{label}: names {e.path!r} but writes {e.real_path}")
                continue
            restore: list[Restore] = []
            for r in e.restore:
                target = host_path(r.target, "restore target")
                if target is None:
                    continue
                if not known_runtime_path(target):
                    problems.append(f"{label}: restore target {target} is not a value kvmtune sets")
                    continue
                restore.append(Restore(r.target, r.value, target))
            e.restore = restore
        elif isinstance(e, ImageEntry):
            if host_path(e.path, "image") is None:
                continue
            beside(e.path, e.temp, "temp file", ".{name}.kvmtune-*.tmp")
            beside(e.path, e.backup, "backup", "{name}.kvmtune-orig-*")
        elif isinstance(e, DomainEntry | LiveEntry):
            problems.extend(f"{label}: {p}" for p in libvirt_refusals(e, root))
        elif isinstance(e, QmEntry):
            problems.extend(f"{label}: {p}" for p in qm_refusals(e, root))
        elif isinstance(e, KubectlEntry):
            problems.extend(f"{label}: {p}" for p in kubectl_refusals(e, root))
    return problems


_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def libvirt_refusals(e: DomainEntry | LiveEntry, root: str) -> list[str]:
    """A libvirt entry (a redefinition, or a live setting) may only act on this host's journal, on the domain it
    names: its UUID as libvirt writes one, and a redefinition's prior definition of that same domain (name and
    UUID), since ``defineXML`` changes the domain the XML names, not the one the entry names. The one check of
    both kinds (the live one's name is compared with the domain its UUID finds when it is undone)."""
    if root != "/":
        verb = "redefine" if isinstance(e, DomainEntry) else "change"
        return [f"a journal of the tree {root} may not {verb} libvirt domain {e.name!r}"
                + (" live" if isinstance(e, LiveEntry) else "")]
    if not _UUID.fullmatch(e.uuid):
        return [f"{e.uuid[:60]!r} is not a domain UUID"]
    if isinstance(e, LiveEntry):
        return []
    from kvmtune.domain.xml import parse_xml_bytes

    try:
        dom = parse_xml_bytes(e.prior_xml.encode("utf-8", "surrogatepass"), "its prior definition").getroot()
    except InputError as exc:
        return [f"{exc}"]
    name, uuid = dom.findtext("name"), (dom.findtext("uuid") or "").strip().lower()
    if dom.tag != "domain" or name != e.name or uuid != e.uuid:
        return [f"its prior definition is of domain {str(name)[:60]!r} ({uuid[:60]!r}), not of the domain it names "
                f"({e.name[:60]!r}, {e.uuid})"]
    return []


def kubectl_refusals(e: KubectlEntry, root: str) -> list[str]:
    """A ``kubectl patch`` entry may only patch the ``spec`` of a KubeVirt object kvmtune patches, named as kubectl
    is given names, on this host's kubeconfig (a journal must not reach another resource or another cluster)."""
    from kvmtune.kubevirt.kubectl import PATCHABLE, valid_context, valid_name

    if root != "/":
        return [f"a journal of the tree {root} may not run kubectl ({e.obj_kind} {e.name!r})"]
    out: list[str] = []
    if e.obj_kind not in PATCHABLE:
        out.append(f"{e.obj_kind!r} is not a kind kvmtune patches")
    if not valid_name(e.name) or (e.namespace is not None and not valid_name(e.namespace)):
        out.append(f"{e.name!r} in {e.namespace!r} is not a name kubectl is given")
    if e.context is not None and not valid_context(e.context):
        out.append(f"{e.context!r} is not a kubeconfig context name")
    if set(e.patch) != {"spec"} or set(e.reverse) != {"spec"}:
        out.append("its patch changes more than the object's spec")
    elif e.obj_kind in PATCHABLE:
        from kvmtune.fix.kubectl_paths import patch_refusals

        out.extend(patch_refusals(e.obj_kind, e.patch, e.reverse))
    return out


def qm_refusals(e: QmEntry, root: str) -> list[str]:
    """A ``qm set`` entry may only put back the keys kvmtune's forms change, on this host, and never another
    volume or bridge than the one the key had (a journal must not attach a disk or move a NIC)."""
    if root != "/":
        return [f"a journal of the tree {root} may not run qm set (VM {e.vmid!r})"]
    if not valid_vmid(e.vmid):
        return [f"{e.vmid!r} is not a VMID"]
    out: list[str] = []
    moved = _moved_volumes(e)
    for key in sorted({*e.prior, *e.prior_current, *e.new, *e.pending}):
        if not settable(key):
            out.append(f"VM {e.vmid}: {key!r} is not a key kvmtune sets")
            continue
        values = [v for v in (e.prior.get(key), e.prior_current.get(key), e.new.get(key)) if v is not None]
        if any("\n" in v or "\0" in v or v.startswith("-") for v in values):
            out.append(f"VM {e.vmid}: {key} has a value qm set would not take")
        elif key in moved:
            continue
        elif DISK_KEY.match(key) or NET_KEY.match(key):
            anchor = "bridge" if NET_KEY.match(key) else None
            heads = {_anchor(v, anchor) for v in values}
            if len(values) != 3 or len(heads) != 1:
                out.append(f"VM {e.vmid}: {key} names another volume or bridge before and after")
    return out


def _moved_volumes(e: QmEntry) -> set[str]:
    """The disk keys of a bus change (KVM-STO-001's PVE form): each volume detached from one key (set before, in
    effect, ``None`` after) is attached under exactly one new key (unset before, set after) and no other volume
    is; such an entry moves volumes the VM had, never attaches another. Empty when the entry is not that."""
    sources = {k: _anchor(v, None) for k, v in e.prior.items() if DISK_KEY.match(k) and v is not None
               and e.new.get(k, "") is None and same_value(e.prior_current.get(k), v)}
    targets = {k: _anchor(v, None) for k, v in e.new.items() if DISK_KEY.match(k) and v is not None
               and e.prior.get(k) is None and e.prior_current.get(k) is None}
    if not sources or sorted(sources.values()) != sorted(targets.values()):
        return set()
    return {*sources, *targets}


def _anchor(value: str, prop: str | None) -> str:
    items = split_property_string(value)
    if prop is None:
        return items[0][1] if items else ""
    return next((v for k, v in items if k == prop), "")


def list_journals(directory: Path, root: str | None = None) -> list[tuple[str, Journal | None, str]]:
    """Every journal in ``directory``, oldest first: (id, journal or None, problem). A journal that cannot be
    read (not a regular file, a link, too large, another user's, corrupt) or that reaches outside its own root
    is listed with its problem; a directory another user can write is refused as a whole. ``root``: the
    ``--root`` the journals are read for, which a journal must have been made for (:func:`refusals`), as for
    ``undo``: a tree's journal claiming ``/`` would otherwise be read as this host's, and ``fix --status`` and
    ``audit --staged`` would ask the libvirt URIs, kubectl contexts and VMs it names."""
    try:
        dir_fd = open_directory(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError as exc:
        raise JournalError(f"{directory}: cannot use the journal directory ({exc.strerror or exc})") from None
    out: list[tuple[str, Journal | None, str]] = []
    try:
        for name in sorted(_names(dir_fd)):
            stem, dot, suffix = name.rpartition(".")
            if not dot or suffix != "json" or not ID_RE.match(stem):
                continue
            try:
                journal = _load_at(dir_fd, stem, directory, None)
            except JournalError as exc:
                out.append((stem, None, str(exc)))
                continue
            problems = refusals(journal, root)
            if problems:
                out.append((stem, None, f"{journal.path}: refused: {'; '.join(problems)}"))
            else:
                out.append((stem, journal, ""))
    finally:
        os.close(dir_fd)
    return out
