"""``bench storage --replay FILE``: the options it takes and refuses, before anything runs (tests/lab/test_replay.py
holds the workload file's hostile cases; tests/capture/test_replay_integration.py runs one)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvmtune.cli import main

DISK = {"target": "vda", "source": "blockstats", "seconds": 3.0, "ops": {"read": 70, "write": 30, "flush": 3, "discard": 0},
        "read_fraction": 0.7, "iops": 100.0, "size_bytes": {"p50": None, "mean": 16384, "histogram": None},
        "sequential_fraction": None, "queue_depth": {"mean": 2.0, "p95": 4}, "flush_per_write": 0.1,
        "offset_span_bytes": None, "offset_base": None, "inter_arrival_us": {"p50": None, "p90": None, "p99": None},
        "latency_us": {"p50": None, "p99": None}}


def workload(tmp: Path) -> Path:
    path = tmp / "w.json"
    path.write_text(json.dumps({"schema": "kvmtune-workload/1", "guest": "g", "captured_at": "x", "disks": [DISK]}))
    return path


@pytest.mark.parametrize("extra, words", [
    (["--workload", "randread-4k"], "--replay: replaces the generic workloads"),
    (["--preset", "seed-003"], "--replay: replaces the generic workloads"),
    (["--ramp", "1"], "--ramp: a replay has no unmeasured ramp"),
    (["--replay-disk", "vdb"], "--replay-disk: 'vdb' is not a disk of the workload"),
    (["--tier", "guest"], "--replay: does not apply to the guest tier"),
])
def test_replay_refuses_what_it_cannot_combine_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              extra: list[str], words: str) -> None:
    args = ["bench", "storage", "--replay", str(workload(tmp_path)), "--db", str(tmp_path / "db"), *extra]
    if "--tier" not in extra:
        args += ["--tier", "block"]
    assert main(args) != 0
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "db").exists()


def test_replay_mode_needs_a_replay_and_a_bad_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "storage", "--tier", "block", "--replay-mode", "fast", "--db", str(tmp_path / "db")]) != 0
    assert "--replay-mode: needs --replay FILE" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "kvmtune-workload/1", "schema": "x"}')
    assert main(["bench", "storage", "--tier", "block", "--replay", str(bad), "--db", str(tmp_path / "db")]) != 0
    err = capsys.readouterr().err
    assert str(bad) in err and "duplicate key" in err and len(err.strip().splitlines()) == 1


def test_verify_replay_options_go_together_and_a_bad_file_is_one_line(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    xml = Path(__file__).resolve().parents[1] / "rules" / "KVM-STO-002" / "bad" / "writethrough.xml"
    assert main(["verify", str(xml), "--replay-disk", "vda", "--no-store"]) == 2
    assert "--replay FILE" in capsys.readouterr().err
    bad = tmp_path / "w.json"
    bad.write_text('{"schema": NaN}')
    assert main(["verify", str(xml), "--replay", str(bad), "--no-store", "--workdir", str(tmp_path / "wd")]) != 0
    err = capsys.readouterr().err
    assert str(bad) in err and len(err.strip().splitlines()) == 1
