"""The host file system under the images, as a dimension of the block tier (``--host-fs``).

``workdir`` is whatever holds kvmtune's work directory. ``ext4``, ``xfs`` and
``btrfs`` are made for the run: a sparse backing file in the scratch
directory, a loop device over it (direct I/O, so the page cache is not
counted twice), ``mkfs``, a mount point in the scratch directory; all of it is
removed when the file system's cells are done, or when the run stops. ``lvm``
is a volume group on such a loop device; each image is then a raw logical
volume, as seed 001's "raw LVM volume" was.

Where today's defaults differ from seed 001's 2012 systems: ext4 allocates
lazily (delayed allocation, ext4(5) "delalloc", on by default), so a sparse
image's first writes cost block allocation at writeback time rather than at
write time; btrfs copies on write unless the file is ``nodatacow`` (chattr +C,
btrfs(5)), so even rewrites of an image allocate; XFS is RHEL's default file
system since RHEL 7 (Red Hat's "Choosing a file system" guide).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kvmtune.bench.storage.guest import StorageContext
from kvmtune.bench.storage.hostio import device_of_path
from kvmtune.bench.storage.matrix import HOST_FS
from kvmtune.errors import KvmtuneError
from kvmtune.host.facts import HostFacts
from kvmtune.host.root import HostRoot
from kvmtune.lab.workdir import release_file
from kvmtune.runner import Runner

BACKING_MIB = 8192  # sparse: only what the cells write takes space
MKFS = {
    "ext4": (["mkfs.ext4", "-q", "-F"], "e2fsprogs"),
    "xfs": (["mkfs.xfs", "-q", "-f"], "xfsprogs"),
    "btrfs": (["mkfs.btrfs", "-q", "-f"], "btrfs-progs"),
}
LVM_QUIET = ["--config", "activation { udev_sync = 0 udev_rules = 0 }"]  # no udev in containers and CI


@dataclass
class HostFs:
    name: str  # workdir | ext4 | xfs | btrfs | lvm
    root: Path  # where image files go (lvm: where loop backing files go)
    device: str | None  # the block device under it, as in /proc/diskstats
    fs_type: str
    vg: str | None = None
    discards: bool = False  # mounted with 'discard': freeing extents costs a discard each

    def floor_target(self, ctx: StorageContext, size_mib: int, tag: str) -> str:
        """What the bare-metal fio writes to: a preallocated file on this file system (lvm: a volume)."""
        if self.vg is not None:
            return self._volume(ctx, size_mib, f"floor-{tag}")
        path = self.root / f"floor-{tag}.dat"
        ctx.scratch.add_file(path)
        res = ctx.runner.run(["fallocate", "-l", f"{size_mib}M", str(path)], timeout=120)
        if not res.ok:
            raise KvmtuneError(f"{path}: cannot allocate the bare-metal test file ({res.describe_failure()})")
        return str(path)

    def block_device(self, ctx: StorageContext, size_mib: int, tag: str, user_device: str | None,
                     keep: Callable[[Path], Path] | None = None) -> str:
        """A raw block device for the image: the user's ``--device``, an LVM volume, or a loop device (whose
        backing file ``keep`` takes, to delete later, instead of the scratch directory's undo list)."""
        if user_device:
            return user_device
        if self.vg is not None:
            return self._volume(ctx, size_mib, f"img-{tag}")
        backing = self.root / f"loop-{tag}.img"
        (keep or ctx.scratch.add_file)(backing)
        res = ctx.runner.run(["fallocate", "-l", f"{size_mib}M", str(backing)], timeout=120)
        if not res.ok:
            raise KvmtuneError(f"{backing}: cannot allocate the loop device's backing file ({res.describe_failure()})")
        return attach_loop(ctx, backing)

    def _volume(self, ctx: StorageContext, size_mib: int, name: str) -> str:
        assert self.vg is not None
        res = ctx.runner.run(["lvcreate", *LVM_QUIET, "-q", "-y", "--wipesignatures", "y", "--zero", "y",
                              "-L", f"{size_mib}M", "-n", name, self.vg], timeout=120)
        if not res.ok:
            raise KvmtuneError(f"lvcreate {self.vg}/{name}: {res.describe_failure()}")
        path = f"/dev/{self.vg}/{name}"
        ctx.scratch.add_undo(f"logical volume {path}", lambda: _quiet(ctx, ["lvremove", *LVM_QUIET, "-q", "-f", path]))
        return path


def _quiet(ctx: StorageContext, argv: list[str]) -> None:
    ctx.runner.run(argv, timeout=120)


def attach_loop(ctx: StorageContext, backing: Path) -> str:
    res = ctx.runner.run(["losetup", "--find", "--show", "--direct-io=on", str(backing)], timeout=30)
    if not res.ok:
        raise KvmtuneError(f"loop device for {backing}: {res.describe_failure()}")
    dev = res.stdout.strip()
    if not re.fullmatch(r"/dev/loop\d+", dev):
        raise KvmtuneError(f"losetup returned {dev!r}, not a loop device")
    ctx.scratch.add_loop(dev)
    return dev


def _mount_of(ctx: StorageContext, path: Path) -> tuple[str, bool]:
    """(file system type, mounted with discard) of the mount holding ``path``."""
    best, found = "", ("unknown", False)
    for m in HostFacts(ctx.host).mounts:
        inside = str(path) == m.mountpoint or str(path).startswith(m.mountpoint.rstrip("/") + "/")
        if inside and len(m.mountpoint) >= len(best):
            best, found = m.mountpoint, (m.fstype, m.has_option("discard"))
    return found


def check_host_fs(runner: Runner, host: HostRoot, names: list[str]) -> None:
    """Before anything runs: the tools each asked-for file system needs, one line naming the package."""
    for name in names:
        if name not in HOST_FS:
            raise KvmtuneError(f"--host-fs: unknown file system {name!r} (choose from {', '.join(HOST_FS)})")
        if name in MKFS and runner.which(MKFS[name][0][0]) is None:
            raise KvmtuneError(f"--host-fs {name}: {MKFS[name][0][0]} not found (Debian: apt install {MKFS[name][1]})")
        if name == "lvm" and runner.which("lvcreate") is None:
            raise KvmtuneError("--host-fs lvm: lvcreate not found (Debian: apt install lvm2)")
        if name == "lvm" and not host.exists("/sys/class/misc/device-mapper"):
            raise KvmtuneError("--host-fs lvm: this kernel has no device-mapper (/sys/class/misc/device-mapper is "
                               "absent; modprobe dm_mod, or run where it is available)")
        if name != "workdir" and os.geteuid() != 0:
            raise KvmtuneError(f"--host-fs {name}: making a scratch file system needs root (loop devices, mount)")


@contextlib.contextmanager
def make_host_fs(ctx: StorageContext, name: str) -> Iterator[HostFs]:
    """The file system ``name`` for the duration of the block; a scratch one is removed afterwards."""
    if name == "workdir":
        root = ctx.scratch.root
        fstype, discards = _mount_of(ctx, root.resolve())
        yield HostFs(name, root, device_of_path(ctx.host, str(root)), fstype, discards=discards)
        return
    base = ctx.scratch.path(f"hostfs-{name}")
    ctx.scratch.add_dir(base)
    backing = ctx.scratch.inside(base / "backing.img")
    coalesce = _mount_of(ctx, backing.parent)[1]  # the work directory discards: merge the loop file's extents first
    ctx.scratch.add_undo(f"file {backing}", lambda: release_file(backing, coalesce))
    with open(backing, "wb") as f:
        f.truncate(BACKING_MIB << 20)
    mark = ctx.scratch.mark()
    dev = attach_loop(ctx, backing)
    try:
        if name == "lvm":
            vg = f"kvmtune-{os.getpid()}-{secrets.token_hex(2)}"
            res = ctx.runner.run(["vgcreate", *LVM_QUIET, "-q", "-y", vg, dev], timeout=120)
            if not res.ok:
                raise KvmtuneError(f"vgcreate {vg} on {dev}: {res.describe_failure()}")
            ctx.scratch.add_undo(f"volume group {vg}", lambda: _remove_vg(ctx, vg, dev))
            yield HostFs(name, base, dev.removeprefix("/dev/"), "lvm", vg=vg)
        else:
            argv, _pkg = MKFS[name]
            res = ctx.runner.run([*argv, dev], timeout=300)
            if not res.ok:
                raise KvmtuneError(f"{argv[0]} {dev}: {res.describe_failure()}")
            mnt = base / "mnt"
            mnt.mkdir()
            res = ctx.runner.run(["mount", dev, str(mnt)], timeout=60)
            if not res.ok:
                raise KvmtuneError(f"mount {dev}: {res.describe_failure()}")
            ctx.scratch.add_undo(f"mount {mnt}", lambda: _quiet(ctx, ["umount", str(mnt)]))
            yield HostFs(name, mnt, dev.removeprefix("/dev/"), name)
    finally:
        problems = ctx.scratch.cleanup(mark)  # volumes, mount, loop device: now, not at the end of the run
        if problems:
            raise KvmtuneError(f"--host-fs {name}: could not remove {'; '.join(problems)}")


def _remove_vg(ctx: StorageContext, vg: str, dev: str) -> None:
    _quiet(ctx, ["vgremove", *LVM_QUIET, "-q", "-f", vg])
    _quiet(ctx, ["pvremove", *LVM_QUIET, "-q", "-f", dev])
