"""Block tier for verify: scratch replicas of one guest disk, served by qemu-storage-daemon, measured with fio.

The replica copies the disk's *configuration* as the audit read it (format,
qcow2 cluster size and preallocation from ``qemu-img info``, cache mode, AIO
mode, discard), never its contents: the guest's image or device is never
opened. Side A is the disk as it is, side B as the fix would make it; both are
block nodes of one ``qemu-storage-daemon`` exporting them over NBD on a UNIX
socket, and fio's ``nbd`` engine drives them. This runs at host speed: no
guest, no TCG.

The replicas live on the file system of the real image (that is where the
cache and AIO modes act), in a directory named ``.kvmtune-verify-*``, only when
the image is there as a regular file in a writable directory; otherwise (a
missing path, a device, a link: a place kvmtune does not own) they go to the
work directory. The result says which and why (:func:`scratch_parent`). Every
option string is built by :mod:`kvmtune.qemuopts`: a cache, AIO or discard
mode QEMU does not know leaves the disk :class:`Unreplicable`. As soon as the daemon has opened them the replica files are
unlinked, so a killed kvmtune leaves no replica behind (the daemon dies with
kvmtune, and the kernel frees the space with its last file descriptor).

The cache-mode table (libvirt's ``<driver cache=…>`` → ``cache.direct``,
``cache.no-flush``, the export's ``writethrough``) is the one the storage bench's
block tier uses too (:data:`kvmtune.qemuopts.CACHE_MODES`). What is verify's own
is the pair: two block nodes, A and B, in one daemon, sampled alternately
through the :class:`~kvmtune.verify.measure.Probe` interface.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

from kvmtune.audit.verifyplan import FioJob
from kvmtune.errors import KvmtuneError
from kvmtune.lab.replica import Layout, Unreplicable, create_replica, make_scratch_dir
from kvmtune.lab.storage.fio import parse_fio_json
from kvmtune.lab.storage.replay import Replay
from kvmtune.lab.workdir import Started, stop_process
from kvmtune.model.guest import Disk
from kvmtune.qemuopts import (
    Aio,
    Cache,
    Discard,
    fio_nbd_uri,
    fio_option,
    keyval,
)
from kvmtune.runner import Runner
from kvmtune.verify.measure import Metric

QSD = "qemu-storage-daemon"
START_TIMEOUT_S = 10.0
IOPS = Metric("iops", "IOPS", True, "fio through an NBD export of the replica")
ALLOCATED = Metric("allocated", "MiB", False, "host space the replica still holds after the guest trimmed")
REPLAY_P99 = Metric("p99_latency", "µs p99", False, "fio's p99 completion latency replaying the captured workload "
                    "at its captured times or rate")
REPLAY_IOPS = Metric("iops", "IOPS", True, "fio replaying the captured workload as fast as it can")


# the disk attributes a replica copies: a value the reader refused there means the disk cannot be replicated
REPLICATED = ("cache", "io", "discard", "detect_zeroes")


def layout_of(disk: Disk, image: object | None = None) -> tuple[Layout, list[str]]:
    """The disk's layout as the audit read it, and what had to be assumed (one line each).

    A value the reader refused (:attr:`Disk.refused`: "io mode 'x' is not one QEMU knows") makes the disk
    :class:`Unreplicable` with that reason: it is never passed on."""
    for attr in REPLICATED:
        if attr in disk.refused:
            raise Unreplicable(f"disk {disk.target}: {disk.refused[attr]}")
    assumed: list[str] = []
    fmt = (disk.format or getattr(image, "format", None) or "raw").lower()
    if fmt not in ("raw", "qcow2"):
        raise Unreplicable(f"format {fmt}: the replica is made for raw and qcow2 only")
    cluster = getattr(image, "cluster_size", None) if fmt == "qcow2" else None
    prealloc = getattr(image, "preallocation", None)
    if image is None:
        if fmt == "qcow2":
            assumed.append("image not readable here: qcow2 defaults assumed (64 KiB clusters, no preallocation)")
        else:
            assumed.append("image not readable here: a sparse raw file assumed")
    # the image model's words → qemu-img create's; "full" becomes falloc: the same allocation state, and
    # writing a whole replica would only cost time
    prealloc = {"metadata": "metadata", "falloc": "falloc", "full": "falloc", "falloc/full": "falloc",
                "allocated": "falloc"}.get(prealloc or "off", "off")
    if fmt == "raw" and prealloc == "metadata":
        prealloc = "off"
    io = disk.io or Aio.THREADS
    if io == Aio.DEFAULT:
        io = Aio.THREADS
    discard = disk.discard if disk.discard not in (None, Discard.DEFAULT) else Discard.IGNORE
    return Layout(fmt, cluster, prealloc, disk.cache or Cache.DEFAULT, io, discard), assumed  # type: ignore[arg-type]


def scratch_parent(source: str | None, workdir: Path) -> tuple[Path, str]:
    """Where the replicas go, and why (one line for the progress output).

    Only where kvmtune owns the place, or the image is: the image's own directory when the image is there as
    a regular file (its file system is where the cache and AIO modes act), else the work directory. A path a
    definition merely names (missing, a device, a directory, a symbolic link) never gets a scratch directory
    beside it."""
    if not source or not source.startswith("/"):
        return workdir, f"the disk is not a local file: replicas made in the work directory {workdir}"
    try:
        st = os.lstat(source)
    except OSError:
        st = None
    instead = f"replicas made in the work directory {workdir} (another file system may behave differently)"
    if st is None or not stat.S_ISREG(st.st_mode):
        what = "does not exist" if st is None else "is not a regular file"
        return workdir, f"the image {source} {what}: {instead}"
    parent = Path(source).parent
    if not os.access(parent, os.W_OK | os.X_OK):
        return workdir, f"the image's directory {parent} is not writable: {instead}"
    return parent, f"replicas made in {parent}, beside the image (a regular file there), on its file system"


def _blockdev(node: str, path: Path, lay: Layout) -> list[str]:
    cache = (("cache.direct", lay.direct), ("cache.no-flush", lay.no_flush))
    proto = keyval(("driver", "file"), ("node-name", f"{node}-file"), ("filename", path), *cache,
                   ("aio", lay.io), ("discard", lay.discard))
    fmt = keyval(("driver", lay.format), ("node-name", node), ("file", f"{node}-file"), *cache,
                 ("discard", lay.discard))
    return ["--blockdev", proto, "--blockdev", fmt]


class BlockPair(Started):
    """Side A and side B of one disk as NBD exports of one qemu-storage-daemon (a context manager)."""

    def __init__(self, runner: Runner, parent: Path, a: Layout, b: Layout, size: int, job: FioJob,
                 seconds: float, metric: Metric = IOPS, replay: Replay | None = None) -> None:
        self.runner = runner
        self.replay = replay  # a captured workload instead of ``job`` (verify --replay)
        if replay is not None:
            metric = REPLAY_P99 if replay.mode == "timed" else REPLAY_IOPS
        self.parent = parent
        self.layouts = {"A": a, "B": b}
        self.size = size
        self.job = job
        self.seconds = seconds
        self.metric = metric
        self.dir: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.fds: dict[str, int] = {}

    @property
    def socket(self) -> Path:
        assert self.dir is not None
        return self.dir / "nbd.sock"

    def start(self) -> None:
        if shutil.which(QSD) is None:
            raise KvmtuneError(f"{QSD} not found (Debian package qemu-system-common / qemu-utils)")
        if shutil.which("fio") is None:
            raise KvmtuneError("fio not found (Debian package fio)")
        self.dir = make_scratch_dir(self.parent)
        if self.replay is not None:
            self.replay.place(self.dir)  # the translated log, in this pair's own scratch directory
            self.replay.write()
        argv = [QSD]
        paths = {}
        for side, lay in self.layouts.items():
            path = self.dir / f"replica-{side}.{lay.format}"
            create_replica(self.runner, path, lay, self.size)
            paths[side] = path
            argv += _blockdev(side, path, lay)
        argv += ["--nbd-server", keyval(("addr.type", "unix"), ("addr.path", self.socket))]
        for side, lay in self.layouts.items():
            argv += ["--export", keyval(("type", "nbd"), ("id", f"export-{side}"), ("node-name", side), ("name", side),
                                        ("writable", True), ("writethrough", lay.writethrough))]
        err = open(self.dir / "qsd.stderr", "wb")  # noqa: SIM115 - the child keeps it
        with err:
            self.proc = self.runner.popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                          start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.socket.exists():
            if self.proc.poll() is not None:
                raise KvmtuneError(f"{QSD} refused the replica configuration: {self._stderr()}")
            if time.monotonic() > deadline:
                raise KvmtuneError(f"{QSD} did not open its NBD socket within {START_TIMEOUT_S:.0f}s")
            time.sleep(0.02)
        for side, path in paths.items():  # the daemon holds them open: nothing to leave behind after a kill
            self.fds[side] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            path.unlink()
        if self.replay is not None and self.replay.reads():
            self.fill()

    def fill(self) -> None:
        """Write both replicas whole before a replay that reads, then drop what the host page cache kept of them:
        the captured guest read its data, and a read of a never-written area is answered from a hole, not read."""
        for side in self.layouts:
            self.run_fio(["fio", "--name=fill", "--ioengine=nbd", fio_nbd_uri(side, self.socket), "--rw=write",
                          "--bs=1m", "--iodepth=4", fio_option("size", self.size)], 300, parse=False)
        for fd in self.fds.values():
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)

    def _stderr(self) -> str:
        assert self.dir is not None
        try:
            text = (self.dir / "qsd.stderr").read_text(errors="replace").strip()
        except OSError:
            return "no error output"
        return text.splitlines()[-1] if text else "no error output"

    def fio_argv(self, side: str, job: FioJob, seconds: float | None = None, size: str | None = None) -> list[str]:
        argv = [
            "fio", fio_option("name", job.name), "--ioengine=nbd", fio_nbd_uri(side, self.socket),
            fio_option("rw", job.rw), fio_option("bs", job.bs), fio_option("iodepth", job.iodepth),
            fio_option("size", size or self.size), "--output-format=json",
        ]
        if job.fsync:
            argv.append(fio_option("fsync", job.fsync))
        if job.rwmixread is not None:
            argv.append(fio_option("rwmixread", job.rwmixread))
        if seconds is not None:
            argv += [fio_option("runtime", f"{max(1, round(seconds * 1000))}ms"), "--time_based"]
        return argv

    def run_fio(self, argv: list[str], seconds: float, parse: bool = True) -> dict[str, float]:
        res = self.runner.run(argv, timeout=seconds + 60)
        if not res.ok:
            if self.proc is not None and self.proc.poll() is not None:
                raise KvmtuneError(f"{QSD} exited during the measurement: {self._stderr()}")
            raise KvmtuneError(f"fio against the replica failed: {res.describe_failure()}")
        if not parse:
            return {}
        try:
            return parse_fio_json(res.stdout)
        except ValueError as exc:
            raise KvmtuneError(f"fio against the replica: {exc}") from None

    def sample(self, side: str) -> float:
        if self.replay is not None:
            # the engine and export before the first job: global, for every stream's job (Replay.streams)
            argv = ["fio", "--ioengine=nbd", fio_nbd_uri(side, self.socket), fio_option("name", "replay"),
                    *self.replay.job_options(self.size >> 20, self.seconds), "--output-format=json"]
            m = self.run_fio(argv, self.seconds)
            if self.metric is REPLAY_P99:
                if "clat_p99_us" not in m:
                    raise KvmtuneError("fio reported no p99 latency for the replay")
                return m["clat_p99_us"]
            return m["iops"]
        m = self.run_fio(self.fio_argv(side, self.job, self.seconds), self.seconds)
        return m["iops"]

    def allocated_mib(self, side: str) -> float:
        return os.fstat(self.fds[side]).st_blocks * 512 / (1 << 20)

    def close(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None
        for fd in self.fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


class DiscardProbe:
    """Space returned to the host: write ``mib`` MiB, trim it (as a guest's fstrim does), read the replica's blocks."""

    metric = ALLOCATED

    def __init__(self, pair: BlockPair, mib: int = 64) -> None:
        self.pair = pair
        self.mib = mib

    def sample(self, side: str) -> float:
        size = f"{self.mib}m"
        write = FioJob("fill", "write", "1m", 4)
        trim = FioJob("trim", "trim", "1m", 4)
        self.pair.run_fio(self.pair.fio_argv(side, write, None, size), 30)
        self.pair.run_fio(self.pair.fio_argv(side, trim, None, size), 30, parse=False)
        return self.pair.allocated_mib(side)
