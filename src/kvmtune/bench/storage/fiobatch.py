"""Several fio jobs in one fio process, one after the other on a schedule, each timed to the nanosecond.

Why: a fio process costs about a quarter of a second before its first request on this kind of host (64
shared libraries, a CPU-clock calibration it runs whatever ``--clocksource`` says, and a fixed 100 ms wait
for its job threads), and the block tier used to pay it once per cell. In one process the jobs of a whole
round pay it once.

How the jobs follow each other: ``--stonewall`` would serialise them, but fio 3.33 then leaves about 300 ms
between two jobs. Instead every job gets a ``--startdelay`` from fio's start: the previous jobs' lengths plus
:data:`JOB_GAP_S`. Every job waits for the same fixed thread start-up, so the gap survives; with a shorter
gap, fio's 100 ms start-up polling made the next job start early or late by about 100 ms (measured here).

How we know they did not overlap: each job runs ``date +%s.%N`` just before its first request
(``--exec_prerun``) and just after its last (``--exec_postrun``, after its files are closed); fio writes each
command's output to ``<job>.prerun.txt`` / ``<job>.postrun.txt`` in its working directory. :func:`overlap_s`
says how long a job ran beside the end of the one before it. A job's start can come up to fio's 100 ms
polling later than planned, and a slow job ends its last requests and closes its files well after its
runtime (tens of ms for queue depth 16 at 1,000 writes/s with write-through), so the next job's first
moments may see the previous one's last requests. The next job spends those moments in its unmeasured
ramp, which is what a ramp is for; only an overlap that reaches into its measured time makes its figures
not its own (the block tier then stores the cell as an error).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

JOB_GAP_S = 0.1
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


def batch_argv(jobs: list[BatchJob], gap: float = JOB_GAP_S) -> list[str]:
    """fio's job options for ``jobs``, in order, each starting ``gap`` after the previous one's planned end."""
    argv: list[str] = []
    delay = 0.0
    for job in jobs:
        argv += [f"--name={job.name}", *job.options, f"--startdelay={round(delay * 1000)}ms", "--new_group",
                 f"--exec_prerun={STAMP}", f"--exec_postrun={STAMP}"]
        delay += job.seconds + gap
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
