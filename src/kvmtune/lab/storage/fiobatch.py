"""Several fio jobs in one fio process, each starting once the previous one has ended, each timed to the
nanosecond.

Why: a fio process costs about a quarter of a second before its first request on this kind of host (64
shared libraries, a CPU-clock calibration it runs whatever ``--clocksource`` says, and a fixed 100 ms wait
for its job threads), and the block tier used to pay it once per cell. In one process the jobs of a whole
round pay it once.

How the jobs follow each other: every job after the first is a ``--stonewall``: fio starts it only once
every job before it has exited, i.e. has completed its last requests, closed its files and run its
``exec_postrun``. A job never starts inside the one before it, however long that one takes to drain (issue
50: a cell's last 16 requests took up to 1.2 s beyond its runtime to complete, where the schedule used
before left 0.1 s). The price is fio's own hand-over: it notices the exit, starts the next job's
thread and waits for it, about 0.3 s between two jobs in fio 3.33 on this 2-core host (0.1 s with the
``--startdelay`` schedule used before, measured side by side: :data:`JOB_GAP_S`).

How we know they did not overlap: each job runs ``date +%s.%N`` just before its first request
(``--exec_prerun``) and just after its last (``--exec_postrun``, after its files are closed); fio writes each
command's output to ``<job>.prerun.txt`` / ``<job>.postrun.txt`` in its working directory. :func:`overlap_s`
says how long a job ran beside the end of the one before it: with the stonewall, never. The block tier still
checks it, and stores a cell that overlapped as an error: that would be a defect here, not noise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

JOB_GAP_S = 0.3  # fio 3.33's hand-over from one stonewalled job to the next (an estimate: timeouts, ETA)
STAMP = "date +%s.%N"
_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


@dataclass(frozen=True)
class BatchJob:
    name: str  # unique in the batch; also a file name (fio writes <name>.prerun.txt)
    options: tuple[str, ...]  # the job's own fio options, without --name
    seconds: float  # how long it runs: its ramp_time plus its runtime

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"fio batch job name {self.name!r} is not a plain file name")


@dataclass(frozen=True)
class JobTimes:
    start: float  # wall clock (s since the epoch) just before the job's first request
    end: float  # just after its last request completed and its files were closed


def batch_argv(jobs: list[BatchJob]) -> list[str]:
    """fio's job options for ``jobs``, in order, each starting only once the previous one has ended."""
    argv: list[str] = []
    for k, job in enumerate(jobs):
        argv += [f"--name={job.name}", *job.options, *(["--stonewall"] if k else []), "--new_group",
                 f"--exec_prerun={STAMP}", f"--exec_postrun={STAMP}"]
    return argv


def planned_seconds(jobs: list[BatchJob], gap: float = JOB_GAP_S) -> float:
    return sum(j.seconds for j in jobs) + gap * max(0, len(jobs) - 1)


def _stamp(path: Path) -> float | None:
    try:
        text = path.read_text(errors="replace").strip()
        return float(text) if re.fullmatch(r"\d+\.\d+", text) else None
    except OSError:
        return None


def read_times(directory: Path, names: list[str]) -> dict[str, JobTimes]:
    """The start and end of every job whose two stamps fio wrote; a job that never ran is absent."""
    out: dict[str, JobTimes] = {}
    for name in names:
        start, end = _stamp(directory / f"{name}.prerun.txt"), _stamp(directory / f"{name}.postrun.txt")
        if start is not None and end is not None and end >= start:
            out[name] = JobTimes(start, end)
    return out


def overlap_s(times: dict[str, JobTimes], names: list[str], name: str) -> float:
    """How long job ``name`` ran while a job before it in ``names`` had not ended yet (0: not at all)."""
    mine = times[name]
    before = [times[n].end for n in names[: names.index(name)] if n in times]
    return max(0.0, max(before, default=mine.start) - mine.start)
