"""A libvirt guest for ``kvmtune capture``: its QMP through libvirt, its disks by target, its trace events in its log.

libvirt owns the guest's monitor socket, so kvmtune reaches QMP through ``virDomainQemuMonitorCommand`` (what
``virsh qemu-monitor-command`` calls), which taints the domain ``custom-monitor`` (libvirt writes so in the domain's
log). QEMU's stderr is libvirt's log pipe: virtlogd writes it to ``/var/log/libvirt/qemu/NAME.log``, where the
``log`` trace backend's lines land, and rotates that file (``max_size`` in virtlogd.conf, 2 MiB by default):
:class:`LogFollower` reads the renamed file to its end before it goes on in the new one.

Everything here is foreign input: the domain's name (a path component), its live XML (targets and aliases, strict
patterns, no duplicates) and every QMP reply (bounded, a JSON object with no duplicate keys).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Any, BinaryIO

from kvmtune.capture.workload import unique_keys
from kvmtune.domain.connection import open_connection
from kvmtune.domain.xml import parse_xml_bytes
from kvmtune.errors import InputError, KvmtuneError
from kvmtune.host.root import HostReadError, HostRoot

LOG_DIR = "/var/log/libvirt/qemu"
MAX_REPLY = 16 * 1024 * 1024  # one QMP reply, as kvmtune.qemu.qmp bounds its own
_NAME = re.compile(r"[A-Za-z0-9_.+:@-][A-Za-z0-9_.+:@ -]{0,199}")  # what kvmtune will put into a log path
_TARGET = re.compile(r"(?:vd|sd|hd|xvd|ubd)[a-z]{1,3}")
_ALIAS = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
URIS = ("qemu:///system",)  # the connections a capture marker may name (the log directory above is theirs)


def log_path(name: str) -> str:
    """The domain's log file; a name kvmtune would not put into a path is refused in one line."""
    if not _NAME.fullmatch(name) or name in (".", ".."):
        raise KvmtuneError(f"{name!r}: a libvirt domain name kvmtune does not put into a path "
                           f"({LOG_DIR}/NAME.log); nothing captured")
    return f"{LOG_DIR}/{name}.log"


def disks_from_xml(xml: bytes, where: str) -> dict[str, str]:
    """alias -> target (``virtio-disk0`` -> ``vda``) of the running domain's disks, from its live XML; an alias
    or target out of pattern, or one given twice, is an :class:`InputError`."""
    tree = parse_xml_bytes(xml, where)
    out: dict[str, str] = {}
    for disk in tree.getroot().iterfind("devices/disk"):
        targets = disk.findall("target")
        aliases = disk.findall("alias")
        if not aliases:
            continue  # not attached to QEMU (an inactive definition): no qdev to match
        if len(targets) != 1 or len(aliases) != 1:
            raise InputError(where, f"a <disk> with {len(targets)} <target> and {len(aliases)} <alias>")
        dev, alias = targets[0].get("dev") or "", aliases[0].get("name") or ""
        if not _TARGET.fullmatch(dev):
            raise InputError(where, f"disk target {dev[:40]!r} is not a disk name kvmtune knows (vda, sdb, hdc...)")
        if not _ALIAS.fullmatch(alias):
            raise InputError(where, f"disk alias {alias[:40]!r} is not a plain device id")
        if alias in out:
            raise InputError(where, f"disk alias {alias} given twice")
        if dev in out.values():
            raise InputError(where, f"disk target {dev} given twice")
        out[alias] = dev
    return out


def target_of(qdev: str | None, aliases: dict[str, str]) -> str | None:
    """The target of the disk whose qdev ``query-blockstats`` names: the alias itself (``scsi0-0-0-0``) or a path
    under ``/machine/peripheral/ALIAS`` (``/machine/peripheral/virtio-disk0/virtio-backend``)."""
    if not qdev:
        return None
    for alias, dev in aliases.items():
        base = f"/machine/peripheral/{alias}"
        if qdev in (alias, base) or qdev.startswith(base + "/"):
            return dev
    return None


def _constant(name: str) -> Any:
    raise ValueError(f"non-JSON constant {name}")


def qmp_reply(cmd: str, raw: str | None) -> Any:
    """The ``return`` of a QMP reply libvirt passed on; anything else one :class:`KvmtuneError` line."""
    if raw is None:
        raise KvmtuneError(f"QMP {cmd}: no reply")
    if len(raw) > MAX_REPLY:
        raise KvmtuneError(f"QMP {cmd}: a reply over {MAX_REPLY // (1024 * 1024)} MiB")
    try:
        msg = json.loads(raw, object_pairs_hook=unique_keys, parse_constant=_constant)
    except (ValueError, RecursionError) as exc:
        raise KvmtuneError(f"QMP {cmd}: the reply is not plain JSON ({str(exc)[:80]})") from None
    if not isinstance(msg, dict):
        raise KvmtuneError(f"QMP {cmd}: the reply is not a JSON object")
    if "error" in msg:
        err = msg["error"]
        desc = err.get("desc") if isinstance(err, dict) else None
        raise KvmtuneError(f"QMP {cmd}: {desc[:200] if isinstance(desc, str) else 'error'}")
    if "return" not in msg:
        raise KvmtuneError(f"QMP {cmd}: the reply has no 'return'")
    return msg["return"]


class LibvirtMonitor:
    """QMP commands through libvirt (``virDomainQemuMonitorCommand``), with :class:`kvmtune.qemu.qmp.Qmp`'s
    ``execute`` and ``close``."""

    def __init__(self, domain: Any, conn: Any) -> None:
        import libvirt
        import libvirt_qemu

        self._libvirt, self._qemu, self.domain, self.conn = libvirt, libvirt_qemu, domain, conn

    def execute(self, cmd: str, **args: Any) -> Any:
        req: dict[str, Any] = {"execute": cmd, **({"arguments": args} if args else {})}
        try:
            raw = self._qemu.qemuMonitorCommand(self.domain, json.dumps(req), 0)
        except self._libvirt.libvirtError as exc:
            raise KvmtuneError(f"QMP {cmd} through libvirt: {(str(exc).strip().splitlines() or ['error'])[0]}") from None
        return qmp_reply(cmd, raw)

    def close(self) -> None:
        try:
            self.conn.close()
        except self._libvirt.libvirtError:
            pass


@dataclass(frozen=True)
class LibvirtGuest:
    """A running libvirt domain as a capture reaches it."""

    uri: str
    uuid: str
    name: str

    def open(self) -> tuple[LibvirtMonitor, dict[str, str]]:
        """Its monitor (read-write: libvirt lets only such connections pass QMP) and its disks, alias -> target."""
        import libvirt

        if not _UUID.fullmatch(self.uuid):
            raise KvmtuneError(f"{self.name}: libvirt UUID {self.uuid[:40]!r} is not a UUID")
        conn = open_connection(self.uri, read_only=False)
        try:
            dom = conn.lookupByUUIDString(self.uuid)
            if dom.name() != self.name:  # the pid file and the log kvmtune reads are found by this name
                raise KvmtuneError(f"{self.name}: libvirt UUID {self.uuid} names domain {str(dom.name())[:200]!r}, "
                                   "not this one")
            if not dom.isActive():
                raise KvmtuneError(f"{self.name}: not running")
            xml = dom.XMLDesc(0)
        except libvirt.libvirtError as exc:
            conn.close()
            raise KvmtuneError(f"{self.name}: {(str(exc).strip().splitlines() or ['libvirt error'])[0]}") from None
        except KvmtuneError:
            conn.close()
            raise
        try:
            disks = disks_from_xml(xml.encode() if isinstance(xml, str) else b"", f"{self.uri}#{self.name}")
        except InputError:
            conn.close()
            raise
        return LibvirtMonitor(dom, conn), disks

    def marker(self) -> dict[str, str]:
        return {"uri": self.uri, "uuid": self.uuid, "name": self.name}

    @classmethod
    def from_marker(cls, m: Any) -> LibvirtGuest:
        """Back from a capture marker's ``libvirt`` object (kvmtune's own file, still checked)."""
        if (not isinstance(m, dict) or m.get("uri") not in URIS or not isinstance(m.get("uuid"), str)
                or not _UUID.fullmatch(m["uuid"]) or not isinstance(m.get("name"), str)):
            raise ValueError("libvirt")
        log_path(m["name"])
        return cls(m["uri"], m["uuid"], m["name"])


class LogFollower:
    """The new bytes of a file another process appends to and rotates by renaming (virtlogd: ``NAME.log`` becomes
    ``NAME.log.0``, ``.0`` becomes ``.1``, …, up to its ``max_backups``): the old file is read to its end, then each
    file that came after it, oldest first, then the one now at the path, from its start. Files renamed away twice
    between two reads are found among the backups by inode; one rotated past the last backup is gone, and counted
    (:attr:`lost`)."""

    MAX_BACKUPS = 16  # backups looked at (virtlogd keeps 3 unless configured otherwise)

    def __init__(self, host: HostRoot, path: str) -> None:
        self.host, self.path = host, path
        self.fh: BinaryIO = self._open(path)
        self.fh.seek(0, os.SEEK_END)
        self.rotations = 0
        self.lost = 0  # times the file read before a rotation was no longer among the backups
        self._next: list[BinaryIO] = []  # files after the current one, oldest first

    def _open(self, path: str) -> BinaryIO:
        fh = self.host.open_regular(path, nofollow=True)  # a link swapped in at any moment is not followed
        st = os.fstat(fh.fileno())
        if st.st_mode & 0o022 or st.st_uid not in (0, os.geteuid()):  # virtlogd's: root's, 0600
            fh.close()
            raise HostReadError(path, f"owned by uid {st.st_uid} with mode {st.st_mode & 0o7777:04o}: others may "
                                "write lines into it; not read")
        return fh

    def read(self, limit: int) -> bytes:
        while True:
            data = self.fh.read(limit)
            if data:
                return data
            if self._next:  # the current file is done and was rotated: the one after it
                self.fh.close()
                self.fh = self._next.pop(0)
                continue
            try:
                fresh = self._open(self.path)
            except HostReadError:
                return b""  # between the rename and the new file: next time
            current = os.fstat(self.fh.fileno()).st_ino
            if os.fstat(fresh.fileno()).st_ino == current:
                fresh.close()
                return b""
            data = self.fh.read(limit)  # what came between the read above and the rename
            if data:
                fresh.close()
                return data
            self._next = [*self._after(current), fresh]
            self._dedupe()
            self.rotations += 1

    def _after(self, current: int) -> list[BinaryIO]:
        """The backups newer than the file of inode ``current``, oldest first (all of them when it is gone)."""
        backups: list[BinaryIO] = []
        for i in range(self.MAX_BACKUPS):
            try:
                backups.append(self._open(f"{self.path}.{i}"))
            except HostReadError:
                break
        inodes = [os.fstat(b.fileno()).st_ino for b in backups]
        if current in inodes:
            k = inodes.index(current)
            for b in backups[k:]:
                b.close()
            return list(reversed(backups[:k]))
        self.lost += 1
        return list(reversed(backups))

    def _dedupe(self) -> None:
        """A rotation between the opens can name one file twice: each inode read once."""
        seen = {os.fstat(self.fh.fileno()).st_ino}
        kept: list[BinaryIO] = []
        for f in self._next:
            ino = os.fstat(f.fileno()).st_ino
            if ino in seen:
                f.close()
            else:
                seen.add(ino)
                kept.append(f)
        self._next = kept

    def close(self) -> None:
        self.fh.close()
        for f in self._next:
            f.close()
        self._next = []
