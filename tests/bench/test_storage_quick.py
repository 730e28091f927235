"""``bench storage --quick`` with the real qemu-img (no guest)."""

from __future__ import annotations

from pathlib import Path

import pytest

import kvmtune.cli as cli
from kvmtune.bench.storage.quick import default_quick_configs, parse_bench_output
from kvmtune.lab.store import Store


def test_default_quick_matrix_is_24_valid_cells() -> None:
    cfgs = default_quick_configs()
    assert len(cfgs) == 24 and len({c.key for c in cfgs}) == 24
    assert all(c.problem() is None for c in cfgs)


def test_parse_bench_output() -> None:
    assert parse_bench_output("Sending 100 requests...\nRun completed in 0.250 seconds.\n") == 0.25
    with pytest.raises(ValueError, match="Run completed"):
        parse_bench_output("qemu-img: error")


def test_quick_runs_valid_cells_and_reports_impossible_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db, wd = tmp_path / "r.db", tmp_path / "work"
    code = cli.main(["bench", "storage", "--quick", "--image-format", "qcow2", "--prealloc", "off,metadata",
                     "--cache", "none,writeback", "--aio", "native", "--disk-size", "64", "--db", str(db),
                     "--workdir", str(wd)])
    assert code == 1  # the writeback+native cells cannot run
    out = capsys.readouterr().out
    assert out.count("FAILED") == 4 and "aio=native needs O_DIRECT" in out
    with Store(db) as st:
        (run,) = st.runs()
        assert run.kind == "quick" and run.accel == "none" and run.status == "errors"
        ok = [c for c in st.cells(run.id) if c.status == "ok"]
        assert len({(c.key, c.workload) for c in ok}) == 4 and len(ok) >= 4  # passes are cells of their own
        assert all(c.metrics["iops"] > 0 and c.metrics["bw_Bps"] == pytest.approx(c.metrics["iops"] * 4096) for c in ok)
    assert list(wd.iterdir()) == [] or all(not p.name.startswith("scratch-") for p in wd.iterdir())


def test_full_scratch_disk_is_one_line_and_the_rest_goes_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db, wd = tmp_path / "r.db", tmp_path / "work"
    code = cli.main(["bench", "storage", "--quick", "--image-format", "raw", "--prealloc", "off,falloc", "--cache", "none",
                     "--aio", "threads", "--disk-size", str(1 << 30), "--db", str(db), "--workdir", str(wd)])
    assert code == 1
    out = capsys.readouterr().out
    assert "scratch disk full" in out
    with Store(db) as st:
        cells = st.cells(st.runs()[0].id)
        full = [c for c in cells if c.config["prealloc"] == "falloc"]
        assert full and all(c.status == "error" and "scratch disk full" in (c.error or "") for c in full)
    assert not any(p.name.startswith("scratch-") for p in wd.iterdir())


def test_quick_cells_repeat_until_their_interval_is_tight_or_the_cap(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 18 item 5: one 0.3 s pass is noise; passes repeat (fresh image each) until ±5 % or the time cap."""
    from kvmtune.bench.storage.quick import tight
    from kvmtune.bench.verdicts import verdicts

    assert not tight([100.0, 100.0]) and tight([100.0, 101.0, 99.0]) and not tight([100.0, 150.0, 60.0])
    db, wd = tmp_path / "r.db", tmp_path / "work"
    code = cli.main(["bench", "storage", "--quick", "--image-format", "qcow2", "--prealloc", "off,metadata",
                     "--cache", "writethrough", "--aio", "threads", "--disk-size", "64", "--runtime", "3",
                     "--db", str(db), "--workdir", str(wd)])
    assert code == 0
    with Store(db) as st:
        cells = st.cells(st.runs()[0].id)
    by_cell: dict[tuple[str, str], list[float]] = {}
    for c in cells:
        by_cell.setdefault((c.key, c.workload), []).append(c.metrics["iops"])
    assert len(by_cell) == 4
    for values in by_cell.values():
        assert len(values) >= 2  # never a single 0.3 s pass when the cap allows more
    (line,) = [v.line("quick") for v in verdicts(cells) if "write-through" in v.claim]
    assert "quick tier" in line and ("95% interval" in line or "inconclusive" in line)


def test_the_old_format_flag_is_the_image_format_for_one_release_with_a_warning(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 30: `bench storage --format raw|qcow2` is now --image-format; the old spelling still works, once
    more, with one warning line, and the run stores the settings it really used (tier, defaults) with its own."""
    db, wd = tmp_path / "r.db", tmp_path / "work"
    # writeback with aio=native cannot run: every cell fails at once, no qemu-img bench pass is spent
    code = cli.main(["bench", "storage", "--quick", "--format", "raw", "--prealloc", "off", "--cache", "writeback",
                     "--aio", "native", "--disk-size", "64", "--db", str(db), "--workdir", str(wd)])
    assert code == 1
    captured = capsys.readouterr()
    (warning,) = [line for line in captured.err.splitlines() if "--format" in line]
    assert warning.startswith("kvmtune: warning:") and "--image-format" in warning
    assert "FAILED" in captured.out
    with Store(db) as st:
        (run,) = st.runs()
        cells = st.cells(run.id)
        assert cells and {c.config["fmt"] for c in cells} == {"raw"}  # the quick tier's default is raw and qcow2
        assert run.args["legacy_format"] == ["raw"] and run.args["image_format"] is None
        assert (run.args["tier"], run.args["repeat"], run.args["runtime"], run.args["disk_size"]) == ("quick", 1, 5.0, 64)
        assert "command_object" not in run.args
    assert cli.main(["bench", "storage", "--quick", "--image-format", "raw", "--prealloc", "off", "--cache", "writeback",
                     "--aio", "native", "--disk-size", "64", "--db", str(db), "--workdir", str(wd)]) == 1
    assert "--format" not in capsys.readouterr().err


def test_an_unknown_image_format_names_the_new_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["bench", "storage", "--quick", "--image-format", "vmdk", "--db", str(tmp_path / "r.db"),
                     "--workdir", str(tmp_path / "work")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("kvmtune: --image-format: unknown image-format 'vmdk'"), err
