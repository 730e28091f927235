"""Preallocating disk images: the fix for KVM-IMG-002 (qcow2 without preallocation) and
KVM-IMG-003 (sparse raw image).

The image is converted into a temporary file next to it (``qemu-img convert`` with
``preallocation=metadata`` for qcow2, ``falloc`` for raw, keeping the qcow2 options
it had), the copy is checked with ``qemu-img compare``, then swapped in with one
``rename``: the path always names a whole image, old or new. The original stays as
a hard link ``IMAGE.kvmtune-orig-ID`` until ``kvmtune undo ID`` puts it back or
``--purge-backups`` deletes it. An image a QEMU process has open is refused
(``/proc/*/fd`` through the host root, and QEMU's image lock).
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from kvmtune.errors import KvmtuneError
from kvmtune.fix.diff import Reason
from kvmtune.fix.effect import Planned
from kvmtune.fix.entries import ImageEntry
from kvmtune.fix.files import fsync_dir, temp_name
from kvmtune.fix.plan import ApplyContext, ApplyError, Change, Plan, UndoConflict, UndoContext
from kvmtune.host.root import HostRoot
from kvmtune.inputs import kind_of
from kvmtune.qemu.image import ImageSpec, open_by, qemu_img_json, qemu_img_map_sums
from kvmtune.runner import Runner

ANSWERS = ("KVM-IMG-002", "KVM-IMG-003")  # the rules whose findings a conversion here answers
CONVERT_TIMEOUT = 7 * 24 * 3600.0
QCOW2_KEEP = (("cluster-size", "cluster_size"),)
QCOW2_DATA_KEEP = (
    ("compat", "compat"),
    ("lazy-refcounts", "lazy_refcounts"),
    ("refcount-bits", "refcount_bits"),
    ("extended-l2", "extended_l2"),
    ("compression-type", "compression_type"),
)
SLACK = 64 * 1024 * 1024  # free space kept beyond the estimate
KILL_IN_SWAP_ENV = "KVMTUNE_TEST_KILL_IN_IMAGE_SWAP"


class ImageInUse(KvmtuneError):
    """A QEMU process (or another writer) has the image open."""


def _spec(image: Path, fmt: str) -> ImageSpec:
    """The image pinned to the local file driver and its declared format, no backing file opened."""
    return ImageSpec(str(image.absolute()), fmt)


def refuse_if_in_use(image: Path, fmt: str, runner: Runner, host: HostRoot | None = None) -> None:
    who = open_by(str(image), host or HostRoot("/"))
    if who:
        raise ImageInUse(f"{image}: open by {who}; shut the guest down first")
    _, _, locked = qemu_img_json("info", _spec(image, fmt), runner)
    if locked:
        raise ImageInUse(f"{image}: locked by a running QEMU; shut the guest down first")


def _info(image: Path, fmt: str, runner: Runner) -> dict[str, Any]:
    data, err, locked = qemu_img_json("info", _spec(image, fmt), runner)
    if locked:
        raise ImageInUse(f"{image}: locked by a running QEMU; shut the guest down first")
    if data is None:
        if err and err.startswith("qemu-img: not found"):
            raise KvmtuneError(err)
        raise KvmtuneError(f"{image}: cannot be opened as the declared {fmt}: {err}")
    if not isinstance(data, dict):
        raise KvmtuneError(f"{image}: unexpected qemu-img info output")
    return data


def _unallocated(image: Path, fmt: str, virtual_size: int, runner: Runner) -> int:
    """Bytes of the image (top layer) with no cluster allocated, from ``qemu-img map`` (read as sums, bounded)."""
    sums, err = qemu_img_map_sums(_spec(image, fmt), virtual_size, runner, timeout=600)
    if sums is None:
        raise KvmtuneError(f"{image}: qemu-img map failed: {err}")
    return sums.unmapped


@dataclass
class ImageConvert(Change[ImageEntry]):
    kind: ClassVar[str] = "image"
    path: Path
    fmt: str
    options: dict[str, str]
    virtual_size: int
    need_bytes: int
    host: HostRoot
    ino: tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns when planned
    reasons: list[Reason] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    planned: list[Planned] = field(default_factory=list)

    @property
    def opt_string(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.options.items())

    def title(self) -> str:
        return f"image {self.path}: {self.fmt}, preallocation={self.options.get('preallocation')}"

    def render(self) -> str:
        tmp = temp_name(self.path, "ID")
        lines = [f"# {r.text}" for r in self.reasons]
        lines += [
            f"qemu-img convert -f {self.fmt} -O {self.fmt} -o {self.opt_string} {self.path} {tmp}",
            f"qemu-img compare -f {self.fmt} -F {self.fmt} {self.path} {tmp}",
            f"keep the original as {self.path}.kvmtune-orig-ID (hard link) until 'kvmtune undo ID' or --purge-backups",
            f"rename {tmp} -> {self.path}  (atomic)",
            f"needs about {self.need_bytes // (1024 * 1024)} MiB free in {self.path.parent}",
        ]
        return "\n".join(lines) + "\n"

    def lock_paths(self) -> list[Path]:
        return [self.path]

    def _check_unchanged(self) -> os.stat_result:
        try:
            st = os.stat(self.path)
        except OSError as exc:
            raise ApplyError(f"{self.path}: {exc.strerror}") from None
        if (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns) != self.ino:
            raise ApplyError(f"{self.path} changed since the plan was made; run kvmtune fix again")
        return st

    def snapshot(self, ctx: ApplyContext) -> ImageEntry:
        self._check_unchanged()
        try:
            refuse_if_in_use(self.path, self.fmt, ctx.runner, self.host)
        except ImageInUse as exc:
            raise ApplyError(str(exc)) from None
        free = _free(self.path.parent)
        if free is not None and free < self.need_bytes:
            raise ApplyError(
                f"{self.path}: needs about {self.need_bytes // 2**20} MiB free in {self.path.parent}, "
                f"{free // 2**20} MiB available"
            )
        return ImageEntry(
            what=self.title(), path=str(self.path), format=self.fmt, options=self.opt_string,
            backup=f"{self.path}.kvmtune-orig-{ctx.journal.id}", temp=str(temp_name(self.path, ctx.journal.id)),
            prior_ino=self.ino[1], prior_size=self.ino[2],
        )

    def apply(self, entry: ImageEntry, ctx: ApplyContext) -> None:
        src, tmp, backup = self.path, Path(entry.temp), Path(entry.backup)
        st = self._check_unchanged()
        run = ctx.runner.run
        try:
            # the source as a json: filename (declared format, file driver, no backing); the target an absolute
            # path, which QEMU never reads as a protocol
            res = run(
                ["qemu-img", "convert", "-O", self.fmt, "-o", self.opt_string, _spec(src, self.fmt).filename(),
                 str(tmp.absolute())],
                timeout=CONVERT_TIMEOUT,
            )
            if not res.ok:
                raise ApplyError(f"{src}: conversion failed: {res.describe_failure()}")
            res = run(["qemu-img", "compare", _spec(src, self.fmt).filename(), _spec(tmp, self.fmt).filename()],
                      timeout=CONVERT_TIMEOUT)
            if res.returncode != 0:
                why = "the copy differs from the original" if res.returncode == 1 else res.describe_failure()
                raise ApplyError(f"{src}: verification failed: {why}; original left in place")
            os.chmod(tmp, stat.S_IMODE(st.st_mode))
            with contextlib.suppress(PermissionError):
                os.chown(tmp, st.st_uid, st.st_gid)
            fd = os.open(tmp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            self._check_unchanged()
            try:
                refuse_if_in_use(src, self.fmt, ctx.runner, self.host)
            except ImageInUse as exc:
                raise ApplyError(str(exc)) from None
            os.link(src, backup)
            fsync_dir(src.parent)
            if os.environ.get(KILL_IN_SWAP_ENV):
                os.kill(os.getpid(), signal.SIGKILL)  # test hook: the crash between backup link and swap
            os.replace(tmp, src)
            fsync_dir(src.parent)
        except OSError as exc:
            raise ApplyError(f"{src}: {exc.strerror or exc}") from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        entry.after_ino = os.stat(src).st_ino
        if ctx.purge_backups:
            os.unlink(backup)
            fsync_dir(src.parent)
            entry.purged = True

    @staticmethod
    def undo(e: ImageEntry, ctx: UndoContext) -> None:
        path, backup, temp = Path(e.path), Path(e.backup), Path(e.temp)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        if e.purged:
            raise KvmtuneError(f"{path}: the original was deleted (--purge-backups); cannot restore it")
        if not backup.exists():
            if e.status == "done":
                raise KvmtuneError(f"{path}: its backup {backup} is gone; cannot restore it")
            ctx.done.append(f"{path}: never replaced")
            return
        b = os.stat(backup)
        try:
            p = os.stat(path)
            same = (p.st_dev, p.st_ino) == (b.st_dev, b.st_ino)
        except FileNotFoundError:
            p, same = None, False
        if not same and p is not None and e.after_ino is not None and p.st_ino != e.after_ino and not ctx.force:
            raise UndoConflict(f"{path} was replaced after kvmtune converted it; not restored (--force)")
        if same:
            # killed between linking the backup and swapping the copy in: the image is the original and
            # the backup a second name for it (rename() between two links of one file would keep both)
            os.unlink(backup)
            fsync_dir(path.parent)
            ctx.done.append(f"{path}: never replaced (its backup link removed)")
            return
        refuse_if_in_use(path, e.format or "raw", ctx.runner)
        os.replace(backup, path)
        fsync_dir(path.parent)
        ctx.done.append(f"{path}: original restored")


def _free(directory: Path) -> int | None:
    try:
        vfs = os.statvfs(directory)
    except OSError:
        return None
    return vfs.f_bavail * vfs.f_frsize


def _rule_label(rule_id: str, fallback: str) -> str:
    from kvmtune.audit.rule import rule_by_id

    rule = rule_by_id(rule_id)
    return f"{rule.id} {rule.slug}" if rule is not None else fallback


def plan_image(
    path: Path, runner: Runner, host: HostRoot, fmt: str | None = None
) -> tuple[ImageConvert | None, str | None]:
    """The conversion ``path`` needs, or (None, why not / None when nothing to do).

    ``fmt`` is the declared format (``--format`` or the domain definition). Without one the image is
    left alone: its first bytes are the guest's to write, so a raw disk can look like qcow2.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise KvmtuneError(f"{path}: no such file") from None
    except OSError as exc:
        raise KvmtuneError(f"{path}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        return None, f"{path}: not a regular file ({kind_of(st.st_mode)}; only image files are converted)"
    if fmt is None:
        return None, (f"{path}: format not declared; give --image-format raw|qcow2 or the domain XML that uses it "
                      "(kvmtune never converts an image whose format it would have to guess from its contents)")
    if fmt not in ("raw", "qcow2"):
        return None, f"{path}: format {fmt} is not converted (qcow2 and raw only)"
    who = open_by(str(path), host)
    if who:
        return None, f"{path}: open by {who}; shut the guest down first"
    try:
        info = _info(path, fmt, runner)
    except KvmtuneError as exc:  # in use, or not an image of the declared format
        return None, str(exc)
    if info.get("format") != fmt:
        return None, f"{path}: qemu-img opened it as {info.get('format')!r}, not the declared {fmt} (left alone)"
    vsize = int(info.get("virtual-size") or 0)
    data = (info.get("format-specific") or {}).get("data") or {}
    if info.get("backing-filename") or info.get("full-backing-filename"):
        return None, f"{path}: has a backing file; converting it would flatten or rebase the chain (left alone)"
    if fmt == "qcow2":
        if info.get("snapshots"):
            return None, f"{path}: has internal snapshots, which qemu-img convert does not copy (left alone)"
        if data.get("encrypt") or info.get("encrypted"):
            return None, f"{path}: encrypted (left alone)"
        if data.get("data-file"):
            return None, f"{path}: uses an external data file (left alone)"
        if data.get("bitmaps"):
            return None, f"{path}: has persistent dirty bitmaps (left alone)"
        if data.get("corrupt"):
            return None, f"{path}: marked corrupt; run qemu-img check first (left alone)"
        missing = _unallocated(path, fmt, vsize, runner)
        if missing == 0:
            return None, None
        opts: dict[str, str] = {}
        for key, opt in QCOW2_KEEP:
            if info.get(key):
                opts[opt] = str(info[key])
        for key, opt in QCOW2_DATA_KEEP:
            if key in data and data[key] is not None:
                value = data[key]
                opts[opt] = ("on" if value else "off") if isinstance(value, bool) else str(value)
        opts["preallocation"] = "metadata"
        need = st.st_blocks * 512 + vsize // max(1, int(info.get("cluster-size") or 65536)) * 16 + SLACK
        rule = "KVM-IMG-002"
        why = (
            f"{_rule_label('KVM-IMG-002', 'qcow2 without preallocation')}: {missing // 2**20} MiB of "
            f"{vsize // 2**20} MiB unallocated; every first write allocates a cluster"
        )
    elif fmt == "raw":
        allocated = st.st_blocks * 512
        if vsize == 0 or allocated >= 0.9 * vsize:
            return None, None
        opts = {"preallocation": "falloc"}
        need = vsize + SLACK
        rule = "KVM-IMG-003"
        why = (
            f"{_rule_label('KVM-IMG-003', 'sparse raw image')}: {allocated // 2**20} MiB allocated of "
            f"{vsize // 2**20} MiB; space is allocated on first write"
        )
    else:
        return None, f"{path}: format {fmt or '?'} is not converted (qcow2 and raw only)"
    change = ImageConvert(
        path=path.resolve(),
        fmt=fmt,
        options=opts,
        virtual_size=vsize,
        need_bytes=need,
        host=host,
        ino=(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns),
        reasons=[Reason(why)],
        notes=["the guest using it must be shut down while this runs; it sees the same data afterwards"],
        # converted only while no guest has it open (checked above and again at apply)
        planned=[Planned(str(path), rule, str(path), why, "guest-offline")],
    )
    free = _free(path.parent)
    if free is not None and free < need:
        return None, f"{path}: needs about {need // 2**20} MiB free in {path.parent}, {free // 2**20} MiB available"
    return change, None


def plan_images(
    paths: list[str], runner: Runner, host: HostRoot, plan: Plan, formats: Mapping[str, str] | None = None
) -> None:
    """``formats``: declared format by image path (``--format`` for all, or the domains that use them)."""
    seen: set[Path] = set()
    declared = {os.path.realpath(k): v for k, v in (formats or {}).items()}
    for raw in paths:
        p = Path(raw)
        key = p.resolve()
        if key in seen:
            continue
        seen.add(key)
        change, why = plan_image(p, runner, host, declared.get(str(key)))
        if change is not None:
            plan.changes.append(change)
        elif why:
            plan.skipped.append(why)


def declared_formats(domain_files: list[str]) -> dict[str, str]:
    """Image path → the format the given domain XML files declare for it (``<driver type=…>``)."""
    from kvmtune.domain.xml import load_guest_file
    from kvmtune.errors import InputError

    out: dict[str, str] = {}
    for f in domain_files:
        try:
            guest = load_guest_file(f)
        except InputError:
            continue  # plan_files reports it
        for d in guest.disks:
            if d.source and d.format and d.source_type == "file":
                out[os.path.realpath(d.source)] = d.format
    return out
