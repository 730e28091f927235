"""Carrying out a plan: journal first, then one atomic change at a time.

1. Every change takes a snapshot of what is there now and checks it is still what
   the plan was made from (otherwise nothing is written).
2. The journal with all snapshots is written (fsync, rename) before the first change.
3. Each change is made atomically, then marked done in the journal.

A failure stops at the failing change: the changes before it stay made, the journal
says which, and ``kvmtune undo ID`` restores them. A crash leaves the journal too;
undo treats a change not marked done as possibly made.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from pathlib import Path

from kvmtune.errors import KvmtuneError
from kvmtune.fix.files import TargetBusy, lock_targets
from kvmtune.fix.journal import Journal, refusals
from kvmtune.fix.plan import ApplyContext, Plan
from kvmtune.runner import Runner, default_runner

# test hook: SIGKILL this process right after the Nth change is made (before the journal records it)
KILL_ENV = "KVMTUNE_TEST_KILL_AFTER_CHANGE"


class ApplyFailed(KvmtuneError):
    """A change failed part-way through a plan; ``journal`` says what was done."""

    def __init__(self, journal: Journal, message: str) -> None:
        self.journal = journal
        super().__init__(message)


def apply_plan(
    plan: Plan,
    directory: Path,
    *,
    argv: Sequence[str] = (),
    root: str = "/",
    runner: Runner | None = None,
    purge_backups: bool = False,
) -> Journal:
    journal = Journal.create(directory, list(argv), os.path.realpath(root))
    ctx = ApplyContext(journal=journal, runner=runner or default_runner(), purge_backups=purge_backups)
    held: list[int] = []
    try:
        try:
            held = lock_targets([p for change in plan.changes for p in change.lock_paths()])
        except TargetBusy as exc:
            raise KvmtuneError(f"{exc}; nothing changed") from None
        except OSError as exc:
            raise KvmtuneError(f"{exc.filename}: cannot lock it ({exc.strerror or exc}); nothing changed") from None
        journal.entries = [change.snapshot(ctx) for change in plan.changes]
        for change, entry in zip(plan.changes, journal.entries, strict=True):
            entry.takes_effect = change.takes_effect()
            entry.planned = list(change.planned)
        problems = refusals(journal)  # what undo would refuse is not done: every path inside the root
        if problems:
            raise KvmtuneError(f"refused: {'; '.join(problems)}; nothing changed")
        journal.log(f"created with {len(journal.entries)} change(s)")
        try:
            journal.save()
        except OSError as exc:
            raise KvmtuneError(f"cannot write the journal {journal.path}: {exc.strerror or exc}; nothing changed") from None
        kill_after = int(os.environ.get(KILL_ENV, "0") or 0)
        for n, (change, entry) in enumerate(zip(plan.changes, journal.entries, strict=True), 1):
            try:
                change.apply(entry, ctx)
            except KvmtuneError as exc:
                entry.status = "failed"
                entry.error = str(exc)
                journal.state = "failed"
                journal.error = f"change {n} of {len(plan.changes)}: {exc}"
                journal.log(f"change {n} failed: {exc}")
                _save_quietly(journal)
                raise ApplyFailed(journal, str(exc)) from None
            if kill_after == n:
                os.kill(os.getpid(), signal.SIGKILL)
            entry.status = "done"
            journal.log(f"change {n} done: {entry.what}")
            try:
                journal.save()
            except OSError as exc:
                raise ApplyFailed(
                    journal, f"change {n} was made but the journal could not record it ({exc.strerror or exc})"
                ) from None
        journal.state = "applied"
        journal.log("applied")
        journal.save()
    finally:
        ctx.close()
        for fd in held:
            os.close(fd)
    return journal


def _save_quietly(journal: Journal) -> None:
    try:
        journal.save()
    except OSError:
        pass
