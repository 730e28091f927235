"""Before a benchmark (or an image fix, see test_journal_races) writes, it checks free space and refuses
with one line; on a small tmpfs nothing is left half-written."""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from kvmtune.bench.storage.guest import MatrixBenchmark, StorageContext
from kvmtune.bench.storage.matrix import StorageConfig
from kvmtune.errors import KvmtuneError
from kvmtune.host.root import HostRoot
from kvmtune.lab.accel import AccelChoice
from kvmtune.lab.runner import BenchRunner
from kvmtune.lab.storage import fio as fiomod
from kvmtune.lab.store import Store
from kvmtune.lab.workdir import Scratch
from kvmtune.runner import Runner


def test_a_storage_run_that_cannot_fit_its_disk_is_refused_before_it_starts(
    tmp_path: Path, small_tmpfs: Callable[[str], Path]
) -> None:
    small = small_tmpfs("40m")
    runner = Runner()
    scratch = Scratch(small / "scratch-1", runner)
    ctx = StorageContext(runner=runner, host=HostRoot(), accel=AccelChoice("tcg", "test", 0.0), scratch=scratch,
                         disk_mib=256)
    bench = MatrixBenchmark(ctx, [StorageConfig()], list(fiomod.lookup(["randread-4k"])))
    with Store(tmp_path / "r.db") as st:
        with pytest.raises(KvmtuneError) as err:
            BenchRunner(st, stream=io.StringIO()).run(bench)
        assert st.runs() == []  # no run row, nothing measured
    msg = str(err.value)
    assert "\n" not in msg and "needs 320 MiB" in msg and "nothing measured" in msg and str(small) in msg
    scratch.remove_if_empty()
    assert list(small.iterdir()) == []


def test_quick_bench_on_a_full_work_directory_is_one_line(tmp_path: Path, small_tmpfs: Callable[[str], Path]) -> None:
    small = small_tmpfs("32m")
    res = subprocess.run(
        [sys.executable, "-m", "kvmtune", "bench", "storage", "--quick", "--image-format", "raw", "--prealloc", "off",
         "--cache", "none", "--aio", "threads", "--disk-size", "16", "--workdir", str(small),
         "--db", str(tmp_path / "r.db")],
        capture_output=True, text=True, check=False,
    )
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.count("\n") == 1 and "not enough space" in res.stderr and "Traceback" not in res.stderr
    assert list(small.iterdir()) == []  # no scratch directory, no image, nothing half-written
