"""``HostRoot``: the only way kvmtune reads /proc, /sys, /etc and /dev.

Tests point it at a fixture tree (``HostRoot("tests/fixtures/hosts/nvme")``);
production uses ``HostRoot("/")``. Paths given to it are absolute host paths
("/proc/meminfo"); it maps them below its root. Nothing here writes.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

CHUNK = 64 * 1024


def _read_limited(fh: BinaryIO, limit: int) -> bytes:
    """Read up to ``limit`` bytes in modest chunks.

    One huge read() fails on /proc/sys files with ENOMEM (the kernel allocates a
    buffer of the requested size), so read the way ``cat`` does.
    """
    parts: list[bytes] = []
    left = limit
    while left > 0:
        chunk = fh.read(min(CHUNK, left))
        if not chunk:
            break
        parts.append(chunk)
        left -= len(chunk)
    return b"".join(parts)


class HostReadError(Exception):
    """A host file that is absent, unreadable or not text. ``str()`` names it."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}")


@dataclass
class HostRoot:
    path: str = "/"
    reads: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._root = Path(self.path)
        # resolved once: live sampling reads thousands of files a second through here
        self._live = self._root.resolve() == Path("/")
        self._top = os.path.realpath(self._root)

    @property
    def is_live(self) -> bool:
        return self._live

    def _map(self, host_path: str) -> Path:
        if not host_path.startswith("/"):
            raise ValueError(f"host paths are absolute, got {host_path!r}")
        return self._root / host_path.lstrip("/")

    def beneath(self, host_path: str) -> Path:
        """The mapped path; :class:`HostReadError` when a tree's symbolic link leads out of the tree."""
        mapped = self._map(host_path)
        if self.is_live:
            return mapped
        top = self._top
        real = os.path.realpath(mapped)
        if real != top and not real.startswith(top.rstrip("/") + "/"):
            raise HostReadError(host_path, f"leads out of the host root {self.path} (to {real}); not followed")
        return mapped

    def _open_regular(self, host_path: str, *, nofollow: bool = False) -> BinaryIO:
        """Open a regular file without blocking: a FIFO or device in a tree is refused, not waited on; ``nofollow``:
        a symbolic link as the last component is refused by the open itself (``O_NOFOLLOW``), so a link swapped in
        after any earlier look is never followed."""
        flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY | (os.O_NOFOLLOW if nofollow else 0)
        try:
            fd = os.open(self.beneath(host_path), flags)
        except OSError as exc:
            if nofollow and exc.errno == errno.ELOOP:
                raise HostReadError(host_path, "a symbolic link; not followed") from None
            raise
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(host_path)
            raise HostReadError(host_path, "not a regular file; not read")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")

    def open_regular(self, host_path: str, *, nofollow: bool = False) -> BinaryIO:
        """An open regular file to read as it grows (a QEMU's stderr log); :class:`HostReadError` otherwise."""
        self.reads.append(host_path)
        try:
            return self._open_regular(host_path, nofollow=nofollow)
        except HostReadError:
            raise
        except OSError as exc:
            raise HostReadError(host_path, exc.strerror or str(exc)) from None

    def read_text(self, host_path: str, limit: int = 4 * 1024 * 1024) -> str:
        """Return the file's text; raise :class:`HostReadError` with the reason."""
        self.reads.append(host_path)
        try:
            with self._open_regular(host_path) as fh:
                data = _read_limited(fh, limit)
        except FileNotFoundError:
            raise HostReadError(host_path, "absent") from None
        except PermissionError:
            raise HostReadError(host_path, "not readable (permission denied)") from None
        except IsADirectoryError:
            raise HostReadError(host_path, "is a directory") from None
        except OSError as exc:
            raise HostReadError(host_path, exc.strerror or str(exc)) from None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return data.decode("latin-1")

    def read_optional(self, host_path: str) -> str | None:
        """Like :meth:`read_text` but ``None`` when absent or unreadable."""
        try:
            return self.read_text(host_path)
        except HostReadError:
            return None

    def read_bytes(self, host_path: str, limit: int = 1024 * 1024) -> bytes | None:
        self.reads.append(host_path)
        try:
            with self._open_regular(host_path) as fh:
                return _read_limited(fh, limit)
        except (OSError, HostReadError):
            return None

    def exists(self, host_path: str) -> bool:
        return os.path.lexists(self._map(host_path))

    def is_dir(self, host_path: str) -> bool:
        return self._map(host_path).is_dir()

    def access(self, host_path: str, mode: int) -> bool:
        """``os.access`` on the mapped path (meaningful mostly on a live root)."""
        return os.access(self._map(host_path), mode)

    def listdir(self, host_path: str) -> list[str]:
        try:
            return sorted(os.listdir(self._map(host_path)))
        except OSError:
            return []

    def readlink(self, host_path: str) -> str | None:
        try:
            return os.readlink(self._map(host_path))
        except OSError:
            return None

    def owner(self, host_path: str) -> tuple[int, int] | None:
        """(uid, gid) owning the path (for /proc/PID: the process's owner), without opening it."""
        try:
            st = os.stat(self._map(host_path))
        except OSError:
            return None
        return st.st_uid, st.st_gid

    def glob(self, pattern: str) -> Iterator[str]:
        """Yield host paths matching ``pattern`` (an absolute glob)."""
        base = self._root
        for p in sorted(base.glob(pattern.lstrip("/"))):
            yield "/" + str(p.relative_to(base))
