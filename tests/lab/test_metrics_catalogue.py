"""The metrics catalogue (issue 11 §5) and what reads it: compare, charts, results show (issue 18 items 5, 6, 12)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import kvmtune.cli as cli
from kvmtune.lab.metrics import CATALOGUE, Better, lookup, lower_is_better, metric, names
from kvmtune.lab.net.netload import netload_metrics
from kvmtune.lab.stats import welch_diff
from kvmtune.lab.storage import fio as fiomod
from kvmtune.lab.store import Store


def test_directions_are_declared_not_guessed_from_names() -> None:
    # the old name heuristic got these two wrong: a disk's capacity is better higher, errors better lower
    assert metric("capacity_host_tps").better is Better.HIGHER
    assert metric("errors").better is Better.LOWER
    assert metric("host_tps").better is Better.LOWER and metric("iops").better is Better.HIGHER
    assert lower_is_better("clat_p99_9_write_us") and lower_is_better("qemu_server_cpu_s_per_mb")
    assert metric("fio_runtime_s").better is Better.NEITHER
    assert lookup("latency") is None and lookup("clat_pxx_us") is None
    assert len({m.name for m in CATALOGUE}) == len(CATALOGUE)


def test_every_metric_fio_and_netload_store_is_in_the_catalogue(tmp_path: Path) -> None:
    res = subprocess.run(
        ["fio", "--name=t", f"--filename={tmp_path / 'f'}", "--size=4m", "--rw=randrw", "--bs=4k", "--runtime=0.3",
         "--time_based", "--output-format=json"], capture_output=True, text=True, check=True, timeout=60,
    )
    stored = set(fiomod.parse_fio_json(res.stdout))
    doc = {
        "summary": {"throughput_bytes_per_s": 2e6, "transactions_per_s": 1000.0, "bytes": 6e6, "transactions": 3000,
                    "errors": 0, "duration_s": 3.0, "tcp_retransmits": 7, "undelivered_messages": 2,
                    "txn_time_ns": {"count": 3000, "avg": 2500.0, "p50": 2000, "p90": 3000, "p99": 9000, "p99_9": 20000}},
        "cpu": {side: {"system_cpu_s_per_mb": 0.5, "system_cpu_us_per_txn": 40.0, "system_busy_share": 0.25}
                for side in ("client", "server")},
    }
    stored |= set(netload_metrics(doc))
    missing = sorted(n for n in stored if lookup(n) is None)
    assert not missing, missing
    assert "clat_p99_read_us" in stored  # the families are exercised


def test_compare_at_one_sample_never_says_no_significant_difference(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert welch_diff([100.0], [102.0], "iops").better == "unknown"
    db = tmp_path / "r.db"
    with Store(db) as st:
        for iops in (100.0, 102.0):
            rid = st.begin_run("quick", {"accel": "none"}, {})
            st.add_cell(rid, "k|w", {}, "w", "ok", {"iops": iops}, accel="none")
            st.finish_run(rid, "complete")
    assert cli.main(["compare", "1", "2", "--db", str(db), "--metric", "iops"]) == 0
    out = capsys.readouterr().out
    assert "no significant difference" not in out and "inconclusive (no interval: 1 round a side" in out


def test_compare_unknown_metric_is_an_error_naming_the_valid_ones(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "r.db"
    with Store(db) as st:
        for _ in range(2):
            rid = st.begin_run("storage", {"accel": "tcg"}, {})
            st.add_cell(rid, "k|w", {}, "w", "ok", {"iops": 1.0}, accel="tcg")
    assert cli.main(["compare", "1", "2", "--db", str(db), "--metric", "latency"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown metric 'latency'" in err[0]
    assert all(n in err[0] for n in ("iops", "clat_pNN_us", "throughput_Bps"))
    assert set(names()) >= {"iops", "bw_Bps", "lat_STAT_us"}


def test_results_show_prints_a_dash_for_what_was_not_measured(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "r.db"
    with Store(db) as st:
        rid = st.begin_run("quick", {"accel": "none"}, {})
        st.add_cell(rid, "none/qcow2-off/none/threads|qemu-img-write-4k", {}, "qemu-img-write-4k", "ok",
                    {"iops": 5000.0, "bw_Bps": 5000.0 * 4096}, accel="none")
        st.finish_run(rid, "complete")
    assert cli.main(["results", "show", "1", "--db", str(db)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "qemu-img-write-4k" in ln)
    assert "5,000 IOPS" in line and "p99        – µs" in line and " 0 µs" not in line
