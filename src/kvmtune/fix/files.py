"""Reading and atomically replacing files: temp file in the same directory, fsync, rename, fsync the directory.

A reader sees the old content or the new one, never a mix; a failed write (full
disk, permission) leaves the old file untouched and no temp file behind. Every replace works in one
descriptor of the directory, held from the temp file's creation to the rename and its fsync: the
directory cannot be swapped for another (or a link) in between. The journal passes the descriptor it
reached without following a link (``inputs.open_dir``); names in it are opened with ``open_beneath``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import stat
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from kvmtune.inputs import open_beneath


@dataclass(frozen=True)
class FileState:
    """What a path holds: its bytes (``None`` = absent) and, when present, mode and owner."""

    data: bytes | None
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None

    @property
    def sha256(self) -> str | None:
        return None if self.data is None else hashlib.sha256(self.data).hexdigest()


def read_state(path: Path, limit: int = 64 * 1024 * 1024, *, dir_fd: int | None = None) -> FileState:
    """What ``path`` holds now, read from the descriptor that was checked: not a link (``O_NOFOLLOW``), a
    regular file (``lstat`` first, so no device is ever opened, then ``fstat`` of what was opened: the same
    file), at most ``limit`` bytes. With ``dir_fd`` (a descriptor of ``path``'s directory) the file is
    ``path``'s name in that directory, whatever directory ``path`` names now."""
    name: str | Path = path.name if dir_fd is not None else path
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return FileState(None)
    if stat.S_ISLNK(st.st_mode):
        raise OSError(f"{path} is a symbolic link; kvmtune does not replace links")
    if not stat.S_ISREG(st.st_mode):
        raise OSError(f"{path} is not a regular file")
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(f"{path} is a symbolic link; kvmtune does not replace links") from None
        raise
    with os.fdopen(fd, "rb") as fh:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino) or not stat.S_ISREG(now.st_mode):
            raise OSError(f"{path} was replaced while kvmtune was reading it; run kvmtune fix again")
        if now.st_size > limit:
            raise OSError(f"{path} is larger than {limit // (1024 * 1024)} MiB")
        data = fh.read(limit + 1)
    if len(data) > limit:
        raise OSError(f"{path} is larger than {limit // (1024 * 1024)} MiB")
    return FileState(data, stat.S_IMODE(now.st_mode), now.st_uid, now.st_gid)


def open_dir(path: Path) -> int:
    """The directory ``path``, opened ``O_PATH`` (to work in by name, ``dir_fd=``); raises ``OSError`` as
    ``os.open`` does (``FileNotFoundError``: not there)."""
    return os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)


def dir_identity(fd: int) -> tuple[int, int]:
    """``(st_dev, st_ino)`` of the open directory ``fd``: what a plan and a journal record of it."""
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


def read_state_and_dir(path: Path, limit: int = 64 * 1024 * 1024) -> tuple[FileState, tuple[int, int] | None]:
    """:func:`read_state` of ``path`` in its directory as opened now, and that directory's ``(st_dev, st_ino)``:
    what a plan records (``FileChange.dir_id``) so that the write goes to the directory the plan read (``None``
    and an absent file where the directory is not there)."""
    try:
        fd = open_dir(path.parent)
    except FileNotFoundError:
        return FileState(None), None
    try:
        return read_state(path, limit, dir_fd=fd), dir_identity(fd)
    finally:
        os.close(fd)


def temp_name(path: Path, tag: str) -> Path:
    return path.with_name(f".{path.name}.kvmtune-{tag}.tmp")


def fsync_dir(path: Path) -> None:
    """fsync the directory ``path``; errors ignored (a file system that cannot sync directories)."""
    _fsync_opened(lambda: os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))


def fsync_at(dir_fd: int) -> None:
    """fsync the directory ``dir_fd`` (an ``O_PATH`` descriptor cannot be synced: it is reopened); errors ignored."""
    _fsync_opened(lambda: open_beneath(dir_fd, ".", os.O_RDONLY | os.O_DIRECTORY))


def _fsync_opened(opener: Callable[[], int]) -> None:
    with contextlib.suppress(OSError):
        fd = opener()
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_output(path: Path, write: Callable[[TextIO], object], *, tag: str = "out") -> None:
    """Write a report or export the user named with ``-o`` (or ``--html``).

    A regular file (or a new one) is written to a temporary file and renamed over the target, so a reader
    never sees half of it. ``-`` is standard output; ``/dev/stdout``, ``/dev/stderr``, ``/dev/fd/N`` and
    ``/proc/self/fd/N`` are written through this process's own descriptor when they lead to it. A character
    device or FIFO named directly (``/dev/null``) is written in place: renaming over it would replace the
    device node itself, which as root breaks the host.

    kvmtune runs as root and the path may lie in a directory others can write (``/tmp``), so it does not
    rely on the ``fs.protected_*`` sysctls (0 on many hosts) and refuses, with an :class:`OSError` whose
    ``strerror`` says why: a block device (named, linked or as its own descriptor); a symbolic link to
    anything but a regular file; a link, FIFO or device owned by another user in a sticky world-writable
    directory (as ``fs.protected_symlinks`` and ``fs.protected_fifos`` would); a FIFO no process reads (the
    open does not wait for one).
    """
    if str(path) == "-":
        write(sys.stdout)
        sys.stdout.flush()
        return
    own = _own_descriptor(path)
    if own is not None:
        _refuse_block(os.fstat(own), path)
        sys.stdout.flush()
        sys.stderr.flush()
        with os.fdopen(os.dup(own), "w", encoding="utf-8") as fh:
            write(fh)
        return
    try:
        lst: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        lst = None
    if lst is not None and not stat.S_ISREG(lst.st_mode) and not stat.S_ISDIR(lst.st_mode):
        _refuse_foreign_in_sticky_dir(path, lst)
    try:
        st: os.stat_result | None = os.stat(path)
    except FileNotFoundError:
        st = None  # absent, or a dangling link: the rename below replaces the link itself
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory", str(path))
    if st is not None and lst is not None and not stat.S_ISREG(st.st_mode):
        _refuse_block(st, path)
        if stat.S_ISLNK(lst.st_mode):
            raise OSError(errno.EPERM, f"a symbolic link to a {_kind(st.st_mode)}; name the file itself", str(path))
        _write_in_place(path, lst, write)
        return

    def fill(fd: int) -> None:
        with os.fdopen(os.dup(fd), "w", encoding="utf-8") as fh:
            write(fh)

    _replace(path, tag, fill)


_OWN_FD = re.compile(r"/(?:dev/fd|proc/self/fd|proc/thread-self/fd|proc/(\d+)/fd)/(\d+)")


def _own_descriptor(path: Path) -> int | None:
    """The descriptor of this process that ``path`` names (``/dev/stdout``, ``/dev/fd/3``...); ``None`` for
    any other path. Such a name that does not lead to that open descriptor is refused: replacing it would
    replace ``/dev/stdout`` itself."""
    text = os.path.normpath(str(path))
    fd = {"/dev/stdout": 1, "/dev/stderr": 2}.get(text)
    m = _OWN_FD.fullmatch(text)
    if m and (m.group(1) is None or int(m.group(1)) == os.getpid()):
        fd = int(m.group(2))
    if fd is None:
        return None
    try:
        mine, there = os.fstat(fd), os.stat(path)
        same = (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino)
    except OSError:
        same = False
    if not same:
        raise OSError(errno.EBADF, f"names descriptor {fd}, which kvmtune does not have open", str(path))
    return fd


def _kind(mode: int) -> str:
    if stat.S_ISBLK(mode):
        return "block device"
    if stat.S_ISCHR(mode):
        return "character device"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "directory" if stat.S_ISDIR(mode) else "special file"


def _refuse_block(st: os.stat_result, path: Path) -> None:
    if stat.S_ISBLK(st.st_mode):
        raise OSError(errno.EPERM, "a block device; kvmtune does not write reports into devices", str(path))


def _refuse_foreign_in_sticky_dir(path: Path, st: os.stat_result) -> None:
    """A link, FIFO or device another user owns in a sticky world-writable directory (``/tmp``) is a trap
    set for root: refused unless its owner also owns the directory (``fs.protected_symlinks=1``'s rule)."""
    try:
        parent = os.stat(path.parent)
    except OSError:
        return
    sticky_public = parent.st_mode & stat.S_ISVTX and parent.st_mode & stat.S_IWOTH
    if sticky_public and st.st_uid not in (os.geteuid(), parent.st_uid):
        what = "symbolic link" if stat.S_ISLNK(st.st_mode) else _kind(st.st_mode)
        raise OSError(errno.EPERM, f"a {what} owned by uid {st.st_uid} in the sticky directory {path.parent}; "
                      "kvmtune does not follow or write into it", str(path))


def _write_in_place(path: Path, seen: os.stat_result, write: Callable[[TextIO], object]) -> None:
    """Write into the character device or FIFO at ``path`` (not a link): opened without waiting for a
    reader and checked to be the file looked at, then written in blocking mode."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ENXIO and stat.S_ISFIFO(seen.st_mode):
            raise OSError(errno.ENXIO, "a FIFO that no process is reading", str(path)) from None
        if exc.errno == errno.ENXIO and stat.S_ISSOCK(seen.st_mode):
            raise OSError(errno.ENXIO, "a socket; kvmtune writes files, FIFOs and character devices", str(path)) from None
        raise
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (seen.st_dev, seen.st_ino) or not (
                stat.S_ISCHR(now.st_mode) or stat.S_ISFIFO(now.st_mode)):
            raise OSError(errno.EAGAIN, "replaced while kvmtune was opening it", str(path))
        os.set_blocking(fd, True)
        with os.fdopen(os.dup(fd), "w", encoding="utf-8") as fh:
            write(fh)
    finally:
        os.close(fd)


def write_atomic(
    path: Path, data: bytes, *, mode: int = 0o644, uid: int | None = None, gid: int | None = None, tag: str = "new",
    dir_fd: int | None = None,
) -> None:
    """Replace ``path`` with ``data`` atomically; on any error the old file is untouched. With ``dir_fd`` (a
    descriptor of ``path``'s directory), the file is ``path``'s name in that directory, whatever path names now."""

    def fill(fd: int) -> None:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]

    _replace(path, tag, fill, mode=mode, uid=uid, gid=gid, dir_fd=dir_fd)


def _replace(path: Path, tag: str, fill: Callable[[int], None], *, mode: int = 0o644, uid: int | None = None,
             gid: int | None = None, dir_fd: int | None = None) -> None:
    """Write a temporary file beside ``path`` with ``fill(fd)``, fsync it and rename it over ``path``, all in
    one descriptor of its directory (``dir_fd``, else the directory ``path`` names, opened once)."""
    if dir_fd is None:
        held = open_dir(path.parent)
        try:
            _replace(path, tag, fill, mode=mode, uid=uid, gid=gid, dir_fd=held)
        finally:
            os.close(held)
        return
    name, tmp = path.name, temp_name(path, tag).name
    # a temp file (or FIFO, or link) already there may be another user's, in a directory like /tmp: it goes,
    # and the temp file is created anew, so no one else holds it open or waits on it
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=dir_fd)
    try:
        fd = open_beneath(dir_fd, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            fill(fd)
            os.fchmod(fd, mode)
            if uid is not None and gid is not None and (uid, gid) != (os.geteuid(), os.getegid()):
                with contextlib.suppress(PermissionError):
                    os.fchown(fd, uid, gid)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise
    fsync_at(dir_fd)


def remove_file(path: Path, *, dir_fd: int | None = None) -> None:
    """Remove ``path`` (absent is fine) and fsync its directory, both in one descriptor of that directory (``dir_fd``
    when given: ``path``'s name in that directory, whatever directory ``path`` names now)."""
    if dir_fd is not None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path.name, dir_fd=dir_fd)
        fsync_at(dir_fd)
        return
    try:
        fd = open_dir(path.parent)
    except FileNotFoundError:
        return
    try:
        remove_file(path, dir_fd=fd)
    finally:
        os.close(fd)


def make_dirs(path: Path) -> list[str]:
    """Create ``path`` and missing parents; return the directories created, outermost first."""
    missing: list[Path] = []
    p = path
    while not p.exists():
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    created: list[str] = []
    for d in reversed(missing):
        os.mkdir(d, 0o755)
        created.append(str(d))
    return created


class TargetBusy(OSError):
    """Another kvmtune is changing this file."""


def lock_target(path: Path) -> int:
    """An exclusive flock on the file ``path`` names (or on its directory, for a file not there yet),
    held until the returned fd is closed; the kernel drops it when kvmtune dies.

    Journal directories are per operator (sudo's default beside ``$KVMTUNE_JOURNAL_DIR``), so their
    locks cannot keep two ``fix --apply`` off one file; this lock is on the file itself. Taken before
    the snapshot, and checked to still be the file at ``path`` (an earlier fix may have renamed a new
    one into place), it makes the second fix see the first one's result: "changed since the plan"."""
    target = _lock_target(path)
    fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise TargetBusy(f"{path}: another kvmtune fix --apply or undo is changing it now") from None
        held, now = os.fstat(fd), os.stat(target)
        if (held.st_dev, held.st_ino) != (now.st_dev, now.st_ino):
            raise TargetBusy(f"{path}: replaced while kvmtune was locking it (another fix?); run kvmtune fix again")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _lock_target(path: Path) -> Path:
    target = path if os.path.lexists(path) else path.parent
    while not os.path.lexists(target) and target.parent != target:
        target = target.parent
    return target


def lock_targets(paths: list[Path]) -> list[int]:
    """:func:`lock_target` for each path, once per file (two new files in one directory share its lock)."""
    held: list[int] = []
    seen: set[tuple[int, int]] = set()
    try:
        for path in sorted(paths):
            try:
                st = os.stat(_lock_target(path))
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            held.append(lock_target(path))
    except BaseException:
        for fd in held:
            os.close(fd)
        raise
    return held
