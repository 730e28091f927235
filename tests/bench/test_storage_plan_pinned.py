"""``bench storage``'s plan for a few argument lists, pinned: tier, configurations, workloads, cell count and the
run metadata stored with the run.

Nothing is measured: the benchmark runner is replaced by one that keeps what it was handed. The expected plans in
``golden/storage_plans.json`` were written by the code before the storage matrix moved out of the CLI (issue 44);
a change in them is a change in what ``bench storage`` runs. Regenerate only on purpose:
``KVMTUNE_REGEN_PLANS=1 pytest tests/bench/test_storage_plan_pinned.py``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

import kvmtune.cli as cli
import kvmtune.cli.bench as clibench
from kvmtune.lab.accel import AccelChoice
from kvmtune.lab.runner import RunOutcome

GOLDEN = Path(__file__).parent / "golden" / "storage_plans.json"

CASES: dict[str, list[str]] = {
    "quick-default": ["--quick"],
    "quick-dims": ["--quick", "--cache", "none,writeback", "--aio", "threads,native", "--image-format", "qcow2",
                   "--prealloc", "off,full", "--runtime", "2"],
    "block-default": ["--tier", "block"],
    "block-dims": ["--tier", "block", "--cache", "none,writethrough", "--aio", "native,io_uring", "--image-format",
                   "raw,qcow2", "--target", "file,block", "--workload", "randread-4k,seqwrite-1m", "--repeat", "2",
                   "--ramp", "0.5"],
    "block-preset": ["--tier", "block", "--preset", "seed-001", "--workload", "rand*"],
    "block-preset-003": ["--tier", "block", "--preset", "seed-003", "--keep-leftovers"],
    "guest-default": ["--tier", "guest"],
    "guest-dims": ["--tier", "guest", "--bus", "virtio-blk,virtio-scsi", "--cache", "none,writeback", "--sched",
                   "none,mq-deadline", "--workload", "randread-4k", "--memory", "768", "--smp", "2", "--no-snapshot"],
    "guest-preset-ffsb": ["--tier", "guest", "--preset", "ffsb", "--threads", "1,4", "--cache", "none"],
    "guest-preset-legacy-format": ["--tier", "guest", "--preset", "seed-003", "--format", "qcow2", "--note", "n1"],
    "guest-preset-file-vs-block": ["--tier", "guest", "--preset", "file-vs-block", "--workload", "randread-4k"],
    "auto-to-block": ["--host-fs", "workdir", "--cache", "none"],
}


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, Path):
        return "<path>"
    return value


def plan_of(argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What ``bench storage ARGV`` hands the benchmark runner (no guest built, no KVM probed, nothing measured)."""
    seen: dict[str, Any] = {}

    class KeepingRunner:
        def __init__(self, store: Any, **kwargs: Any) -> None:
            seen["runner"] = kwargs

        def run(self, bench: Any) -> RunOutcome:
            seen["bench"] = bench
            return RunOutcome(run_id=1, status="complete", took_s=0.0, cells=[], failed=0, cleanup_problems=[])

    monkeypatch.setattr(clibench, "BenchRunner", KeepingRunner)
    monkeypatch.setattr(clibench, "build_guest", lambda args, runner, more=(): "probe-guest")
    monkeypatch.setattr(clibench, "choose_accel", lambda want, guest, workdir, runner, host:
                        AccelChoice("tcg", f"asked {want}", 0.0))
    monkeypatch.setattr(clibench, "check_host_fs", lambda runner, host, names: None)
    # auto: this host has no usable /dev/kvm, so auto means the block tier
    monkeypatch.setattr(clibench.HostRoot, "exists", lambda self, path: False)
    rc = cli.main(["bench", "storage", "--workdir", str(tmp_path / "work"), "--db", str(tmp_path / "r.db"), *argv])
    assert rc == 0, argv
    bench, kwargs = seen["bench"], seen["runner"]
    ctx = bench.ctx
    out: dict[str, Any] = {
        "benchmark": type(bench).__name__,
        "planned_cells": bench.planned_cells(),
        "plan": bench.plan(),
        "ctx": {k: _plain(getattr(ctx, k)) for k in ("memory_mb", "smp", "boot_timeout_s", "runtime_s", "disk_mib",
                                                     "repeat", "user_device")},
        "accel": _plain(ctx.accel),
        "guest": ctx.guest,
        "snapshots": ctx.snapshots is not None,
        "recorded": _plain({k: v for k, v in kwargs["args"].items()}),
        "preset": kwargs["preset"],
        "note": kwargs["note"],
        "keep_leftovers": kwargs["keep_leftovers"],
    }
    if type(bench).__name__ == "MatrixBenchmark":
        out["configs"] = [c.key for c in bench.configs]
        out["config_fields"] = _plain(list(bench.configs))
        out["workloads"] = _plain(list(bench.workloads))
    elif type(bench).__name__ == "BlockBenchmark":
        out["configs"] = [c.key for c in bench.blocks.configs]
        out["block_plan"] = _plain(bench.blocks)
    else:
        out["configs"] = [c.key for c in bench.quick.configs]
        out["quick_plan"] = _plain(bench.quick)
    return out


@pytest.fixture(autouse=True)
def private_dirs(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))


def test_golden_covers_every_case() -> None:
    assert sorted(json.loads(GOLDEN.read_text())) == sorted(CASES)


@pytest.mark.parametrize("case", sorted(CASES))
def test_storage_plan_is_pinned(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    got = json.loads(json.dumps(plan_of(CASES[case], tmp_path, monkeypatch)).replace(str(tmp_path), "<tmp>"))
    if os.environ.get("KVMTUNE_REGEN_PLANS") == "1":
        golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
        golden[case] = got
        GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
        pytest.skip("regenerated")
    assert got == json.loads(GOLDEN.read_text())[case]
