"""The one benchmark runner: every tier (storage guest matrix, quick, network,
and the tiers that come later) runs through :class:`BenchRunner`.

Modelled on pyperf's ``Runner``: a benchmark says *what* to measure; the runner
owns everything around it, the same way for every tier:

- the environment record (:func:`base_environment` plus the benchmark's own
  additions) stored with the run row;
- the run row itself: opened before the first cell, closed on **every** exit
  path: ``complete`` (no failed cell), ``errors`` (some cells failed),
  ``partial`` (Ctrl-C or SIGTERM; an ``interrupted`` cell marks where), or
  ``failed`` (any other exception, which is then re-raised);
- SIGTERM turned into ``KeyboardInterrupt`` while the run lasts;
- the progress line per cell, and recording each cell as it completes;
- the benchmark's cleanup, whatever happened;
- one benchmark per host at a time (:class:`HostBenchLock`): a second one is
  refused with one line naming the run that holds the host, because two at once
  disturb each other's numbers (cells off by up to 64 % were seen);
- before measuring: the results database's ``quick_check`` and, with a
  ``workdir``, the sweep of killed runs' leftovers (:mod:`kvmtune.lab.leftovers`,
  one line, kept with ``keep_leftovers``);
- the run's owner (pid, start time, boot id) stored with the run row, so a
  killed run reads back as ``abandoned``.

The API, all a caller needs (``kvmtune verify`` calls it directly)::

    class MyBench:                                 # satisfies Benchmark
        kind = "storage"                           # runs.kind
        def plan(self) -> str: ...                 # "24 cells, accelerator tcg"
        def planned_cells(self) -> int: ...        # for the progress bar
        def environment(self) -> dict[str, Any]: ...
        def execute(self, sink: CellSink) -> None: # sink.record(Cell(...)) per cell
        def describe(self, cell: Cell) -> str: ... # the figure on a progress line
        def cleanup(self) -> list[str]: ...        # problems met while cleaning up
        # optional: seconds the cells not yet recorded will take, for the ETA on the progress line (without it the
        # ETA is the pace of the cells done so far, wrong when they differ: verify's guest tier boots, its block
        # tier does not)
        def remaining_seconds(self) -> float | None: ...

    with Store(db) as store:
        outcome = BenchRunner(store, args={...}, preset=None, note=None).run(MyBench())
    outcome.status, outcome.exit_code, outcome.run_id, outcome.cells

Code that only needs somewhere to put cells (unit tests, a verifier that keeps
nothing) passes a plain :class:`CellSink`; :class:`BenchRunner` is a
:class:`CellSink` that also stores and shows them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any, Protocol, runtime_checkable

from kvmtune.errors import KvmtuneError
from kvmtune.host.root import HostRoot
from kvmtune.lab.accel import AccelChoice
from kvmtune.lab.guest import ProbeGuest
from kvmtune.lab.store import Store
from kvmtune.runner import Runner
from kvmtune.textsafe import safe

EXIT_OK, EXIT_CELLS_FAILED, EXIT_INTERRUPTED = 0, 1, 130
LOCK_ENV = "KVMTUNE_BENCH_LOCK"
DEFAULT_LOCK = "/run/lock/kvmtune-bench.lock"


def bench_lock_path() -> Path:
    """Host-wide: every user's and every database's benchmarks share it (``$KVMTUNE_BENCH_LOCK`` moves it)."""
    explicit = os.environ.get(LOCK_ENV)
    if explicit:
        return Path(explicit)
    if os.path.isdir(os.path.dirname(DEFAULT_LOCK)) and os.access(os.path.dirname(DEFAULT_LOCK), os.W_OK):
        return Path(DEFAULT_LOCK)
    return Path(f"/tmp/kvmtune-bench-{os.getuid()}.lock")


class BenchBusy(KvmtuneError):
    """Another benchmark holds the host."""


class HostBenchLock:
    """An flock on :func:`bench_lock_path` for the whole run; the kernel drops it when kvmtune dies.

    The file names the holder (run id, kind, database, pid) so a refused benchmark can say which run
    it waits for."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or bench_lock_path()
        self.fd: int | None = None

    def acquire(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise KvmtuneError(f"{self.path}: cannot open the benchmark lock ({exc.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = self._holder(fd)
            os.close(fd)
            raise BenchBusy(
                f"another benchmark is running on this host: {holder}; two at once disturb each other's "
                "numbers, so this one does not start (wait for it, or stop it)"
            ) from None
        self.fd = fd
        self.describe({"pid": os.getpid(), "run": None})

    @staticmethod
    def _holder(fd: int) -> str:
        with contextlib.suppress(OSError, ValueError):
            doc = json.loads(os.pread(fd, 4096, 0) or b"{}")
            if isinstance(doc, dict) and doc.get("pid"):
                run = f"run {doc['run']} ({doc.get('kind')}) in {doc.get('db')}" if doc.get("run") else "a run starting"
                return f"{run}, pid {doc['pid']}"
        return "a run (holder unknown)"

    def describe(self, info: dict[str, Any]) -> None:
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            data = json.dumps(info).encode()
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, data, 0)

    def release(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self.fd, 0)
            os.close(self.fd)
            self.fd = None


@dataclass
class Cell:
    """One measured (or failed) configuration × workload × repetition, as stored."""

    config_key: str
    config: dict[str, Any]
    workload: str
    status: str = "ok"  # ok | error | interrupted
    metrics: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    raw: str | None = None
    samples: list[tuple[float, str, float]] = field(default_factory=list)
    duration_s: float | None = None
    rep: int = 0  # repetition (storage) or pair index (network)
    attempts: int = 1  # 2: measured again after its first try failed (whose error is first_error)
    first_error: str | None = None

    @property
    def key(self) -> str:
        return f"{self.config_key}|{self.workload}"

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class CellSink:
    """Where a benchmark puts its cells: kept in memory, in order."""

    def __init__(self) -> None:
        self.results: list[Cell] = []
        self.failed = 0

    def record(self, cell: Cell, *, show: bool = True) -> None:
        """Keep ``cell``; ``show=False`` for a cell outside the planned count (no progress line)."""
        self.results.append(cell)
        self.failed += not cell.ok


@dataclass(kw_only=True)
class BenchContext:
    """What every tier's code needs while it runs; each tier extends it with its own fields."""

    runner: Runner
    host: HostRoot
    accel: AccelChoice
    memory_mb: int = 512
    smp: int = 1
    boot_timeout_s: float = 60.0
    sink: CellSink = field(default_factory=CellSink)

    @property
    def results(self) -> list[Cell]:
        return self.sink.results

    def record(self, cell: Cell, *, show: bool = True) -> None:
        self.sink.record(cell, show=show)


class Benchmark(Protocol):
    """What a tier provides; see the module docstring."""

    kind: str

    def plan(self) -> str: ...

    def planned_cells(self) -> int: ...

    def environment(self) -> dict[str, Any]: ...

    def execute(self, sink: CellSink) -> None: ...

    def describe(self, cell: Cell) -> str: ...

    def cleanup(self) -> list[str]: ...


@runtime_checkable
class EstimatesRemaining(Protocol):
    """A :class:`Benchmark` that knows how long its cells still to come will take (``None``: it does not know now)."""

    def remaining_seconds(self) -> float | None: ...


@dataclass(frozen=True)
class RunOutcome:
    run_id: int
    status: str  # complete | errors | partial (failed runs raise)
    took_s: float
    cells: list[Cell]
    failed: int
    cleanup_problems: list[str]

    @property
    def exit_code(self) -> int:
        if self.status == "partial":
            return EXIT_INTERRUPTED
        return EXIT_OK if self.failed == 0 else EXIT_CELLS_FAILED


class BenchRunner(CellSink):
    """Runs one :class:`Benchmark` as one stored run; see the module docstring."""

    def __init__(
        self,
        store: Store,
        *,
        args: Mapping[str, Any] | None = None,
        preset: str | None = None,
        note: str | None = None,
        accel: str | None = None,
        stream: IO[str] | None = None,
        workdir: Path | None = None,
        keep_leftovers: bool = False,
        runner: Runner | None = None,
        lock: HostBenchLock | None = None,
    ) -> None:
        super().__init__()
        self.workdir = workdir
        self.keep_leftovers = keep_leftovers
        self.runner = runner or Runner()
        self.lock = lock or HostBenchLock()
        self.store = store
        self.args = dict(args or {})
        self.preset = preset
        self.note = note
        self.accel = accel
        self.stream = stream or sys.stderr
        self.run_id: int | None = None
        self._bench: Benchmark | None = None
        self._planned = 0
        self._shown = 0
        self._measuring_since = 0.0

    def record(self, cell: Cell, *, show: bool = True) -> None:
        super().record(cell, show=show)
        assert self.run_id is not None, "record() outside run()"
        self.store.add_cell(
            self.run_id, cell.key, cell.config, cell.workload, cell.status, cell.metrics, rep=cell.rep,
            error=cell.error, accel=self.accel, started=time.time(), duration_s=cell.duration_s, raw=cell.raw,
            samples=cell.samples, attempts=cell.attempts, first_error=cell.first_error,
        )
        if show and self._bench is not None:
            self._progress(cell, self._bench)

    def run(self, bench: Benchmark) -> RunOutcome:
        """Run ``bench`` as one stored run. Returns for complete/errors/partial; re-raises anything else
        after closing the run as ``failed``."""
        self.lock.acquire()
        try:
            return self._run_locked(bench)
        finally:
            self.lock.release()

    def _sweep_leftovers(self) -> None:
        if self.workdir is None:
            return
        from kvmtune.lab.leftovers import sweep

        line = sweep(self.runner, HostRoot(), self.workdir, keep=self.keep_leftovers).line()
        if line:
            print(line, file=self.stream, flush=True)

    def _run_locked(self, bench: Benchmark) -> RunOutcome:
        self.store.check()  # a damaged database fails now, not after the first measured cell
        self._sweep_leftovers()
        _check_space(bench)
        env = bench.environment()
        if self.accel is None:
            self.accel = env.get("accel")
        self._bench, self._planned = bench, bench.planned_cells()
        self.run_id = self.store.begin_run(bench.kind, env, self.args, preset=self.preset)
        self._measuring_since = time.monotonic()
        self.lock.describe({"pid": os.getpid(), "run": self.run_id, "kind": bench.kind, "db": str(self.store.path)})
        print(f"kvmtune: run {self.run_id}: {bench.plan()}, results in {self.store.path}", file=self.stream, flush=True)
        restore = _sigterm_as_interrupt()
        started = time.monotonic()
        status, note = "failed", self.note
        problems: list[str] = []
        try:
            bench.execute(self)
            status = "complete" if self.failed == 0 else "errors"
        except KeyboardInterrupt:
            status, note = "partial", _join(self.note, "interrupted")
        except BaseException as exc:
            note = _join(self.note, f"{type(exc).__name__}: {exc}".splitlines()[0][:300])
            raise
        finally:
            restore()
            try:
                problems = bench.cleanup()
            except Exception as exc:  # the run row is closed even when cleanup breaks
                problems = [f"cleanup failed: {exc}"]
            if status == "partial":
                self.store.add_cell(self.run_id, "interrupted", {}, "interrupted", "interrupted",
                                    error="stopped by the user", accel=self.accel)
            self.store.finish_run(self.run_id, status, note=note)
            self._bench = None
        took = time.monotonic() - started
        if status == "partial":
            print(
                f"\nkvmtune: interrupted: run {self.run_id} marked partial ({len(self.results)} cells stored); "
                f"cleaned up{'; problems: ' + '; '.join(problems) if problems else ''}",
                file=self.stream, flush=True,
            )
        return RunOutcome(self.run_id, status, took, list(self.results), self.failed, problems)

    def _progress(self, cell: Cell, bench: Benchmark) -> None:
        self._shown += 1
        done = self._shown
        total = max(self._planned, done)
        tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        width = 24
        filled = int(width * done / max(1, total))
        what = bench.describe(cell) if cell.ok else f"ERROR: {cell.error}"
        if cell.attempts > 1:
            what += (f" (retried: the first try failed: {cell.first_error})" if cell.ok
                     else f" (retried: the first try failed too: {cell.first_error})")
        left = bench.remaining_seconds() if isinstance(bench, EstimatesRemaining) else None
        line = f"[{'#' * filled}{'-' * (width - filled)}] {done}/{total}{_eta(self._measuring_since, done, total, left)} " \
               f"{safe(cell.config_key)} {safe(cell.workload)}: {safe(what)}"  # verify's keys name domains
        self.stream.write(("\r\033[K" if tty else "") + line + ("" if tty and done < total and cell.ok else "\n"))
        self.stream.flush()


def _eta(since: float, done: int, total: int, left: float | None = None) -> str:
    """' ETA 4m05s': the benchmark's own estimate of what is ``left`` when it gives one, else the pace so far;
    nothing before the first cell or after the last."""
    if done >= total or (left is None and (since <= 0 or done <= 0)):
        return ""
    if left is None:
        left = (time.monotonic() - since) / done * (total - done)
    left = max(0.0, left)
    return f" ETA {int(left // 60)}m{int(left % 60):02d}s"


def _check_space(bench: Benchmark) -> None:
    """Refuse, before the run row and before anything is written, when the file system the benchmark
    writes to cannot hold even its smallest cell (a tier says so with ``space_needed()``)."""
    needed = getattr(bench, "space_needed", None)
    if not callable(needed):
        return
    need = needed()
    if need is None:
        return
    where, size, what = need
    probe = where
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    try:
        st = os.statvfs(probe)
    except OSError:
        return
    free = st.f_bavail * st.f_frsize
    if free < size:
        raise KvmtuneError(
            f"{where}: not enough space: {what} needs {size // 2**20} MiB, {free // 2**20} MiB free; nothing measured"
        )


def _join(*parts: str | None) -> str:
    """The user's note, then what happened to the run."""
    return "; ".join(p for p in parts if p)


def _sigterm(_signo: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _sigterm_as_interrupt() -> Any:
    """SIGTERM raises KeyboardInterrupt until the returned function is called (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    old = signal.signal(signal.SIGTERM, _sigterm)
    return lambda: signal.signal(signal.SIGTERM, old)


def base_environment(runner: Runner, host: HostRoot, accel: AccelChoice, guest: ProbeGuest | None) -> dict[str, Any]:
    """What every tier's result depends on besides its configuration; tiers add their own tools' versions."""
    from kvmtune import __version__
    from kvmtune.errors import KvmtuneError
    from kvmtune.host.facts import HostFacts
    from kvmtune.lab.qemu import qemu_version

    try:
        qemu: str | None = qemu_version(runner)
    except KvmtuneError:
        qemu = None  # the quick tier needs only qemu-img
    facts = HostFacts(host)
    return {
        "kvmtune": __version__,
        "accel": accel.accel,
        "accel_reason": accel.reason,
        "host_kernel": facts.kernel_release or "",
        "qemu": qemu,
        "cpu_model": facts.cpu_model or "",
        "ncpu": os.cpu_count(),
        "guest_kernel": guest.release if guest else None,
        "guest_key": guest.key if guest else None,
    }
