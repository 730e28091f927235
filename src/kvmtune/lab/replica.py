"""Scratch replicas: disks kvmtune makes to measure a configuration on, never a guest's own.

A :class:`Layout` is what QEMU is told about one disk (format, qcow2 cluster size, preallocation, cache, AIO,
discard), every field an enumeration of :mod:`kvmtune.qemuopts`; :func:`create_replica` makes an empty disk of
that layout with ``qemu-img``. Replicas live in ``.kvmtune-verify-*`` directories (:func:`make_scratch_dir`)
that name their owner process, so :func:`sweep_leftovers` removes what a killed run left. The block tier of
``verify`` serves them through qemu-storage-daemon, the probe-guest pair (:mod:`kvmtune.lab.probe.pair`) boots on them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path

from kvmtune.errors import KvmtuneError
from kvmtune.qemuopts import (
    CACHE_MODES,
    Aio,
    Cache,
    CacheMode,
    Discard,
    ImageFormat,
    Preallocation,
    enum_value,
    file_argument,
    keyval,
    unknown_line,
)
from kvmtune.runner import Runner

SCRATCH_PREFIX = ".kvmtune-verify-"
OWNER = "owner"
DEFAULT_CLUSTER = 65536


class Unreplicable(KvmtuneError):
    """This disk's configuration cannot be copied onto a scratch replica; ``str()`` says why."""


@dataclass(frozen=True)
class Layout:
    """What QEMU is told about one disk: the part of its configuration that the fixes change.

    Every field that reaches an option string is an enumeration of :mod:`kvmtune.qemuopts`: a word given
    here (a rule's ``layout``) is checked against it, and one QEMU does not know is :class:`Unreplicable`.
    """

    format: ImageFormat = ImageFormat.RAW
    cluster_size: int | None = None  # qcow2 only
    preallocation: Preallocation = Preallocation.OFF
    cache: Cache = Cache.DEFAULT  # none | writethrough | writeback | directsync | unsafe | default (= writeback)
    io: Aio = Aio.THREADS  # threads | native | io_uring
    discard: Discard = Discard.IGNORE  # ignore | unmap

    def __post_init__(self) -> None:
        for name, kind in _LAYOUT_KINDS.items():
            raw = getattr(self, name)
            value = enum_value(kind, raw) if isinstance(raw, str) else None
            if value is None:
                raise Unreplicable(unknown_line(kind, str(raw)))
            object.__setattr__(self, name, value)
        if self.cluster_size is not None and (not isinstance(self.cluster_size, int) or isinstance(self.cluster_size, bool)):
            raise Unreplicable(f"cluster size {self.cluster_size!r} is not a number")

    def describe(self) -> str:
        fmt = str(self.format)
        if self.format == "qcow2":
            fmt += f" ({(self.cluster_size or DEFAULT_CLUSTER) // 1024} KiB clusters, preallocation {self.preallocation})"
        elif self.preallocation != "off":
            fmt += f" (preallocation {self.preallocation})"
        return f"{fmt}, cache {self.cache}, io {self.io}, discard {self.discard}"

    def changes_to(self, other: Layout) -> str:
        parts = []
        for name in ("format", "cluster_size", "preallocation", "cache", "io", "discard"):
            a, b = getattr(self, name), getattr(other, name)
            if a != b:
                parts.append(f"{name.replace('_', ' ')} {a or 'default'} → {b or 'default'}")
        return ", ".join(parts) or "no change"

    # the cache mode as libvirt hands it to QEMU: the storage bench's block tier holds the one table
    @property
    def mode(self) -> CacheMode:
        if self.cache == Cache.DEFAULT:
            return CACHE_MODES["writeback"]  # QEMU's default
        return CACHE_MODES[self.cache]

    @property
    def direct(self) -> bool:
        return self.mode.direct

    @property
    def no_flush(self) -> bool:
        return self.mode.no_flush

    @property
    def writethrough(self) -> bool:
        return not self.mode.write_cache

    @property
    def starts(self) -> bool:
        """Does QEMU open this disk? aio=native needs O_DIRECT (QEMU's raw_open_common: "aio=native was
        specified, but it requires cache.direct=on"; the check of the disk-io-native-cached rule)."""
        return self.io != "native" or self.direct

    def nearest_valid(self) -> Layout:
        """The closest layout QEMU opens: io=native without O_DIRECT becomes io=threads (what nova does)."""
        return self if self.starts else replace(self, io=Aio.THREADS)


_LAYOUT_KINDS: dict[str, type[StrEnum]] = {
    "format": ImageFormat, "preallocation": Preallocation, "cache": Cache, "io": Aio, "discard": Discard,
}


def create_replica(runner: Runner, path: Path, lay: Layout, size: int) -> None:
    cluster = (lay.cluster_size or DEFAULT_CLUSTER) if lay.format == ImageFormat.QCOW2 else None
    opts = keyval(("preallocation", lay.preallocation), ("cluster_size", cluster))
    res = runner.run(["qemu-img", "create", "-q", "-f", lay.format, "-o", opts, file_argument("path", path), str(size)],
                     timeout=120)
    if not res.ok:
        raise KvmtuneError(f"cannot create the scratch replica {path}: {res.describe_failure()}")


def make_scratch_dir(parent: Path) -> Path:
    """A ``.kvmtune-verify-*`` directory in ``parent`` holding an ``owner`` file with this process's pid."""
    try:
        path = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=parent))
        (path / OWNER).write_text(f"{os.getpid()}\n")
    except OSError as exc:
        raise KvmtuneError(f"{parent}: cannot make a scratch directory ({exc.strerror})") from None
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_leftovers(parents: Iterable[Path]) -> list[str]:
    """Remove scratch directories a killed verify left in ``parents`` (their owner process is gone)."""
    removed = []
    for parent in dict.fromkeys(parents):
        with contextlib.suppress(OSError):
            for entry in parent.iterdir():
                if not entry.name.startswith(SCRATCH_PREFIX) or entry.is_symlink() or not entry.is_dir():
                    continue
                try:
                    pid = int((entry / OWNER).read_text().strip())
                except (OSError, ValueError):
                    continue  # not one of ours, or still being made
                if pid != os.getpid() and not _alive(pid):
                    shutil.rmtree(entry, ignore_errors=True)
                    removed.append(str(entry))
    return removed
