"""Files named on the command line or found in a directory walk: regular files only, read with a bound.

A FIFO, socket or device is refused after ``stat`` and never opened (opening a FIFO blocks until a
writer comes; ``/dev/zero`` never ends). The open itself uses ``O_NONBLOCK`` and checks with
``fstat`` that it got the same regular file, so a path swapped between the two steps is refused
too. Reads stop at the limit plus one byte, so a 3 GiB file costs one buffer of limit + 1 bytes.

Walks follow symbolic links to directories once each: a link back to a directory already walked (a
loop) is reported and not entered; a directory that cannot be listed is reported, not skipped.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
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


def read_private(path: str, limit: int, what: str = "", noun: str = "a file") -> bytes:
    """At most ``limit`` bytes of a regular file that only the invoking user can have written.

    Not a symbolic link (``O_NOFOLLOW``), not a FIFO or device (``O_NONBLOCK``, then ``fstat``), owned by the
    effective uid and not group- or other-writable (:func:`check_private`), and no larger than ``limit``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InputError(path, "a symbolic link; not followed") from None
        raise _os_error(path, exc) from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise InputError(path, "is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise InputError(path, f"not a regular file ({kind_of(st.st_mode)}); not read")
        check_private(path, st, noun)
    except BaseException:
        os.close(fd)
        raise
    return _read_fd(fd, st, path, limit, what)


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
