"""The work directory and the scratch objects kvmtune creates in it.

``Scratch`` remembers every image, loop device and process it was told about
and releases them in reverse order in :meth:`Scratch.cleanup`, which the
benchmark drivers call from ``finally`` blocks (so Ctrl-C cleans up too).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import shutil
import signal
import stat
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Self

from kvmtune.errors import KvmtuneError
from kvmtune.runner import Runner

if TYPE_CHECKING:
    from kvmtune.lab.store import Owner  # imported where used: the store brings sqlite3


def default_workdir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kvmtune"


def default_db() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "kvmtune" / "results.db"


def ensure_dir(path: Path, what: str) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise KvmtuneError(f"{path}: cannot create {what} ({exc.strerror})") from None
    if not os.access(path, os.W_OK):
        raise KvmtuneError(f"{path}: {what} is not writable")
    return path


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def check_free_space(path: Path, needed: int, what: str) -> None:
    """Raise a one-line error when ``path``'s filesystem has less than ``needed`` bytes free."""
    free = free_bytes(path)
    if free < needed:
        raise KvmtuneError(f"{path}: scratch disk full: {what} needs {needed // (1 << 20)} MiB, {free // (1 << 20)} MiB free")


COALESCE_CHUNK = 256 << 20  # at most this much of a file is turned into unwritten extents before it is freed
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE, FALLOC_FL_ZERO_RANGE = 0x01, 0x02, 0x10  # linux/falloc.h


@functools.cache
def _libc_fallocate() -> Callable[[int, int, int, int], int]:
    """libc's ``fallocate``, loaded when first used: `kvmtune audit` imports this module for :func:`default_workdir`."""
    import ctypes

    fallocate = ctypes.CDLL(None, use_errno=True).fallocate
    fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
    return fallocate


def _fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    import ctypes

    if _libc_fallocate()(fd, mode, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def coalesce_extents(path: Path, punch: bool = True) -> bool:
    """Turn ``path``'s extents into few long ones before it is freed; False where the file system cannot.

    On a file system mounted with ``discard`` every freed extent costs one discard (ext4 without a journal,
    as this host's root file system, issues them one by one inside unlink: about 10,000 a second here). A
    sparse image written at random holds one extent per written block, a fresh qcow2 two per cluster (the
    4 KiB written, and the rest of the cluster, which QEMU zeroed with ``FALLOC_FL_ZERO_RANGE``: an
    unwritten extent). ``FALLOC_FL_ZERO_RANGE`` over a chunk makes its written extents unwritten and
    allocates its holes as unwritten, and ext4 merges neighbouring unwritten extents (up to 128 MiB each);
    punching the chunk (``punch``) then frees a few long extents. Measured here: a 16 GiB raw image after 100,000
    random 4 KiB writes took 195,000 discards and 17 s to delete, and 3,800 discards and about 1.2 s this
    way. Only metadata changes (no data is written), one chunk at a time, so the file never takes more than
    ``COALESCE_CHUNK`` more space than it did.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return False
        size = st.st_size
        for offset in range(0, size, COALESCE_CHUNK):
            length = min(COALESCE_CHUNK, size - offset)
            _fallocate(fd, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, offset, length)
            if punch:
                _fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.ENOSPC, errno.EINVAL):
            return False  # the unlink that follows frees what is left the ordinary way
        raise
    finally:
        os.close(fd)
    return True


def release_file(path: Path, coalesce: bool) -> None:
    """Delete one scratch file; ``coalesce`` (its file system discards freed extents) first merges its extents."""
    if coalesce:
        with contextlib.suppress(OSError):
            coalesce_extents(path)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


@dataclass
class Scratch:
    """Things to remove when a benchmark ends, however it ends."""

    root: Path
    runner: Runner
    _undo: list[tuple[str, Callable[[], None]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root = ensure_dir(self.root, "work directory")
        write_owner(self.root)  # so the next benchmark can tell a killed run's scratch from a live one's

    def path(self, name: str) -> Path:
        return self.root / name

    def inside(self, path: Path) -> Path:
        """``path`` resolved; raises unless it lies inside the work directory."""
        resolved = path.resolve()
        if self.root.resolve() not in resolved.parents:
            raise KvmtuneError(f"{path}: refusing to create a scratch file outside the work directory {self.root}")
        return resolved

    def add_file(self, path: Path) -> Path:
        resolved = self.inside(path)

        def rm() -> None:
            with contextlib.suppress(FileNotFoundError):
                resolved.unlink()

        self._undo.append((f"file {resolved}", rm))
        return path

    def add_dir(self, path: Path) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        self._undo.append((f"dir {path}", lambda: shutil.rmtree(path, ignore_errors=True)))
        return path

    def add_loop(self, device: str) -> None:
        def detach() -> None:
            self.runner.run(["losetup", "-d", device], timeout=30)

        self._undo.append((f"loop {device}", detach))

    def add_undo(self, what: str, undo: Callable[[], None]) -> None:
        """Anything else to undo (an unmount, a volume group), newest first like the rest."""
        self._undo.append((what, undo))

    def add_process(self, proc: subprocess.Popen[bytes]) -> None:
        self._undo.append((f"process {proc.pid}", lambda: stop_process(proc)))

    def mark(self) -> int:
        """A point to :meth:`cleanup` back to, for things that end before the run does."""
        return len(self._undo)

    def cleanup(self, to_mark: int = 0) -> list[str]:
        """Undo everything added since ``to_mark`` (default: everything), newest first; return what failed."""
        problems: list[str] = []
        while len(self._undo) > to_mark:
            what, undo = self._undo.pop()
            try:
                undo()
            except Exception as exc:  # cleanup must go on
                problems.append(f"{what}: {exc}")
        return problems

    def remove_if_empty(self) -> None:
        """The scratch directory itself, once nothing but its owner mark is left (a refused run leaves none behind)."""
        with contextlib.suppress(OSError):
            if {p.name for p in self.root.iterdir()} <= {OWNER_FILE}:
                (self.root / OWNER_FILE).unlink(missing_ok=True)
                self.root.rmdir()


OWNER_FILE = "owner.json"


def write_owner(directory: Path) -> None:
    """Mark ``directory`` as this process's (atomically: a reader sees no file or a whole one)."""
    from kvmtune.lab.store import Owner

    owner = Owner.this_process()
    tmp = directory / f".{OWNER_FILE}.tmp"
    tmp.write_text(json.dumps({"pid": owner.pid, "start": owner.start, "boot": owner.boot}))
    tmp.replace(directory / OWNER_FILE)


def read_owner(directory: Path) -> Owner | None:
    try:
        doc = json.loads((directory / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("pid"), int):
        return None
    from kvmtune.lab.store import Owner

    return Owner(doc["pid"], str(doc.get("start") or ""), str(doc.get("boot") or ""))


def stop_process(proc: subprocess.Popen[bytes], grace: float = 2.0) -> None:
    """Terminate ``proc`` (and nothing else); SIGKILL after ``grace`` seconds."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(timeout=10)


class Started:
    """A context manager over :meth:`start` and :meth:`close`: entering starts it, and a start that fails or is
    interrupted (Ctrl-C) closes what it had made before the error goes on; leaving closes it."""

    def start(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
