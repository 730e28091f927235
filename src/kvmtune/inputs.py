"""Files named on the command line or found in a directory walk: regular files only, read with a bound.

A FIFO, socket or device is refused after ``stat`` and never opened (opening a FIFO blocks until a
writer comes; ``/dev/zero`` never ends). The open itself uses ``O_NONBLOCK`` and checks with
``fstat`` that it got the same regular file, so a path swapped between the two steps is refused
too. Reads stop at the limit plus one byte, so a 3 GiB file costs one buffer of limit + 1 bytes.

Walks follow symbolic links to directories once each: a link back to a directory already walked (a
loop) is reported and not entered; a directory that cannot be listed is reported, not skipped.

Files that tell root what to do (settings files, journals) are reached through directory descriptors:
:func:`open_dir` walks a path from ``/`` one component at a time (``O_NOFOLLOW``: a symbolic link anywhere
is refused), ``fstat``-ing each directory it holds, and :func:`read_private` opens the file once, relative
to the last of them, and reads what it checked. :func:`open_beneath` opens a path below a directory
descriptor with ``openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS)`` where the kernel has it, and the same
``O_NOFOLLOW`` walk otherwise.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field

from kvmtune.errors import InputError

CHUNK = 1024 * 1024


def kind_of(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def _os_error(path: str, exc: OSError) -> InputError:
    if isinstance(exc, FileNotFoundError):
        return InputError(path, "no such file")
    if isinstance(exc, PermissionError):
        return InputError(path, "not readable (permission denied)")
    return InputError(path, exc.strerror or str(exc))


def check_regular(path: str) -> os.stat_result:
    """``stat`` ``path``; :class:`InputError` unless it is a regular file. Never opens it."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise _os_error(path, exc) from None
    if stat.S_ISDIR(st.st_mode):
        raise InputError(path, "is a directory")
    if not stat.S_ISREG(st.st_mode):
        raise InputError(path, f"not a regular file ({kind_of(st.st_mode)}); not opened")
    return st


def read_regular(path: str, limit: int, what: str = "") -> bytes:
    """At most ``limit`` bytes of a regular file; :class:`InputError` when it is larger or not regular."""
    before = check_regular(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise _os_error(path, exc) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
            raise InputError(path, "replaced while being opened; not read")
    except BaseException:
        os.close(fd)
        raise
    return _read_fd(fd, st, path, limit, what)


def check_private(path: str, st: os.stat_result, what: str) -> None:
    """:class:`InputError` unless ``st`` (of ``path``) is owned by the invoking user (euid) and not writable by
    group or others: what another user could have written is not trusted to say what root should do."""
    if st.st_uid != os.geteuid():
        raise InputError(path, f"{what} owned by uid {st.st_uid}, not by the invoking user (uid {os.geteuid()}); "
                         "refused")
    if st.st_mode & 0o022:
        raise InputError(path, f"{what} writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}); refused")


def check_ancestor(path: str, directory: str, st: os.stat_result, child: os.stat_result) -> None:
    """:class:`InputError` (naming ``path``) unless only root and the invoking user can change what the
    directory ``directory`` (``st``) holds: owned by one of them and not writable by group or others, except a
    sticky directory (``/tmp``) whose entry ``child`` is root's or the invoking user's own (no one else may
    rename or remove it there)."""
    mine = (0, os.geteuid())
    if st.st_uid not in mine:
        raise InputError(path, f"directory {directory} owned by uid {st.st_uid}, neither root nor the invoking user "
                         f"(uid {os.geteuid()}); refused")
    if st.st_mode & 0o022 and not (st.st_mode & stat.S_ISVTX and child.st_uid in mine):
        sticky = f", its entry owned by uid {child.st_uid}" if st.st_mode & stat.S_ISVTX else ""
        raise InputError(path, f"directory {directory} writable by group or others "
                         f"(mode {stat.S_IMODE(st.st_mode):04o}{sticky}); refused")


_DIR = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_dir(path: str, *, create: int | None = None,
             check: Callable[[str, os.stat_result, os.stat_result], None] | None = None, shown: str = "") -> int:
    """An ``O_PATH`` descriptor of the directory ``path``, reached from ``/`` one component at a time without
    following a symbolic link; the caller closes it.

    ``check(directory, st, child_st)`` sees every directory on the way with the entry opened in it (the same
    descriptors the walk goes on from, so no one can swap a component between the check and the use).
    With ``create`` (a mode), missing components are made. :class:`InputError` names ``shown`` (default
    ``path``): a link, a non-directory, a missing one."""
    fd = os.open("/", _DIR)
    here = "/"
    try:
        st = os.fstat(fd)
        for name in os.path.join(os.getcwd(), path).split("/"):
            if name in ("", "."):
                continue
            try:
                child = _open_component(fd, name, create)
            except OSError as exc:
                raise _component_error(shown or path, os.path.join(here, name), fd, name, exc) from None
            child_st = os.fstat(child)
            try:
                if check is not None:
                    check(here, st, child_st)
            except BaseException:
                os.close(child)
                raise
            os.close(fd)
            fd, st = child, child_st
            here = os.path.normpath(os.path.join(here, name))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_component(fd: int, name: str, create: int | None) -> int:
    try:
        return os.open(name, _DIR, dir_fd=fd)
    except FileNotFoundError:
        if create is None:
            raise
    with suppress(FileExistsError):
        os.mkdir(name, create, dir_fd=fd)
    return os.open(name, _DIR, dir_fd=fd)


def _component_error(path: str, where: str, fd: int, name: str, exc: OSError) -> InputError:
    try:
        link = stat.S_ISLNK(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
    except OSError:
        link = False
    if link:
        return InputError(path, f"{where} is a symbolic link; not followed")
    if exc.errno == errno.ENOTDIR:
        return InputError(path, f"{where} is not a directory")
    if isinstance(exc, FileNotFoundError):
        return MissingPath(path, f"no such file or directory ({where})")
    return _os_error(path, exc)


class MissingPath(InputError):
    """:func:`open_dir` found a component of the path missing."""


# openat2(2): Linux 5.6; the same number on every architecture (system calls added since 4.20 share them)
SYS_OPENAT2 = 437
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


class _Openat2:
    """The system call through libc's ``syscall`` (Python has no ``os.openat2``); ``usable`` goes False once the
    kernel (or a seccomp filter: ``EPERM``) refuses the call itself, and a test sets it to try the walk."""

    usable = True
    _libc: ctypes.CDLL | None = None

    @classmethod
    def open(cls, dir_fd: int, rel: str, flags: int, mode: int) -> int | None:
        if not cls.usable:
            return None
        if cls._libc is None:
            cls._libc = ctypes.CDLL(None, use_errno=True)
        creating = flags & os.O_CREAT or flags & os.O_TMPFILE == os.O_TMPFILE
        how = _OpenHow(flags, mode if creating else 0, RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)
        fd = cls._libc.syscall(ctypes.c_long(SYS_OPENAT2), ctypes.c_int(dir_fd), ctypes.c_char_p(os.fsencode(rel)),
                               ctypes.byref(how), ctypes.c_size_t(ctypes.sizeof(how)))
        if fd >= 0:
            return int(fd)
        err = ctypes.get_errno()
        if err in (errno.ENOSYS, errno.EPERM):
            cls.usable = False
            return None
        raise OSError(err, os.strerror(err), rel)


def open_beneath(dir_fd: int, rel: str, flags: int, mode: int = 0o600) -> int:
    """Open ``rel`` below the directory ``dir_fd``: no component a symbolic link, no ``..``, not absolute.
    ``openat2`` where the kernel has it, else an ``O_NOFOLLOW`` walk; ``O_CLOEXEC`` always.
    An :class:`OSError` (``ELOOP``, ``EXDEV``, ``ENOTDIR``...) when ``rel`` cannot be reached that way."""
    flags |= os.O_CLOEXEC
    parts = rel.split("/")
    if rel.startswith("/") or ".." in parts:  # refused by both ways alike (openat2 takes a ".." that stays below)
        raise OSError(errno.EXDEV, "leads out of its directory", rel)
    fd = _Openat2.open(dir_fd, rel, flags, mode)
    if fd is not None:
        return fd
    names = [p for p in parts if p not in ("", ".")] or ["."]
    here = dir_fd
    try:
        for name in names[:-1]:
            nxt = os.open(name, _DIR, dir_fd=here)
            if here != dir_fd:
                os.close(here)
            here = nxt
        return os.open(names[-1], flags | os.O_NOFOLLOW, mode, dir_fd=here)
    finally:
        if here != dir_fd:
            os.close(here)


def read_private(path: str, limit: int, what: str = "", noun: str = "a file",
                 check: Callable[[str, os.stat_result], None] | None = None, *, dir_fd: int | None = None) -> bytes:
    """At most ``limit`` bytes of a regular file that only the invoking user (``check``: another rule, given
    the path and the descriptor's ``fstat``) can have written, opened once and read from that descriptor.

    Reached through :func:`open_dir` (no symbolic link on the way, every directory above it one only root
    and the invoking user can change, :func:`check_ancestor`), or in ``dir_fd`` (a descriptor of its
    directory the caller reached so), then opened relative to its directory: not a link (``O_NOFOLLOW``),
    not a FIFO or device (``O_NONBLOCK``, then ``fstat``), passing ``check`` (default: :func:`check_private`),
    and no larger than ``limit``."""
    directory, name = os.path.split(os.path.join(os.getcwd(), path))
    if dir_fd is None:
        held = open_dir(directory, check=ancestor_rule(path), shown=path)
        try:
            return read_private(path, limit, what, noun, check, dir_fd=held)
        finally:
            os.close(held)
    try:
        fd = open_beneath(dir_fd, name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EXDEV):
            raise InputError(path, "a symbolic link; not followed") from None
        raise _os_error(path, exc) from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise InputError(path, "is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise InputError(path, f"not a regular file ({kind_of(st.st_mode)}); not read")
        check_ancestor(path, directory, os.fstat(dir_fd), st)
        if check is None:
            check_private(path, st, noun)
        else:
            check(path, st)
    except BaseException:
        os.close(fd)
        raise
    return _read_fd(fd, st, path, limit, what)


def ancestor_rule(path: str) -> Callable[[str, os.stat_result, os.stat_result], None]:
    """:func:`check_ancestor` for :func:`open_dir`'s ``check``, naming ``path``."""
    def rule(directory: str, st: os.stat_result, child: os.stat_result) -> None:
        check_ancestor(path, directory, st, child)
    return rule


def _read_fd(fd: int, st: os.stat_result, path: str, limit: int, what: str) -> bytes:
    """Read ``fd`` (a regular file, ``st`` its fstat) up to ``limit`` bytes, then close it."""
    try:
        if st.st_size > limit:
            raise InputError(path, f"larger than {_size(limit)}{what}, refused")
        parts: list[bytes] = []
        left = limit + 1
        # a file that fstat sizes (not procfs: 0) is asked for one byte more than that: getting exactly
        # its size back is its end, without another read to be told so (one syscall per corpus file)
        want = st.st_size + 1 if 0 < st.st_size < CHUNK else CHUNK
        while left > 0:
            chunk = os.read(fd, min(want, left))
            if not chunk:
                break
            parts.append(chunk)
            left -= len(chunk)
            if len(chunk) == st.st_size and len(parts) == 1 and want > st.st_size:
                break
            want = CHUNK
    except OSError as exc:
        raise _os_error(path, exc) from None
    finally:
        os.close(fd)
    data = b"".join(parts)
    if len(data) > limit:  # grew after fstat (procfs files report size 0)
        raise InputError(path, f"larger than {_size(limit)}{what}, refused")
    return data


def _size(n: int) -> str:
    return f"{n // (1024 * 1024)} MiB" if n >= 1024 * 1024 else f"{n} bytes"


@dataclass
class Walk:
    files: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # one line each, naming the path


def walk_files(top: str, wanted: Callable[[str], bool], *, allow_block: bool = False) -> Walk:
    """Regular files below ``top`` whose name ``wanted`` accepts, sorted; odd entries reported in ``problems``."""
    result = Walk()
    try:
        st = os.stat(top)
    except OSError as exc:
        result.problems.append(str(_os_error(top, exc)))
        return result
    seen: set[tuple[int, int]] = {(st.st_dev, st.st_ino)}
    _walk(top, wanted, seen, result, allow_block)
    result.files.sort()
    return result


def _walk(
    directory: str, wanted: Callable[[str], bool], seen: set[tuple[int, int]], result: Walk, allow_block: bool
) -> None:
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError as exc:
        result.problems.append(f"{directory}: cannot list the directory ({exc.strerror or exc}); skipped")
        return
    for entry in entries:
        path = entry.path
        try:
            st = os.stat(path)  # follows links: a link is walked as what it points to
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                result.problems.append(f"{path}: symbolic link loop; not followed")
            elif entry.is_symlink() and exc.errno == errno.ENOENT:
                if wanted(entry.name):
                    result.problems.append(f"{path}: dangling symbolic link")
            else:
                result.problems.append(str(_os_error(path, exc)))
            continue
        if stat.S_ISDIR(st.st_mode):
            key = (st.st_dev, st.st_ino)
            if key in seen:
                result.problems.append(f"{path}: symbolic link loop (a directory already walked); not followed")
                continue
            seen.add(key)
            _walk(path, wanted, seen, result, allow_block)
        elif not wanted(entry.name):
            continue
        elif stat.S_ISREG(st.st_mode) or (allow_block and stat.S_ISBLK(st.st_mode)):
            result.files.append(path)
        else:
            result.problems.append(f"{path}: not a regular file ({kind_of(st.st_mode)}); not opened")
