"""Welch intervals, direction of 'better', and the seed verdict lines."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from kvmtune import cli
from kvmtune.bench.verdicts import verdicts
from kvmtune.lab.metrics import lower_is_better
from kvmtune.lab.stats import compare_cells, ratio_diff, t95, welch_diff
from kvmtune.lab.store import CellRow, Store


def test_welch_interval_matches_a_hand_computation() -> None:
    d = welch_diff([100.0, 102.0, 98.0], [110.0, 112.0, 108.0], "iops")
    # means 100 / 110, sd 2 each, se = sqrt(4/3 + 4/3) = 1.633, df = 4, t = 2.776
    assert d.diff_pct == pytest.approx(10.0)
    assert d.ci_pct is not None
    assert d.ci_pct[0] == pytest.approx(10.0 - 100 * 2.776 * 1.63299 / 100, abs=0.01)
    assert d.better == "B"


def test_latency_lower_is_better_and_noise_is_no_difference() -> None:
    assert lower_is_better("clat_p99_us") and lower_is_better("qemu_cpu_pct") and not lower_is_better("iops")
    assert welch_diff([100.0, 101.0, 99.0], [120.0, 121.0, 119.0], "clat_p99_us").better == "A"
    assert welch_diff([100.0, 150.0, 50.0], [110.0, 160.0, 60.0], "iops").better == "same"
    one = welch_diff([100.0], [200.0], "iops")
    assert one.ci_pct is None and one.better == "unknown" and "use --repeat" in one.describe()
    assert t95(1) == 12.706 and 1.96 < t95(200) < 2.0


def _cell(i: int, key: str, wl: str, metrics: dict[str, float], **cfg: str) -> CellRow:
    return CellRow(i, 1, f"{key}|{wl}", cfg, wl, 0, "ok", None, "tcg", 1.0, metrics)


def test_compare_cells_matches_keys() -> None:
    a = [_cell(1, "x", "w", {"iops": 10.0}), _cell(2, "y", "w", {"iops": 5.0})]
    b = [_cell(3, "x", "w", {"iops": 20.0})]
    (d,) = compare_cells(a, b, ["iops"])
    assert d.key == "x|w" and d.diff_pct == pytest.approx(100.0)


def test_compare_intervals_stay_within_minus_100_percent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Noisy IOPS (10 to 1,000 a round): a linear Welch interval reached −123 %; the log-ratio one cannot."""
    db = tmp_path / "r.db"
    with Store(db) as st:
        for values in ((10.0, 1000.0, 100.0), (12.0, 900.0, 110.0)):
            rid = st.begin_run("storage", {"accel": "kvm"}, {})
            for rep, v in enumerate(values):
                st.add_cell(rid, "virtio-blk/raw-off/none/native|randwrite-4k", {}, "randwrite-4k", "ok",
                            {"iops": v, "clat_p99_us": 1e6 / v}, rep=rep, accel="kvm")
            st.finish_run(rid, "complete")
    assert cli.main(["compare", "1", "2", "--db", str(db), "--format", "json"]) == 0
    diffs = json.loads(capsys.readouterr().out)["diffs"]
    assert len(diffs) == 2
    for d in diffs:
        low, high = d["ci95_pct"]
        assert -100 < low < d["diff_pct"] < high, d
        assert d["better"] == "inconclusive", d  # the interval crosses ±5 %: neither better nor "the same"
    assert cli.main(["compare", "1", "2", "--db", str(db)]) == 0
    text = capsys.readouterr().out
    assert "inconclusive (the interval crosses ±5 %)" in text and "no significant difference" not in text
    for m in re.finditer(r"95% CI ([+-][\d.]+)%", text):
        assert float(m.group(1)) > -100


def test_no_measurable_effect_needs_the_whole_interval_inside_the_band() -> None:
    same = ratio_diff([100.0, 101.0, 99.0], [100.5, 101.5, 99.5], "iops")
    assert same.better == "same" and same.ci_pct is not None and same.ci_pct[0] > -5 and same.ci_pct[1] < 5
    wide = ratio_diff([100.0, 150.0, 50.0], [110.0, 160.0, 60.0], "iops")
    assert wide.better == "inconclusive"


def test_verdicts_compute_seed_ratios() -> None:
    cells = [
        _cell(1, "a", "fs-randwrite-4k", {"iops": 100.0}, bus="ide", fmt="qcow2", prealloc="off", cache="writethrough"),
        _cell(2, "b", "fs-randwrite-4k", {"iops": 500.0}, bus="ide", fmt="qcow2", prealloc="metadata", cache="writethrough"),
        _cell(3, "c", "ffsb-randwrite-t8-direct", {"bw_Bps": 85.8e6}, bus="virtio-blk"),
        _cell(4, "d", "ffsb-randwrite-t8-direct", {"bw_Bps": 19.0e6}, bus="ide"),
        _cell(5, "e", "randread-4k", {"iops": 1000.0}, target="host"),
        _cell(6, "f", "randread-4k", {"iops": 700.0}, target="file"),
        _cell(7, "g", "randread-4k", {"iops": 900.0}, target="block"),
        _cell(8, "h", "cycle-8m", {"host_tps_per_vm": 5.0}, bus="virtio-blk"),
        _cell(9, "host/capacity", "disk-capacity", {"capacity_host_tps": 100.0}, target="host"),
    ]
    lines = [v.line() for v in verdicts(cells)]
    assert any("5.00× slower (fs-randwrite-4k, bus ide: 100 vs 500 IOPS) than with metadata" in ln for ln in lines)
    assert any("virtio-blk delivers 4.52× the throughput of IDE" in ln for ln in lines)
    assert any("image file 70%, block device (loop) 90% of bare-metal" in ln for ln in lines)
    assert any("costs 5.0 transactions/s" in ln and "carries about 20 such VMs" in ln for ln in lines)
    assert any("not measured in these runs (run --preset ffsb --sched mq-deadline,bfq)" in ln for ln in lines)
    assert all("\n" not in ln for ln in lines)
