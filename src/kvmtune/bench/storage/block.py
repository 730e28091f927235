"""``kvmtune bench storage --tier block``: QEMU's block layer at host speed, no guest.

For every configuration, qemu-storage-daemon opens the image with the
``-blockdev`` options QEMU gets for the same libvirt ``<driver cache=… io=…>``
and exports it over NBD on a unix socket in the scratch directory; fio's
``nbd`` engine runs the guest tier's workloads (same names) against it. NBD
over a unix socket was chosen over vhost-user-blk (needs a vhost-user client:
a guest, or libblkio, which Debian's fio lacks) and FUSE exports (every request
crosses the kernel's FUSE layer twice, which adds a cost no guest pays).

The floor: the same workload run by fio directly on a file on the same file
system (libaio, O_DIRECT), in the same run, interleaved like any other
configuration. Every cell carries ``pct_of_bare_metal`` against the floor of
its own round.

Method (issue 22): an unmeasured ramp, then ``runtime`` seconds measured;
rounds repeat (default 3) with the configurations interleaved so drift spreads
over all of them; statistics (median, 95 % interval) are taken over the rounds
by :mod:`kvmtune.lab.stats` and the verdicts. Write cells get a fresh image
every round, large and sparse, so most measured writes land on clusters not
allocated yet (seed 003's effect); the fraction that did is stored
(``unallocated_write_pct``). Read cells get an image filled beforehand and
its page cache dropped (``POSIX_FADV_DONTNEED`` on the image, nothing
system-wide) just before the measurement, except where the cache mode reads
through the host page cache on purpose (writeback, writethrough, unsafe), which
the cell records as ``warm``.

Retries (issue 50): a cell that fails, other than an impossible combination, is
measured once more at the end of its round, after the others (a write cell on a
fresh image, the way its round measured it), and is stored as failed only if
that fails too; the cell stores ``attempts`` (2) and its first try's error,
and its progress line says it was retried. The round's images are deleted
before the first retry, so that no retry measures the write-back of what the
round's last cell left dirty.

What the harness costs (issue 22's speed goals; bench/storage/block_speed.py
measures it):

- one fio process per round (:meth:`BlockTier.run_batch`, :mod:`~kvmtune.lab.storage.fiobatch`) for
  the consecutive write cells on images made ahead, and the floor: fio's start (its libraries, a CPU-clock
  calibration, a fixed 100 ms wait for its job threads: about 0.25 s) is paid once, and each job starts
  only once the previous one has ended (fio's ``stonewall``: about 0.3 s between two jobs; issue 50). Cells
  that leave dirty pages in the host page cache (writeback, unsafe) run last in the round; the last is
  killed without writing back, as the round's deletion follows (before any retry, below). Other cells
  (reads, images their own cell makes) run one fio process each: a first-write cell's unmeasured ramp is
  then a job of its own before the measured one (the measured job's ``startdelay`` is the ramp plus 20
  ms). fio reads the time with ``clock_gettime`` (its default CPU clock is calibrated at every start,
  about 0.25 s on a loaded 2-core host; a vDSO clock read costs tens of nanoseconds, nothing beside a
  4 KiB request);
- the floor writes to one file per file system, written through once before
  the first round and overwritten in place every round. A preallocated but
  never-written file would split its extents at every random write, and
  deleting it cost 14–76 s of discards per round on this host's
  ``discard``-mounted work directory;
- a round's fresh images are deleted together, in parallel, between rounds,
  never while a cell measures. On a file system mounted with ``discard`` (this
  host's root: ext4 without a journal, which discards each freed extent inside
  unlink, one at a time) a randomly written image is one extent per written
  block, and a fresh qcow2 two per cluster: deleting a seed-003 round's seven
  images took about 590,000 discards, 17–47 s. Each image's extents are first
  merged (:func:`kvmtune.lab.workdir.coalesce_extents`: metadata only), which
  left about 17,000 discards and 3–6 s per round. A file in the same directory
  is then fsync'ed, so that on a journalled file system the commit that carries
  the discards is over before the next round starts;
- while they are deleted, the next round's sparse images are made (and
  synced), so no cell waits for ``qemu-img create`` and none measures the
  write-back of the metadata it wrote. Each is still fresh: nothing writes to
  it before its own cell.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvmtune.bench.storage.blockjobs import (
    allocated_bytes,
    allocation,
    check_tools,
    drop_cache,
    filled_first,
    fio_argv,
    fio_ms,
    first_after,
    floor_options,
    job_args,
    last_before,
    nbd_uri,
    own_jobs,
    run_fio,
    settle,
    sync_file,
    writes_done,
    writes_to,
)
from kvmtune.bench.storage.guest import StorageContext, describe, storage_cell, storage_environment
from kvmtune.bench.storage.hostfs import HostFs, make_host_fs
from kvmtune.bench.storage.hostio import HostSampler, tps
from kvmtune.bench.storage.matrix import StorageConfig
from kvmtune.errors import KvmtuneError
from kvmtune.lab.runner import Cell, CellSink
from kvmtune.lab.storage import fio as fiomod
from kvmtune.lab.storage import fiobatch
from kvmtune.lab.storage.replay import Replay
from kvmtune.lab.workdir import check_free_space, free_bytes, release_file, stop_process
from kvmtune.qemuopts import (
    CACHE_MODES,
    Aio,
    Cache,
    ImageFormat,
    Preallocation,
    fio_option,
    keyval,
    member,
)

TIER = "block"
RAMP_S = 0.5
# sparse write images: large enough that most measured 4 KiB writes find an allocation unit not allocated
# yet. fio's random map writes no 4 KiB block twice in a pass over the file, so where the unit is the host
# file system's 4 KiB block (raw, and a qcow2 whose clusters are preallocated in its metadata) the image only
# needs more blocks than a cell writes: 4 GiB holds 1,048,576, eight times the 121,000 writes of a 22k-IOPS
# cell (measured: 99.9-100 % fresh), and merging its extents before deletion (coalesce_extents) costs about
# a third less than at 16 GiB. A fresh qcow2's unit is its 64 KiB cluster, which 16 different blocks share:
# 16 GiB is 262,144 clusters, and 81-99 % of the measured writes found a new one here
FIRST_WRITE_MIB = 16 * 1024
BLOCK_UNIT_SHARE = 4  # images whose unit is the file system's block are FIRST_WRITE_MIB / this
QCOW2_CLUSTER = 64 * 1024
FS_BLOCK = 4096
SOCKET_WAIT_S = 10.0
SOCKET_POLL_S = 0.002
RAMP_JOB = "ramp"
RAMP_GAP_S = 0.02  # between the ramp job's end (its last requests drained) and the measured job's start
BATCH_SAMPLE_S = 0.02  # /proc/diskstats while a batch runs: a cell's window is known to this much
DELETE_THREADS = 8
FLUSH_BELOW = 4 << 30  # free bytes under which the round's images are deleted before the next one is made


def _on(flag: bool) -> str:
    return "on" if flag else "off"


def daemon_argv(image: str, fmt: str, cache: str, aio: str, socket: Path, *, device: bool = False) -> list[str]:
    """qemu-storage-daemon's arguments: the protocol and format nodes as libvirt would define them, one NBD export."""
    mode = CACHE_MODES[member("cache", Cache, cache)]
    cache_opts = (("cache.direct", mode.direct), ("cache.no-flush", mode.no_flush))
    proto = "host_device" if device else "file"
    return [
        "qemu-storage-daemon",
        "--blockdev", keyval(("driver", proto), ("node-name", "proto0"), ("filename", Path(image)),
                             ("aio", member("aio", Aio, aio)), *cache_opts),
        "--blockdev", keyval(("driver", member("format", ImageFormat, fmt)), ("node-name", "fmt0"), ("file", "proto0"),
                             *cache_opts),
        "--nbd-server", keyval(("addr.type", "unix"), ("addr.path", socket)),
        "--export", keyval(("type", "nbd"), ("id", "exp0"), ("node-name", "fmt0"), ("name", "disk"), ("writable", True),
                           ("writethrough", not mode.write_cache)),
    ]


@contextlib.contextmanager
def storage_daemon(ctx: StorageContext, image: str, cfg: StorageConfig, tag: str, *, write_back: bool = True,
                   started: Callable[[subprocess.Popen[bytes]], None] | None = None) -> Iterator[Path]:
    """Run qemu-storage-daemon for ``image`` until the block exits; yields the NBD socket.

    ``write_back=False``: the daemon is killed even where its cache mode left the cell's writes dirty in the
    host page cache (writeback, unsafe), because the image is scratch and is deleted before any other cell
    measures (:func:`leaves_dirty`); deleting it drops those pages without writing them. ``started`` is given
    the daemon's process (a batch kills its daemons together, :func:`killed_at_end`)."""
    socket = ctx.scratch.path(f"nbd-{tag}.sock")
    ctx.scratch.add_file(socket)
    argv = daemon_argv(image, cfg.fmt, cfg.cache, cfg.aio, socket, device=image.startswith("/dev/"))
    log = ctx.scratch.path(f"qsd-{tag}.log")
    ctx.scratch.add_file(log)
    with open(log, "wb") as err:
        proc = ctx.runner.popen(argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err, start_new_session=True)
    ctx.scratch.add_process(proc)
    if started is not None:
        started(proc)
    try:
        deadline = time.monotonic() + SOCKET_WAIT_S
        while not socket.exists():
            if proc.poll() is not None:
                text = log.read_text(errors="replace").strip().splitlines()
                raise KvmtuneError(f"qemu-storage-daemon refused {cfg.key}: {text[-1] if text else f'exit {proc.returncode}'}")
            if time.monotonic() > deadline:
                raise KvmtuneError(f"qemu-storage-daemon did not open its NBD socket within {SOCKET_WAIT_S:.0f}s")
            time.sleep(SOCKET_POLL_S)
        yield socket
    finally:
        if killed_at_end(cfg, write_back):
            # nothing of the cell's is left dirty in the host page cache (or it goes with the image), and the
            # image is scratch: on SIGTERM QEMU would write back its qcow2 metadata caches and sync the image
            # (60-70 ms here; a writeback cell's whole write-back: 0.2-0.6 s), for nothing
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        stop_process(proc)  # writeback, unsafe: the daemon writes back what the cell left dirty, before the next cell
        with contextlib.suppress(FileNotFoundError):
            socket.unlink()


def killed_at_end(cfg: StorageConfig, write_back: bool) -> bool:
    """Whether :func:`storage_daemon` kills the daemon rather than letting it write back and exit."""
    return not (write_back and leaves_dirty(cfg))


def leaves_dirty(cfg: StorageConfig) -> bool:
    """Whether a cell of ``cfg`` leaves its writes dirty in the host page cache when it ends (writeback,
    unsafe): QEMU writes them back as it exits, or the kernel does later, while another cell measures."""
    mode = CACHE_MODES[cfg.cache]
    return not mode.direct and mode.write_cache


def _first_write(cfg: StorageConfig, w: fiomod.Workload, image: str) -> bool:
    """A write cell on a fresh sparse image file: what it measures is writes to clusters not allocated yet."""
    return writes_to(w) and not filled_first(w) and cfg.prealloc == "off" and _scratch_file(cfg, image)


def _scratch_file(cfg: StorageConfig, image: str) -> bool:
    return cfg.target == "file" and not image.startswith("/dev/")


def _made_ahead(cfg: StorageConfig, w: fiomod.Workload, fs: HostFs) -> bool:
    """A sparse image file that :meth:`BlockTier.prepare_round` makes before the round."""
    return (cfg.target == "file" and fs.vg is None and cfg.prealloc in ("off", "metadata")
            and not (cfg.problem() or _block_problem(cfg, w, fs)))


@dataclass
class BlockPlan:
    configs: list[StorageConfig]  # floor (target=host) included
    workloads: list[fiomod.Workload]
    host_fs: list[str] = field(default_factory=lambda: ["workdir"])
    ramp_s: float = RAMP_S
    first_write_mib: int = FIRST_WRITE_MIB


@dataclass
class _Floor:
    iops: dict[tuple[str, str], float] = field(default_factory=dict)  # (host_fs, workload) → this round's floor


class BlockTier:
    """Measures one cell: image, daemon, fio, figures."""

    def __init__(self, ctx: StorageContext, plan: BlockPlan) -> None:
        self.ctx = ctx
        self.plan = plan
        self.floor = _Floor()
        self.floor_files: dict[str, str] = {}  # host fs name → the floor's written-through file (or volume)
        self.floor_problem: dict[str, str] = {}
        self.graveyard: list[Path] = []  # this round's images and loop backing files, deleted between rounds
        self.discarding: set[Path] = set()  # directories on file systems mounted with 'discard'
        self.ready: dict[tuple[str, str, str], tuple[str, int] | KvmtuneError] = {}  # made ahead: (image, MiB)
        self.deletions: list[tuple[int, float]] = []  # (files, seconds) of each deletion between rounds

    def bury(self, path: Path) -> Path:
        """Delete ``path`` (inside the work directory) at the end of the round rather than now."""
        self.graveyard.append(self.ctx.scratch.inside(path))
        return path

    def flush_graveyard(self) -> tuple[int, float] | None:
        """Delete the buried files, in parallel, and wait for their file systems' journals to commit it;
        (files, seconds), or None when there was nothing to delete."""
        files, self.graveyard = self.graveyard, []
        return self._delete(files)

    def between_rounds(self, systems: Sequence[HostFs], next_rep: int | None) -> tuple[int, float] | None:
        """Delete the finished round's images while the next round's are made (see :meth:`prepare_round`)."""
        files, self.graveyard = self.graveyard, []
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=1) as maker:
            made = maker.submit(self.prepare_round, systems, next_rep) if next_rep is not None else None
            done = self._delete(files)
            if made is not None:
                made.result()
        if done is not None:
            self.deletions[-1] = (done[0], time.monotonic() - started)
            return self.deletions[-1]
        return None

    def _delete(self, files: list[Path]) -> tuple[int, float] | None:
        if not files:
            return None
        started = time.monotonic()
        with ThreadPoolExecutor(max_workers=min(DELETE_THREADS, len(files))) as pool:
            list(pool.map(lambda path: release_file(path, path.parent in self.discarding), files))
        for directory in {p.parent for p in files}:
            settle(directory)
        self.deletions.append((len(files), time.monotonic() - started))
        return self.deletions[-1]

    def prepare_round(self, systems: Sequence[HostFs], rep: int) -> None:
        """Make round ``rep``'s sparse images before its first cell, so that no cell waits for ``qemu-img
        create``. Each is still fresh (never written) when its cell starts, and is synced now, so the
        metadata ``qemu-img`` wrote is not written back while a cell measures. Preallocated images (falloc,
        full) take their whole size at once and are still made by their own cell, one at a time."""
        for fs in systems:
            for cfg in self.plan.configs:
                cfg = replace(cfg, host_fs=fs.name)
                for w in self.plan.workloads:
                    if _made_ahead(cfg, w, fs):
                        self.make_ready(fs, cfg, w, f"{os.getpid()}-r{rep}-{len(self.ready)}")

    def make_ready(self, fs: HostFs, cfg: StorageConfig, w: fiomod.Workload, tag: str) -> None:
        """One cell's sparse image, made and synced now, for :meth:`run_batch` to take (or what making it raised)."""
        size = self.image_size(cfg, w, fs.root)
        try:
            image = self.create_image(fs, cfg, size, tag, ahead=True)
            sync_file(image)
            self.ready[(fs.name, cfg.key, w.name)] = (image, size)
        except (KvmtuneError, OSError) as exc:
            self.ready[(fs.name, cfg.key, w.name)] = KvmtuneError(str(exc))

    def retry(self, unit: tuple[HostFs, StorageConfig, fiomod.Workload], tag: str, *, last_in_round: bool) -> Cell:
        """A failed cell measured again, the way its round measured it: a write cell on a fresh image made now,
        in a fio process of its own but with the options of a round's shared one (:meth:`run_batch`: fio's
        ramp_time, the allocation sampled after the ramp, the time stamps); any other cell as a cell of its own."""
        fs, cfg, w = unit
        if cfg.target != "host" and writes_to(w) and _made_ahead(cfg, w, fs):
            self.make_ready(fs, cfg, w, f"{tag}-retry")
        if not self.batchable(fs, cfg, w):
            self.ready.pop((fs.name, cfg.key, w.name), None)
            return _single_cell(self, unit, tag, last_in_round=last_in_round)
        try:
            return self.run_batch(fs, [(cfg, w, tag)], last_in_round=last_in_round)[0]
        except KvmtuneError as exc:
            return storage_cell(cfg, w.name, "error", error=str(exc))

    def prepare_floor(self, fs: HostFs) -> None:
        """The floor's file for ``fs``, written through once: every round overwrites it in place."""
        ctx = self.ctx
        try:
            target = fs.floor_target(ctx, ctx.disk_mib, f"{os.getpid()}-{fs.name}")
            run_fio(ctx, [fio_option("filename", Path(target)), "--name=fill", "--rw=write", "--bs=1m", "--iodepth=4",
                       "--ioengine=libaio", "--direct=1", fio_option("size", f"{int(ctx.disk_mib)}m")], 300)
        except KvmtuneError as exc:
            self.floor_problem[fs.name] = str(exc)
            return
        self.floor_files[fs.name] = target

    def image_size(self, cfg: StorageConfig, w: fiomod.Workload, fs_root: Path | None = None) -> int:
        if writes_to(w) and not filled_first(w) and cfg.prealloc in ("off", "metadata", "falloc") and cfg.target == "file":
            cluster_unit = cfg.fmt == "qcow2" and cfg.prealloc == "off"
            size = max(self.ctx.disk_mib, self.plan.first_write_mib // (1 if cluster_unit else BLOCK_UNIT_SHARE))
            if fs_root is not None:  # never larger than half the file system it lives on (scratch --host-fs are 8 GiB)
                st = os.statvfs(fs_root)
                size = max(self.ctx.disk_mib, min(size, st.f_blocks * st.f_frsize // 2 >> 20))
            return size
        return self.ctx.disk_mib

    def create_image(self, fs: HostFs, cfg: StorageConfig, size_mib: int, tag: str, *, ahead: bool = False) -> str:
        if cfg.target in ("block", "device") or fs.vg is not None:  # on lvm an image is a raw logical volume
            user = self.ctx.user_device if cfg.target == "device" else None
            return fs.block_device(self.ctx, size_mib, tag, user, keep=self.bury)
        need = (size_mib << 20) if cfg.prealloc in ("full", "falloc") else (64 << 20)
        if self.graveyard and not ahead and free_bytes(fs.root) < need + FLUSH_BELOW:
            self.flush_graveyard()  # between cells: the space this round's images took is needed now
        check_free_space(fs.root, need + (64 << 20), f"a {size_mib} MiB {cfg.fmt} image")
        path = self.bury(fs.root / f"img-{tag}.{cfg.fmt}")
        argv = ["qemu-img", "create", "-q", "-f", cfg.fmt]
        if cfg.prealloc != "off":
            argv += ["-o", keyval(("preallocation", member("preallocation", Preallocation, cfg.prealloc)))]
        res = self.ctx.runner.run([*argv, str(path), f"{size_mib}M"], timeout=600)
        if not res.ok:
            raise KvmtuneError(f"{path.name}: qemu-img create failed: {res.describe_failure()}")
        return str(path)

    def new_cell(self, fs: HostFs, cfg: StorageConfig, w: fiomod.Workload) -> Cell:
        cell = storage_cell(cfg, w.name)
        cell.config.update({"bs": w.bs, "iodepth": w.iodepth, "runtime_s": self.ctx.runtime_s, "ramp_s": self.plan.ramp_s,
                            "fs_type": fs.fs_type, "device": fs.device})
        return cell

    def run_cell(self, fs: HostFs, cfg: StorageConfig, w: fiomod.Workload, tag: str, *, last_in_round: bool = False) -> Cell:
        """One cell in a fio process of its own. ``last_in_round``: no other cell measures before the round's
        images are deleted, so a writeback daemon need not write back (:func:`storage_daemon`)."""
        cell = self.new_cell(fs, cfg, w)
        started = time.monotonic()
        if cfg.target == "host":
            return self._floor_cell(fs, cfg, w, tag, cell, started)
        ready = self._take_ready(fs, cfg, w)
        if ready is not None:
            image, size = ready  # made before the round started, never written since
        else:
            size = self.image_size(cfg, w, fs.root)
            image = self.create_image(fs, cfg, size, tag)  # a fresh image for every round, deleted when it ends
        write_back = not (last_in_round and _scratch_file(cfg, image))
        return self._measure(fs, cfg, w, tag, cell, started, image, size, write_back)

    def _measure(self, fs: HostFs, cfg: StorageConfig, w: fiomod.Workload, tag: str, cell: Cell, started: float,
                 image: str, size: int, write_back: bool) -> Cell:
        ctx, seconds = self.ctx, self.ctx.runtime_s
        sampler = HostSampler(ctx.host, fs.device, None)
        with storage_daemon(ctx, image, cfg, tag, write_back=write_back) as socket:
            uri = ["--ioengine=nbd", nbd_uri(socket)]
            timeout = seconds * 3 + 60
            first_write = _first_write(cfg, w, image)
            if filled_first(w):
                run_fio(ctx, [*uri, "--name=fill", "--rw=write", "--bs=1m", "--iodepth=4", fio_option("size", f"{int(size)}m")],
                     300)
                if CACHE_MODES[cfg.cache].direct:
                    if not image.startswith("/dev/"):
                        drop_cache(image)  # the fill went through O_DIRECT too; this catches what the fs kept
                else:
                    cell.config["warm"] = True  # reads through the host page cache on purpose
            before = allocated_bytes(image) if first_write else 0
            if first_write and self.plan.ramp_s > 0:
                # the ramp is a job of its own, in the same fio run, and the measured job starts once it is over
                # (startdelay, its own reporting group): a second fio start would cost more than the ramp, fio's
                # ramp_time would hide how many writes the ramp made, and a stonewall costs fio another 100 ms
                # wait for the next job to start
                delay = fio_option("startdelay", fio_ms(self.plan.ramp_s + RAMP_GAP_S))
                jobs = [*job_args(w, self.plan.ramp_s, size, name=RAMP_JOB), *job_args(w, seconds, size), delay,
                        "--new_group"]
            else:
                jobs = job_args(w, seconds, size, ramp=self.plan.ramp_s)
            a = sampler.snap()
            m, raw = run_fio(ctx, [*uri, *jobs], timeout, job=w.name)
            b = sampler.snap()
            measured_end = time.monotonic()
        # writeback: the daemon writes back what the cell left dirty before it exits, and the next cell waits for it
        m["daemon_exit_s"] = time.monotonic() - measured_end
        self._image_figures(m, cfg, w, image, before, writes_done(raw, RAMP_JOB))
        self._host_figures(m, a, b)
        cell.metrics, cell.raw = m, raw
        cell.duration_s = time.monotonic() - started
        return cell

    def _floor_cell(self, fs: HostFs, cfg: StorageConfig, w: fiomod.Workload, tag: str, cell: Cell,
                    started: float) -> Cell:
        ctx = self.ctx
        target = self.floor_files.get(fs.name)
        if target is None:
            raise KvmtuneError(self.floor_problem.get(fs.name, "no floor file"))
        sampler = HostSampler(ctx.host, fs.device, None)
        args = job_args(w, ctx.runtime_s, ctx.disk_mib, ramp=self.plan.ramp_s)
        a = sampler.snap()
        m, raw = run_fio(ctx, [*floor_options(target, w), *args], ctx.runtime_s * 3 + 60)
        b = sampler.snap()
        self._host_figures(m, a, b)
        m["pct_of_bare_metal"] = 100.0
        if m.get("iops"):
            self.floor.iops[(cfg.host_fs, w.name)] = m["iops"]
        cell.metrics, cell.raw, cell.duration_s = m, raw, time.monotonic() - started
        return cell

    def batchable(self, fs: HostFs, cfg: StorageConfig, w: fiomod.Workload) -> bool:
        """Whether a cell can share a fio process with its neighbours (:meth:`run_batch`): the floor, and write
        cells on an image made before the round. A read cell fills its image and drops its cache first."""
        if cfg.target == "host":
            return fs.name in self.floor_files
        # a replay is a fio run of its own (a timed log is several jobs, one a stream: lab/storage/replay.py)
        return (writes_to(w) and not filled_first(w) and not w.replay
                and isinstance(self.ready.get((fs.name, cfg.key, w.name)), tuple))

    def run_batch(self, fs: HostFs, units: Sequence[tuple[StorageConfig, fiomod.Workload, str]], *,
                  last_in_round: bool = False, since: float | None = None) -> list[Cell]:
        """Consecutive :meth:`batchable` cells in one fio process (:mod:`~kvmtune.lab.storage.fiobatch`):
        every daemon is started first, each cell's job starts once the previous one has ended (its ramp an
        unmeasured lead-in), and the jobs' own time stamps say when each cell measured, for its host figures, and
        that no two cells overlapped (were one to, it would be stored as an error: a defect, not noise). Each cell keeps its
        own fio JSON (its jobs, under the names a cell of its own would have). ``last_in_round``: the last
        cell's daemon need not write back (:func:`storage_daemon`). Each cell's ``slot_s`` is the wall time
        from the previous cell's end (``since``, wall clock) to its own."""
        ctx, seconds, ramp = self.ctx, self.ctx.runtime_s, self.plan.ramp_s
        epoch0 = since if since is not None else time.time()
        mono_minus_epoch = time.monotonic() - time.time()
        cells: list[Cell] = [self.new_cell(fs, cfg, w) for cfg, w, _ in units]
        plans: list[tuple[int, str, str]] = []  # (unit, job, image)
        jobs: list[fiobatch.BatchJob] = []
        killed: list[subprocess.Popen[bytes]] = []  # daemons stopped by SIGKILL once fio is done, all at once
        workdir = ctx.scratch.add_dir(ctx.scratch.path(f"batch-{units[0][2]}"))  # fio writes its stamps here
        with contextlib.ExitStack() as daemons:
            for i, (cfg, w, tag) in enumerate(units):
                try:
                    if cfg.target == "host":
                        target = self.floor_files[fs.name]
                        opts = floor_options(target, w)
                        image, size = target, ctx.disk_mib
                    else:
                        ready = self._take_ready(fs, cfg, w)
                        if ready is None:
                            raise KvmtuneError("no image was made for this cell before the round")
                        image, size = ready
                        write_back = not (last_in_round and i == len(units) - 1 and _scratch_file(cfg, image))
                        kill = killed.append if killed_at_end(cfg, write_back) else None
                        socket = daemons.enter_context(storage_daemon(ctx, image, cfg, tag, write_back=write_back, started=kill))
                        opts = ["--ioengine=nbd", nbd_uri(socket)]
                except KvmtuneError as exc:
                    cells[i] = storage_cell(cfg, w.name, "error", error=str(exc))
                    continue
                # one job, its ramp fio's ramp_time: a first-write cell's share of new clusters is then
                # counted from an allocation sample taken after the ramp (see below), not from a ramp job of
                # its own, which would cost another gap between jobs
                name = f"c{i}"
                jobs.append(fiobatch.BatchJob(name, (*opts, *job_args(w, seconds, size, ramp=ramp)[1:]), ramp + seconds))
                plans.append((i, name, image))
            if not jobs:
                return cells
            fresh = [image for i, _, image in plans if _first_write(units[i][0], units[i][1], image)]
            sampler = HostSampler(ctx.host, fs.device, None, interval=BATCH_SAMPLE_S, extra=lambda: allocation(fresh))
            sampler.start()
            try:
                timeout = fiobatch.planned_seconds(jobs) * 2 + 60
                res = ctx.runner.run(fio_argv(fiobatch.batch_argv(jobs)), timeout=timeout, cwd=str(workdir))
            finally:
                sampler.stop()
                for proc in killed:  # together rather than one after the other (about 30 ms each)
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
        done = time.time()  # every daemon stopped
        times = fiobatch.read_times(workdir, [j.name for j in jobs])
        names = [j.name for j in jobs]
        previous_end = epoch0
        for k, (i, name, image) in enumerate(plans):
            cfg, w, _ = units[i]
            cell = cells[i]
            try:
                m = fiomod.parse_fio_json(res.stdout, name)
            except ValueError as exc:
                why = f"fio: {exc}" + ("" if res.ok else f" ({res.describe_failure()})")
                cells[i] = storage_cell(cfg, w.name, "error", error=why)
                continue
            when = times.get(name)
            if when is None:
                cells[i] = storage_cell(cfg, w.name, "error", error="fio did not stamp this cell's start and end")
                continue
            overlap = fiobatch.overlap_s(times, names, name)
            if overlap > ramp:
                cells[i] = storage_cell(cfg, w.name, "error", error=f"fio started this cell {overlap * 1000:.0f} ms "
                                        "before the previous one had ended, more than its ramp: its figures are not "
                                        "its own")
                continue
            if cfg.target == "host":
                m["pct_of_bare_metal"] = 100.0
                if m.get("iops"):
                    self.floor.iops[(cfg.host_fs, w.name)] = m["iops"]
            else:
                # the first sample safely after the ramp: clusters allocated before it are not counted, so the
                # share of measured writes that found a new cluster stays a lower bound, as in _measure
                after_ramp = first_after(sampler.series, when.start + ramp + mono_minus_epoch + BATCH_SAMPLE_S / 2)
                allocated = after_ramp.extra.get(image) if after_ramp is not None else None
                if allocated is not None or not _first_write(cfg, w, image):
                    self._image_figures(m, cfg, w, image, allocated or 0, 0.0)
            a = last_before(sampler.series, when.start + mono_minus_epoch)
            b = first_after(sampler.series, when.end + mono_minus_epoch)
            if a is not None and b is not None:
                self._host_figures(m, a, b)
            end = done if k == len(plans) - 1 else when.end
            if overlap:
                m["ramp_overlap_ms"] = overlap * 1000  # the previous cell's last requests, during this one's ramp
            m["slot_s"] = end - previous_end
            previous_end = end
            cell.metrics, cell.raw = m, own_jobs(res.stdout, {name: w.name})
            cell.duration_s = when.end - when.start
        return cells

    def _take_ready(self, fs: HostFs, cfg: StorageConfig, w: fiomod.Workload) -> tuple[str, int] | None:
        """The cell's image made before the round, (path, MiB); None when none was; raises what making it did."""
        ready = self.ready.pop((fs.name, cfg.key, w.name), None)
        if isinstance(ready, KvmtuneError):
            raise ready
        return ready

    def _image_figures(self, m: dict[str, float], cfg: StorageConfig, w: fiomod.Workload, image: str,
                       allocated_before: int, ramp_writes: float) -> None:
        """The share of measured writes that found a new cluster, and the cell against its round's floor."""
        if _first_write(cfg, w, image):
            unit = QCOW2_CLUSTER if cfg.fmt == "qcow2" else FS_BLOCK
            writes = m.get("iops_write", 0.0) * m.get("fio_runtime_s", 0.0)
            # every ramp write is counted as one that found a new cluster: what is left is a lower bound
            new_units = (allocated_bytes(image) - allocated_before) / unit - ramp_writes
            if writes > 0:
                m["unallocated_write_pct"] = max(0.0, min(100.0, 100.0 * new_units / writes))
        elif writes_to(w):
            m["unallocated_write_pct"] = 0.0  # preallocated, or a whole device
        floor = self.floor.iops.get((cfg.host_fs, w.name))
        if floor and m.get("iops"):
            m["pct_of_bare_metal"] = 100.0 * m["iops"] / floor

    @staticmethod
    def _host_figures(m: dict[str, float], a: Any, b: Any) -> None:
        t = tps(a, b)
        if t is not None:
            m["host_tps"] = t  # transactions/s as iostat counts them, on the device holding the file system
        m["window_s"] = b.t - a.t


def run_block(ctx: StorageContext, plan: BlockPlan, sink: CellSink) -> None:
    """Every file system made once; then round after round, each file system, each configuration (the floor
    first), each workload. A cell that failed (other than an impossible combination) is measured once more at
    the end of its round, after the others, and stored as failed only if that fails too."""
    check_tools(ctx)
    tier = BlockTier(ctx, plan)
    n = 0
    with contextlib.ExitStack() as stack:
        systems = [stack.enter_context(make_host_fs(ctx, name)) for name in plan.host_fs]
        stack.callback(tier.flush_graveyard)  # also on Ctrl-C, and before a scratch file system is unmounted
        for fs in systems:
            if fs.discards:
                tier.discarding.add(fs.root.resolve())
                print(f"kvmtune: note: {fs.root} is on a file system mounted with 'discard': each round's freshly "
                      "written images are deleted between rounds, never while a cell measures, after their extents "
                      "are merged (one discard per freed extent otherwise: tens of seconds per round)",
                      file=sys.stderr)
        with ThreadPoolExecutor(max_workers=1) as maker:  # the first round's images, while the floors are written
            made = maker.submit(tier.prepare_round, systems, 0)
            for fs in systems:
                if any(c.target == "host" for c in plan.configs):
                    tier.prepare_floor(fs)
            made.result()
        for rep in range(ctx.repeat):
            if rep:
                _round_done(tier, systems, rep)
            units = [(fs, replace(cfg, host_fs=fs.name), w) for fs in systems for cfg in round_order(plan.configs)
                     for w in plan.workloads]
            failed: list[tuple[int, Cell]] = []  # (unit, its first try): measured again once the round is through
            last_end, i = time.time(), 0
            while i < len(units):
                j = _batch_end(tier, units, i)
                tags = [f"{os.getpid()}-{n + k + 1}" for k in range(j - i)]
                n += j - i
                fs = units[i][0]
                mark = ctx.scratch.mark()
                try:
                    if j - i > 1:
                        batch = [(cfg, w, tag) for (_, cfg, w), tag in zip(units[i:j], tags, strict=True)]
                        cells = tier.run_batch(fs, batch, last_in_round=j == len(units), since=last_end)
                    else:
                        cells = [_single_cell(tier, units[i], tags[0], last_in_round=j == len(units))]
                        if cells[0].ok:
                            cells[0].metrics["slot_s"] = time.time() - last_end
                finally:
                    ctx.scratch.cleanup(mark)  # the cells' daemons, sockets, images, loop devices
                for k, cell in enumerate(cells):
                    cell.rep = rep
                    if cell.ok or _problem(units[i + k]):
                        sink.record(cell)
                    else:
                        failed.append((i + k, cell))
                last_end, i = time.time(), j
            if failed:
                # the round's last cell was stopped without writing back what it left dirty in the host page
                # cache, on the promise that the round's deletion came next: it does now, before any retry measures
                tier.flush_graveyard()
            for k, (u, first) in enumerate(failed):
                n += 1
                mark = ctx.scratch.mark()
                try:
                    cell = tier.retry(units[u], f"{os.getpid()}-{n}", last_in_round=k == len(failed) - 1)
                finally:
                    ctx.scratch.cleanup(mark)
                cell.rep, cell.attempts, cell.first_error = rep, 2, first.error
                sink.record(cell)
        _round_done(tier, systems, ctx.repeat)


def round_order(configs: Sequence[StorageConfig]) -> list[StorageConfig]:
    """The configurations in the order a round measures them: as given (the floor first), except that those
    whose cells leave dirty pages in the host page cache come last, so that the round's deletion drops those
    pages instead of a daemon writing them back (:func:`storage_daemon`)."""
    return sorted(configs, key=leaves_dirty)


def _batch_end(tier: BlockTier, units: Sequence[tuple[HostFs, StorageConfig, fiomod.Workload]], i: int) -> int:
    """Where the batch that starts at ``units[i]`` ends (exclusive): consecutive batchable cells of one file
    system, closed after a cell that leaves dirty pages (they would be written back during the next cell)."""
    j = i
    while j < len(units):
        fs, cfg, w = units[j]
        if fs is not units[i][0] or cfg.problem() or _block_problem(cfg, w, fs) or not tier.batchable(fs, cfg, w):
            break
        j += 1
        if leaves_dirty(cfg):
            break
    return max(j, i + 1)


def _problem(unit: tuple[HostFs, StorageConfig, fiomod.Workload]) -> str | None:
    """Why a cell cannot be measured at all (an impossible combination): it fails every time, so it is not retried."""
    fs, cfg, w = unit
    return cfg.problem() or _block_problem(cfg, w, fs)


def _single_cell(tier: BlockTier, unit: tuple[HostFs, StorageConfig, fiomod.Workload], tag: str, *,
                 last_in_round: bool) -> Cell:
    fs, cfg, w = unit
    problem = _problem(unit)
    if problem:
        return storage_cell(cfg, w.name, "error", error=problem)
    try:
        return tier.run_cell(fs, cfg, w, tag, last_in_round=last_in_round)
    except KvmtuneError as exc:
        return storage_cell(cfg, w.name, "error", error=str(exc))


def _round_done(tier: BlockTier, systems: Sequence[HostFs], rounds: int) -> None:
    """Delete the finished round's images (making the next round's meanwhile) and say what it cost (the
    benchmark under bench/ reads this line)."""
    done = tier.between_rounds(systems, rounds if rounds < tier.ctx.repeat else None)
    if done is not None:
        clear = "\r\033[K" if sys.stderr.isatty() else ""  # over the progress line, which the next cell redraws
        print(f"{clear}kvmtune: round {rounds}: deleted {done[0]} images in {done[1]:.1f} s", file=sys.stderr, flush=True)


def _block_problem(cfg: StorageConfig, w: fiomod.Workload, fs: HostFs) -> str | None:
    if w.fs or w.is_cycle:
        return f"{w.name} needs a guest (its own file system or a VM lifetime): run it with --tier guest"
    if cfg.target == "device" and fs.name != "workdir":
        return "a named --device is its own file system: --host-fs does not apply"
    if fs.name == "lvm" and cfg.target == "file" and cfg.fmt != "raw":
        return "the lvm host file system holds raw volumes only (format=raw)"
    return None


def block_configs(formats: Sequence[tuple[str, str]], modes: Sequence[tuple[str, str]],
                  targets: Sequence[str] = ("file",)) -> list[StorageConfig]:
    """The floor, then every image × cache/aio on every target."""
    out = [StorageConfig(bus="none", target="host", tier=TIER, cache="none", aio="native")]
    for t in targets:
        for fmt, pre in formats if t == "file" else [("raw", "off")]:
            for cache, aio in modes:
                out.append(StorageConfig(bus="nbd", cache=cache, aio=aio, fmt=fmt, prealloc=pre, target=t, tier=TIER))
    return out


def block_preset(name: str) -> tuple[list[StorageConfig], list[str]]:
    """(configurations, workload names) of a preset on this tier."""
    if name == "seed-003":
        # the seven configurations of issue 22's table: seed 003's two claims, plus writeback
        cfgs = [
            StorageConfig(bus="none", target="host", tier=TIER, cache="none", aio="native"),
            *(StorageConfig(bus="nbd", cache="none", aio="native", fmt=f, prealloc=p, tier=TIER)
              for f, p in (("raw", "off"), ("qcow2", "off"), ("qcow2", "metadata"))),
            StorageConfig(bus="nbd", cache="writeback", aio="threads", fmt="qcow2", prealloc="off", tier=TIER),
            *(StorageConfig(bus="nbd", cache="writethrough", aio="threads", fmt=f, prealloc=p, tier=TIER)
              for f, p in (("raw", "off"), ("qcow2", "metadata"), ("qcow2", "off"))),
        ]
        return cfgs, ["randwrite-4k"]
    if name == "seed-001":
        images = (("qcow2", "off"), ("qcow2", "metadata"), ("raw", "off"), ("raw", "falloc"))
        return block_configs(images, (("none", "native"), ("writethrough", "threads"))), ["randwrite-4k", "seqwrite-1m"]
    if name == "file-vs-block":
        return block_configs((("raw", "off"),), (("none", "native"),), ("file", "block")), ["randread-4k", "randwrite-4k"]
    raise KvmtuneError(f"preset {name} has no block-tier form (block-tier presets: seed-003, seed-001, file-vs-block)")


@dataclass
class BlockBenchmark:
    """The block tier as a :class:`~kvmtune.lab.runner.Benchmark`."""

    ctx: StorageContext
    blocks: BlockPlan
    kind: str = "block"
    replay: Replay | None = None  # a captured workload (--replay FILE): its workload is the plan's only one

    def planned_cells(self) -> int:
        b = self.blocks
        return len(b.configs) * len(b.workloads) * len(b.host_fs) * self.ctx.repeat

    def plan(self) -> str:
        what = f"; replaying the {self.replay.label}" if self.replay is not None else ""
        return (f"{self.planned_cells()} cells (block tier: qemu-storage-daemon + fio nbd, {self.blocks.ramp_s:g}s ramp "
                f"+ {self.ctx.runtime_s:g}s measured, {self.ctx.repeat} interleaved rounds{what})")

    def environment(self) -> dict[str, Any]:
        env = storage_environment(self.ctx)
        env["tier"] = TIER
        res = self.ctx.runner.run(["qemu-storage-daemon", "--version"], timeout=20)
        env["qemu_storage_daemon"] = res.stdout.splitlines()[0] if res.ok and res.stdout else None
        if self.replay is not None:
            env["replay"] = self.replay.record()  # results show RUN --format json: its digest, source, mode, disk
        return env

    def describe(self, cell: Cell) -> str:
        pct = cell.metrics.get("pct_of_bare_metal")
        return describe(cell) + (f" ({pct:.0f}% of bare metal)" if pct is not None else "")

    def execute(self, sink: CellSink) -> None:
        self.ctx.sink = sink
        if self.replay is not None:
            self.replay.write()  # the translated logs, into the scratch directory the workload names
            for written in self.replay.log_paths():
                self.ctx.scratch.add_file(written)
        run_block(self.ctx, self.blocks, sink)

    def cleanup(self) -> list[str]:
        problems = self.ctx.scratch.cleanup()
        shutil.rmtree(self.ctx.scratch.root, ignore_errors=True)
        return problems
