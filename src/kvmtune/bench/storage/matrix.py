"""The storage matrix: configurations, their validation, and the presets."""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from kvmtune.bench.storage.fio import Workload, cycle_workload, ffsb_workloads, lookup
from kvmtune.errors import InputError

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


@dataclass(frozen=True)
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


def _check(kind: str, values: Sequence[str], allowed: Sequence[str]) -> None:
    for v in values:
        if v not in allowed:
            close = difflib.get_close_matches(v, allowed, n=2, cutoff=0.5)
            hint = f"; did you mean {' or '.join(close)}?" if close else ""
            raise InputError(f"--{kind}", f"unknown {kind} {v!r} (choose from {', '.join(allowed)}){hint}")


def build_matrix(
    buses: Sequence[str],
    caches: Sequence[str],
    aios: Sequence[str],
    formats: Sequence[str],
    preallocs: Sequence[str],
    targets: Sequence[str] = ("file",),
    scheds: Sequence[str] = ("default",),
) -> list[StorageConfig]:
    """Every combination, invalid ones included (they are reported, not silently dropped),
    except that a host (bare-metal) target appears once and, when several formats are
    asked for at once, each preallocation goes with the format it belongs to."""
    buses = [BUS_ALIASES.get(b, b) for b in buses]
    _check("bus", buses, BUSES)
    _check("cache", caches, CACHES)
    _check("aio", aios, AIOS)
    _check("format", formats, FORMATS)
    _check("prealloc", preallocs, PREALLOCS)
    _check("target", targets, TARGETS)
    _check("sched", scheds, SCHEDS)
    out: list[StorageConfig] = []
    seen: set[str] = set()
    for t, b, f, p, c, a, s in itertools.product(targets, buses, formats, preallocs, caches, aios, scheds):
        cfg = StorageConfig(b, c, a, f, p, t, s)
        # a preallocation list naming both formats' kinds (metadata is qcow2's, falloc/full are raw's)
        # pairs each with its own format; an explicit impossible request (--format raw --prealloc
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
    dims: dict[str, tuple[str, ...]] = field(default_factory=dict)


def preset(name: str, ffsb_threads: Sequence[int] = (1, 8, 16), cycle_mib: int = 64, cycle_idle_s: float = 3.0) -> Preset:
    if name == "seed-003":
        dims = {
            "bus": ("ide", "virtio-blk"),
            "cache": ("none", "writethrough", "writeback"),
            "aio": ("threads",),
            "format": ("raw", "qcow2"),
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
            "format": ("qcow2",),
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
            "format": ("raw",),
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
            "format": ("raw",),
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
