"""The storage matrix: configurations, their validation, and the presets."""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from kvmtune.errors import InputError
from kvmtune.lab.storage.fio import Workload, cycle_workload, ffsb_workloads, lookup

BUSES = ("virtio-blk", "virtio-scsi", "ide", "nvme")
CACHES = ("none", "writeback", "writethrough", "directsync", "unsafe")
AIOS = ("threads", "native", "io_uring")
FORMATS = ("raw", "qcow2")
PREALLOCS = ("off", "metadata", "falloc", "full")
# file: an image file in the work dir; block: a loop device kvmtune creates over a
# scratch file; host: fio on the host itself (the bare-metal baseline, no guest);
# device: a block device the user named with the destructive-test flag
TARGETS = ("file", "block", "host", "device")
SCHEDS = ("default", "none", "mq-deadline", "bfq", "kyber")
# the file system under the image: the work directory's, or a scratch one the block tier makes (--host-fs)
HOST_FS = ("workdir", "ext4", "xfs", "btrfs", "lvm")


@dataclass(frozen=True)
class Dimension:
    """One axis a storage cell varies along: its :class:`StorageConfig` field, the ``bench storage`` option
    that sets it, the values it may take and its default."""

    field: str
    option: str  # --OPTION on `kvmtune bench storage`
    values: tuple[str, ...]
    default: str
    help: str


# Every dimension, in the order a report's charts and tables name them. The matrix, the cell key, the CLI
# options and the report all read this list; a new dimension is one row here, one field in StorageConfig,
# and its place in StorageConfig.key (tests/bench/test_storage_matrix_unit.py checks all three agree).
DIMENSIONS: tuple[Dimension, ...] = (
    Dimension("bus", "bus", BUSES, "virtio-blk", "guest disk bus"),
    Dimension("fmt", "image-format", FORMATS, "raw", "image format"),
    Dimension("prealloc", "prealloc", PREALLOCS, "off", "image preallocation"),
    Dimension("cache", "cache", CACHES, "none", "QEMU cache mode"),
    Dimension("aio", "aio", AIOS, "threads", "QEMU I/O backend"),
    Dimension("target", "target", TARGETS, "file", "what the disk is"),
    Dimension("sched", "sched", SCHEDS, "default", "guest I/O scheduler"),
    Dimension("host_fs", "host-fs", HOST_FS, "workdir", "block tier: scratch file system under the image"),
)
# the order build_matrix sweeps the dimensions in (outermost first): one target's cells together
SWEEP = ("target", "bus", "fmt", "prealloc", "cache", "aio", "sched")


def dimension(name: str) -> Dimension:
    return next(d for d in DIMENSIONS if d.field == name)


@dataclass(frozen=True, kw_only=True)
class StorageConfig:
    bus: str = "virtio-blk"
    cache: str = "none"
    aio: str = "threads"
    fmt: str = "raw"
    prealloc: str = "off"
    target: str = "file"
    sched: str = "default"
    tier: str = "guest"  # guest | quick | block: how the configuration was driven (never mixed in comparisons)
    host_fs: str = "workdir"  # the file system under the image: the work directory's, or a scratch ext4/xfs/btrfs/lvm

    @property
    def key(self) -> str:
        fs = f"/fs-{self.host_fs}" if self.host_fs != "workdir" else ""
        if self.target == "host":
            return "host/bare-metal" + fs
        bus = "qemu-img" if self.bus == "none" else self.bus  # --quick: the block layer alone
        k = f"{bus}/{self.fmt}-{self.prealloc}/{self.cache}/{self.aio}"
        if self.target != "file":
            k += f"/{self.target}"
        if self.sched != "default":
            k += f"/sched-{self.sched}"
        return k + fs

    def as_dict(self) -> dict[str, str]:
        return asdict(self)

    def problem(self) -> str | None:
        """Why QEMU cannot run this combination, in one line; None when it can."""
        if self.aio == "native" and self.cache not in ("none", "directsync"):
            return f"impossible combination: aio=native needs O_DIRECT (cache=none or directsync), not cache={self.cache}"
        if self.fmt == "raw" and self.prealloc == "metadata":
            return "impossible combination: preallocation=metadata exists only for qcow2, not raw"
        if self.target in ("block", "device") and (self.fmt != "raw" or self.prealloc != "off"):
            return "impossible combination: the block target is a whole device, use format=raw prealloc=off"
        return None


# what users type for the bus they mean
BUS_ALIASES = {"virtio": "virtio-blk", "vd": "virtio-blk", "scsi": "virtio-scsi"}


def block_default_aio(cache: str) -> str:
    """The block tier's I/O backend for a cache mode when ``--aio`` is not given: native where the cache mode opens
    with O_DIRECT (seed 000's recommended none/native), threads where native is impossible."""
    return "native" if cache in ("none", "directsync") else "threads"


def _check(kind: str, values: Sequence[str], allowed: Sequence[str]) -> None:
    for v in values:
        if v not in allowed:
            close = difflib.get_close_matches(v, allowed, n=2, cutoff=0.5)
            hint = f"; did you mean {' or '.join(close)}?" if close else ""
            raise InputError(f"--{kind}", f"unknown {kind} {v!r} (choose from {', '.join(allowed)}){hint}")


def build_matrix(choices: Mapping[str, Sequence[str]]) -> list[StorageConfig]:
    """Every combination of the values given per dimension (``{"cache": ["none", "writeback"], …}``, by
    :class:`StorageConfig` field; a dimension not given takes its default), invalid ones included (they
    are reported, not silently dropped), except that a host (bare-metal) target appears once and, when
    several formats are asked for at once, each preallocation goes with the format it belongs to."""
    unknown = sorted(set(choices) - set(SWEEP))
    if unknown:
        raise ValueError(f"build_matrix: not a swept dimension: {', '.join(unknown)}")
    given = {d.field: list(choices.get(d.field) or (d.default,)) for d in DIMENSIONS if d.field in SWEEP}
    given["bus"] = [BUS_ALIASES.get(b, b) for b in given["bus"]]
    for d in DIMENSIONS:
        if d.field in given:
            _check(d.option, given[d.field], d.values)
    formats, preallocs = given["fmt"], given["prealloc"]
    out: list[StorageConfig] = []
    seen: set[str] = set()
    for values in itertools.product(*(given[name] for name in SWEEP)):
        cfg = StorageConfig(**dict(zip(SWEEP, values, strict=True)))
        t, f, p = cfg.target, cfg.fmt, cfg.prealloc
        # a preallocation list naming both formats' kinds (metadata is qcow2's, falloc/full are raw's)
        # pairs each with its own format; an explicit impossible request (--image-format raw --prealloc
        # metadata, or off,metadata) still reaches the matrix and is reported as an error
        per_format = "metadata" in preallocs and any(x in ("falloc", "full") for x in preallocs)
        if (f == "raw" and p == "metadata" and (per_format or "qcow2" in formats)) or (
            f == "qcow2" and p in ("falloc", "full") and per_format
        ):
            continue
        if t in ("block", "device") and len(formats) > 1 and f != "raw":
            continue
        if cfg.key in seen:
            continue
        seen.add(cfg.key)
        out.append(cfg)
    return out


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    configs: list[StorageConfig]
    workloads: list[Workload]
    dims: dict[str, tuple[str, ...]] = field(default_factory=dict)  # by StorageConfig field, for build_matrix


def preset(name: str, ffsb_threads: Sequence[int] = (1, 8, 16), cycle_mib: int = 64, cycle_idle_s: float = 3.0) -> Preset:
    if name == "seed-003":
        dims = {
            "bus": ("ide", "virtio-blk"),
            "cache": ("none", "writethrough", "writeback"),
            "aio": ("threads",),
            "fmt": ("raw", "qcow2"),
            "prealloc": ("off", "metadata", "full"),
        }
        return Preset(
            name,
            "raw/qcow2 × preallocation × cache none/writethrough/writeback, IDE and virtio (seed:003)",
            [],
            lookup(["fs-randwrite-4k", "randwrite-4k"]),
            dims,
        )
    if name == "seed-001":
        dims = {
            "bus": ("ide", "virtio-blk", "virtio-scsi"),
            "cache": ("none",),
            "aio": ("threads",),
            "fmt": ("qcow2",),
            "prealloc": ("off",),
        }
        return Preset(
            name,
            "bus comparison and the boot-write-shutdown cycle: transactions/s per VM, VMs per disk (seed:001)",
            [],
            [*lookup(["randwrite-4k", "seqwrite-1m"]), cycle_workload(cycle_mib, cycle_idle_s)],
            dims,
        )
    if name == "ffsb":
        dims = {
            "bus": ("virtio-blk", "ide"),
            "cache": ("none",),
            "aio": ("native",),
            "fmt": ("raw",),
            "prealloc": ("off",),
        }
        return Preset(
            name,
            "seed 000's FFSB operations: 8 KiB blocks, 1/8/16 threads, direct and buffered (seed:000)",
            [],
            ffsb_workloads(ffsb_threads),
            dims,
        )
    if name == "file-vs-block":
        dims = {
            "bus": ("virtio-blk",),
            "cache": ("none",),
            "aio": ("native",),
            "fmt": ("raw",),
            "prealloc": ("off",),
            "target": ("host", "file", "block"),
        }
        return Preset(
            name,
            "bare metal vs image file vs block device (loop) under the guest (seed:000)",
            [],
            lookup(["randread-4k", "randwrite-4k", "seqread-1m"]),
            dims,
        )
    raise InputError("--preset", f"unknown preset {name!r} (choose from seed-003, seed-001, ffsb, file-vs-block)")


PRESETS = ("seed-003", "seed-001", "ffsb", "file-vs-block")
