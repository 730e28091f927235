"""Disk images as the image rules see them.

:func:`read_image` runs ``qemu-img info --output=json`` through the
:class:`~kvmtune.runner.Runner` (with ``-U`` for an image a running QEMU
holds, retried with ``-U`` when the lock is refused), reads the qcow2 header
and the guest's partition table itself (:mod:`kvmtune.qemu.qcow2`,
:mod:`kvmtune.qemu.partitions`), and notes the file system the image lives
on. An image that cannot be opened at all raises :class:`ImageError` (one
line); an image that opens but is damaged comes back with ``broken`` set, so
a rule can report it as a finding.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from typing import Any

from kvmtune.errors import InputError
from kvmtune.host.parsers import Mount, mount_for
from kvmtune.qemu.partitions import PartitionTable, parse_partition_table
from kvmtune.qemu.qcow2 import Qcow2Error, Qcow2Header, Qcow2Reader, open_guest_reader, probe_format, read_header
from kvmtune.runner import Runner

LOCK_MARKERS = ('get shared "write" lock', "get \"write\" lock", "Is another process using the image")
ACCESS_MARKERS = ("Permission denied", "Operation not permitted", "timed out")
NATIVE_FORMATS = ("raw", "qcow2")
NFS_TYPES = ("nfs", "nfs4")


class ImageError(InputError):
    """An image that cannot be audited at all: missing, unreadable, not a file."""


@dataclass
class FsInfo:
    mountpoint: str
    fstype: str
    device: str
    dev_id: int  # st_dev: images with the same id share the free space
    size: int  # bytes
    free: int  # bytes available to unprivileged users


@dataclass
class ImageUse:
    """One guest disk that uses the image."""

    domain: str
    disk: str  # target (vda)
    cache: str | None
    source_type: str | None
    declared_format: str | None
    origin: str
    active: bool | None = None


@dataclass
class DiskImage:
    path: str
    realpath: str
    format: str | None = None
    virtual_size: int | None = None
    apparent_size: int | None = None  # file length (st_size)
    allocated_size: int | None = None  # blocks on disk (st_blocks × 512)
    is_block_device: bool = False
    cluster_size: int | None = None
    compat: str | None = None
    corrupt: bool = False
    dirty: bool = False
    lazy_refcounts: bool = False
    extended_l2: bool = False
    backing_file: str | None = None
    backing_chain: list[str] = field(default_factory=list)  # backing files, nearest first
    backing_error: str | None = None
    broken: str | None = None  # why the image is damaged (truncated, unreadable metadata, …)
    preallocation: str | None = None  # off | metadata | falloc/full | grown | None (not qcow2/unknown)
    preallocation_evidence: str = ""
    in_use: bool = False  # a running QEMU holds it (read with -U)
    info_source: str = "qemu-img"  # qemu-img | header (qemu-img missing)
    filesystem: FsInfo | None = None
    partitions: PartitionTable | None = None
    partition_note: str | None = None
    used_by: list[ImageUse] = field(default_factory=list)
    qemu_img: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"image:{self.path}"

    @property
    def on_nfs(self) -> bool:
        return self.filesystem is not None and self.filesystem.fstype in NFS_TYPES

    @property
    def allocated_fraction(self) -> float | None:
        if not self.virtual_size or self.allocated_size is None:
            return None
        return self.allocated_size / self.virtual_size


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no error output"


def _access_reason(err: str) -> str:
    for m in ACCESS_MARKERS:
        if m in err:
            return m.lower()
    return err


def _is_lock_error(stderr: str) -> bool:
    return any(m in stderr for m in LOCK_MARKERS)


def qemu_img_info(
    path: str, runner: Runner, *, force_share: bool = False, backing_chain: bool = False, timeout: float = 30.0
) -> tuple[Any, str | None, bool]:
    """Run ``qemu-img info --output=json``. Returns (parsed JSON or None, error line or None, lock refused)."""
    argv = ["qemu-img", "info", "--output=json"]
    if backing_chain:
        argv.append("--backing-chain")
    if force_share:
        argv.append("-U")
    argv.append(path)
    res = runner.run(argv, timeout=timeout)
    if res.returncode == 127:
        return None, "qemu-img: not found on PATH (install qemu-utils)", False
    if not res.ok:
        return None, res.describe_failure(), _is_lock_error(res.stderr)
    try:
        return json.loads(res.stdout), None, False
    except json.JSONDecodeError as exc:
        return None, f"qemu-img info printed no JSON ({exc.msg})", False


def filesystem_of(path: str, mounts: list[Mount]) -> FsInfo | None:
    directory = os.path.dirname(path) or "."
    try:
        st = os.stat(directory)
        vfs = os.statvfs(directory)
    except OSError:
        return None
    m = mount_for(path, mounts)
    return FsInfo(
        mountpoint=m.mountpoint if m else "?",
        fstype=m.fstype if m else "?",
        device=m.device if m else "?",
        dev_id=st.st_dev,
        size=vfs.f_blocks * vfs.f_frsize,
        free=vfs.f_bavail * vfs.f_frsize,
    )


def read_image(
    path: str,
    runner: Runner,
    mounts: list[Mount] | None = None,
    *,
    in_use: bool = False,
    read_partitions: bool = True,
) -> DiskImage:
    """Read everything the image rules look at. Raises :class:`ImageError` only if nothing can be read."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ImageError(path, "no such file") from None
    except PermissionError:
        raise ImageError(path, "not readable (permission denied)") from None
    except OSError as exc:
        raise ImageError(path, exc.strerror or str(exc)) from None
    if stat.S_ISDIR(st.st_mode):
        raise ImageError(path, "is a directory, not a disk image")
    if not os.access(path, os.R_OK):
        raise ImageError(path, "not readable (permission denied)")
    real = os.path.realpath(path)
    img = DiskImage(path=path, realpath=real, in_use=in_use)
    img.is_block_device = stat.S_ISBLK(st.st_mode)
    if not img.is_block_device:
        img.apparent_size = st.st_size
        img.allocated_size = st.st_blocks * 512
    img.filesystem = None if img.is_block_device else filesystem_of(real, mounts or [])

    info, err, locked = qemu_img_info(path, runner, force_share=in_use)
    if info is None and locked and not in_use:
        img.in_use = True
        info, err, _ = qemu_img_info(path, runner, force_share=True)
    if info is None and err and err.startswith("qemu-img: not found"):
        img.info_source = "header"
        _fill_from_header(img, err)
    elif info is None and err and any(m in err for m in ACCESS_MARKERS):
        raise ImageError(path, f"qemu-img cannot open it ({_access_reason(err)})")
    elif info is None:
        img.broken = f"qemu-img cannot open it: {err}"
        img.format = _safe_probe(path)
    else:
        _fill_from_qemu_img(img, info)
        if img.backing_file:
            chain, chain_err, _ = qemu_img_info(path, runner, force_share=img.in_use, backing_chain=True)
            if isinstance(chain, list):
                img.backing_chain = [str(c.get("filename", "?")) for c in chain[1:]]
            else:
                img.backing_error = chain_err
    if img.format == "qcow2" and img.broken is None:
        _inspect_qcow2(img)
    elif img.format == "raw" and not img.is_block_device and img.virtual_size:
        frac = img.allocated_fraction
        if frac is not None:
            img.preallocation = "full" if frac >= 0.9 else "sparse"
            img.preallocation_evidence = (
                f"{img.allocated_size} bytes allocated of {img.virtual_size} (st_blocks × 512 vs virtual size)"
            )
    if read_partitions and img.format in NATIVE_FORMATS and img.broken is None:
        _read_partitions(img)
    return img


def _safe_probe(path: str) -> str | None:
    try:
        return probe_format(path)
    except OSError:
        return None


def _fill_from_qemu_img(img: DiskImage, info: dict[str, Any]) -> None:
    img.qemu_img = info
    img.format = info.get("format")
    img.virtual_size = info.get("virtual-size")
    img.cluster_size = info.get("cluster-size")
    img.dirty = bool(info.get("dirty-flag", False))
    img.backing_file = info.get("full-backing-filename") or info.get("backing-filename")
    data = (info.get("format-specific") or {}).get("data") or {}
    img.compat = data.get("compat")
    img.corrupt = bool(data.get("corrupt", False))
    img.lazy_refcounts = bool(data.get("lazy-refcounts", False))
    img.extended_l2 = bool(data.get("extended-l2", False))
    if img.is_block_device and img.virtual_size is not None:
        img.allocated_size = img.virtual_size


def _fill_from_header(img: DiskImage, note: str) -> None:
    """qemu-img is missing: learn what we can from the file's first bytes."""
    img.format = _safe_probe(img.path)
    if img.format == "raw":
        try:
            with open(img.path, "rb") as fh:
                img.virtual_size = os.lseek(fh.fileno(), 0, os.SEEK_END)
        except OSError:
            pass
    elif img.format == "qcow2":
        try:
            h = read_header(img.path)
        except (Qcow2Error, OSError) as exc:
            img.broken = f"qcow2 header unreadable: {exc}"
            return
        img.virtual_size = h.size
        img.cluster_size = h.cluster_size
        img.compat = h.compat
        img.corrupt = h.corrupt
        img.dirty = h.dirty
        img.lazy_refcounts = h.lazy_refcounts
        img.extended_l2 = h.extended_l2
        img.backing_file = h.backing_file
        if h.backing_file:
            img.backing_chain = [h.backing_file]


def _inspect_qcow2(img: DiskImage) -> None:
    """Truncation and preallocation, from our own reading of the header and L1/L2 tables."""
    try:
        header: Qcow2Header = read_header(img.path)
    except (Qcow2Error, OSError) as exc:
        img.broken = f"qcow2 header unreadable: {exc}"
        return
    size = img.apparent_size
    if size is not None:
        ends = [
            ("L1 table", header.l1_table_offset + header.l1_size * 8),
            ("refcount table", header.refcount_table_offset + header.refcount_table_clusters * header.cluster_size),
        ]
        for what, end in ends:
            if end > size:
                img.broken = f"truncated: the {what} ends at byte {end} but the file has {size} bytes"
                return
    try:
        reader = Qcow2Reader(img.path, header, None, None)
    except OSError as exc:
        img.broken = f"cannot open: {exc.strerror}"
        return
    try:
        l1_used, l1_need = reader.l1_allocated()
        l2_used, l2_total = reader.sample_l2_allocated()
    except Qcow2Error as exc:
        img.broken = str(exc)
        return
    finally:
        reader.close()
    vsize = img.virtual_size or header.size
    alloc = img.allocated_size or 0
    length = img.apparent_size or 0
    parts = [
        f"file length {length} B and {alloc} B allocated for {vsize} B virtual",
        f"{l1_used} of {l1_need} L1 entries point to L2 tables",
    ]
    if l2_total:
        parts.append(f"{l2_used} of {l2_total} sampled L2 entries map clusters")
    img.preallocation_evidence = "; ".join(parts)
    if vsize and alloc >= 0.9 * vsize:
        img.preallocation = "falloc/full"
    elif vsize and length >= vsize and l1_need and l1_used == l1_need and l2_total and l2_used == l2_total:
        img.preallocation = "metadata"
    elif img.backing_file:
        img.preallocation = "off (overlay)"
    else:
        img.preallocation = "off"


def _read_partitions(img: DiskImage) -> None:
    try:
        reader = open_guest_reader(img.path, img.format)
    except (Qcow2Error, OSError) as exc:
        img.partition_note = f"partition table not read: {exc}"
        return
    try:
        img.partitions = parse_partition_table(reader.read, reader.size)
    except (Qcow2Error, OSError) as exc:
        img.partition_note = f"partition table not read: {exc}"
    finally:
        reader.close()

