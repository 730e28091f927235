"""The block tier's fio runs and the files under them: fio's argument list (one process, threads, the
``clock_gettime`` clock), a job's arguments, the floor's options, fio's figures by job, and the scratch files' page
cache, allocation and sync, and the tools it needs (:mod:`kvmtune.bench.storage.block` runs the cells with them)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

from kvmtune.bench.storage.guest import StorageContext
from kvmtune.bench.storage.hostio import Snapshot
from kvmtune.errors import KvmtuneError
from kvmtune.lab.storage import fio as fiomod
from kvmtune.qemuopts import fio_nbd_uri, fio_option

INSTALL_HINT = "install qemu-storage-daemon (Debian: apt install qemu-system-common) and fio with its nbd engine (fio ≥ 3.13)"
FIO_CLOCK = "--clocksource=clock_gettime"  # no CPU-clock calibration at each fio start (see block.py's docstring)


def fio_argv(args: Sequence[str]) -> list[str]:
    # --thread: fio's jobs are threads of the one process, so stopping fio (Ctrl-C, a timeout) stops them all;
    # a forked job process would outlive its killed parent
    return ["fio", "--thread", FIO_CLOCK, *args, "--output-format=json"]


def floor_options(target: str, w: fiomod.Workload | None = None) -> list[str]:
    """The floor: fio straight on the host file (or device), O_DIRECT. A replayed log is redirected to it: the
    log's own file name would otherwise be a file fio creates in its working directory."""
    out = [fio_option("filename", Path(target)), "--ioengine=libaio", "--direct=1"]
    if w is not None and any(a.startswith("--read_iolog=") for a in w.replay):
        out.append(fio_option("replay_redirect", Path(target)))
    return out


def run_fio(ctx: StorageContext, argv: list[str], timeout: float, job: str | None = None) -> tuple[dict[str, float], str]:
    """Run fio; the figures of its first job, or of the job named ``job``."""
    res = ctx.runner.run(fio_argv(argv), timeout=timeout)
    if not res.ok:
        raise KvmtuneError(f"fio failed: {res.describe_failure()}")
    try:
        return fiomod.parse_fio_json(res.stdout, job), res.stdout
    except ValueError as exc:
        raise KvmtuneError(f"fio output unusable: {exc}") from None


def writes_done(raw: str, job: str) -> float:
    """Write requests fio's job ``job`` completed (0 when it is absent)."""
    try:
        m = fiomod.parse_fio_json(raw, job)
    except ValueError:
        return 0.0
    return m.get("iops_write", 0.0) * m.get("fio_runtime_s", 0.0)


def job_args(w: fiomod.Workload, seconds: float, size_mib: int, *, ramp: float = 0.0, name: str | None = None) -> list[str]:
    if w.replay:  # a captured workload: its own options, sized and timed when it was built (lab/storage/replay.py)
        return [fio_option("name", name or w.name), *w.replay, "--group_reporting"]
    args = [fio_option("name", name or w.name), fio_option("rw", w.rw), fio_option("bs", w.bs),
            fio_option("iodepth", w.iodepth), fio_option("size", f"{int(size_mib)}m"), fio_option("runtime", fio_ms(seconds)),
            "--time_based", "--group_reporting"]
    if w.rwmixread is not None:
        args.append(fio_option("rwmixread", w.rwmixread))
    if ramp > 0:
        args.append(fio_option("ramp_time", fio_ms(ramp)))
    return args


def fio_ms(seconds: float) -> str:
    """fio reads a bare number of seconds as an integer: 0.5 would be 0, i.e. no time limit."""
    return f"{max(1, round(seconds * 1000))}ms"


def writes_to(w: fiomod.Workload) -> bool:
    return "write" in w.rw or w.rw.endswith("rw")


def filled_first(w: fiomod.Workload) -> bool:
    """A cell whose image is written whole before it measures: a read cell, and a replayed workload that reads
    (reads of never-written areas are answered from holes, not read; the captured guest's reads were of its data, and
    its writes then land on written blocks too, as on the captured disk)."""
    return not writes_to(w) or (bool(w.replay) and w.rw != "randwrite")


def drop_cache(path: str) -> None:
    """Drop the host page cache of one file (ours): the read cell starts cold."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def allocated_bytes(path: str) -> int:
    return os.stat(path).st_blocks * 512


def settle(directory: Path) -> None:
    """Wait until the journal has committed what was freed in ``directory``'s file system (and, mounted with
    ``discard``, discarded it): fsync a small file of ours there, which commits the running transaction."""
    marker = directory / ".kvmtune-settle"
    with contextlib.suppress(OSError):
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, b"1")
            os.fsync(fd)
        finally:
            os.close(fd)
            marker.unlink()


def sync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def last_before(series: Sequence[Snapshot], t: float) -> Snapshot | None:
    before = [s for s in series if s.t <= t]
    return before[-1] if before else None


def first_after(series: Sequence[Snapshot], t: float) -> Snapshot | None:
    return next((s for s in series if s.t >= t), None)


def allocation(images: Sequence[str]) -> dict[str, int]:
    out = {}
    for image in images:
        with contextlib.suppress(OSError):
            out[image] = allocated_bytes(image)
    return out


def own_jobs(raw: str, rename: dict[str, str]) -> str:
    """fio's JSON with only the jobs in ``rename``, under their new names: what one cell's own fio run prints."""
    try:
        data = json.loads(raw[raw.index("{") :])
    except (ValueError, json.JSONDecodeError):
        return raw
    jobs = [j for j in data.get("jobs") or [] if isinstance(j, dict) and j.get("jobname") in rename]
    for j in jobs:
        j["jobname"] = rename[j["jobname"]]
    data["jobs"] = jobs
    return json.dumps(data, indent=1)


def nbd_uri(socket: Path) -> str:
    """fio's ``--uri=`` for the daemon's export."""
    return fio_nbd_uri("disk", socket)


def check_tools(ctx: StorageContext) -> None:
    """One line naming what to install when the daemon or fio's nbd engine is missing."""
    if ctx.runner.which("qemu-storage-daemon") is None:
        raise KvmtuneError(f"qemu-storage-daemon not found: {INSTALL_HINT}")
    res = ctx.runner.run(["fio", "--enghelp=nbd"], timeout=20)
    if not res.ok or "uri" not in res.stdout:
        raise KvmtuneError(f"fio has no nbd engine ('fio --enghelp=nbd' failed): {INSTALL_HINT}")
