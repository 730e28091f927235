"""``kvmtune canary history --format html``: a chart per metric, runs coloured by verdict, the baseline's line, the
environment's changes marked on the time axis; everything from the database printed escaped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvmtune.canary.chart import metric_chart, render_html
from kvmtune.canary.history import history
from kvmtune.canary.metrics import JUDGEMENT_KEY, KIND, RESET_KIND, SUITE_VERSION
from kvmtune.cli import main
from kvmtune.lab.store import Store

IOPS = "block.randread4k.qd32.iops"
PROBE = "probe.boot_to_agent"
ENV = {"loadavg": [0.1, 0.1, 0.1], "ncpu": 2, "packages": {"qemu-system-x86": "1:7.2-1"}}


def add_run(st: Store, iops: float, verdict: str, env: dict[str, Any], probe: dict[str, str] | None = None) -> int:
    run = st.begin_run(KIND, env, {"suite": SUITE_VERSION, "quick": probe is None})
    for i in range(3):
        st.add_cell(run, f"canary|{IOPS}", {"metric": IOPS}, IOPS, "ok", {"value": iops + i}, rep=i)
        if probe is not None:
            st.add_cell(run, f"canary|{PROBE}", {"metric": PROBE, "labels": probe}, PROBE, "ok", {"value": 4.5 + i / 10},
                        rep=i)
    st.add_cell(run, JUDGEMENT_KEY, {"verdict": verdict}, "judgement", "ok", {})
    st.finish_run(run, "complete")
    return run


def db(tmp_path: Path) -> Path:
    path = tmp_path / "r.db"
    with Store(path) as st:
        for _ in range(3):
            add_run(st, 10000, "baseline", ENV, {"accel": "tcg"})
        hostile = ENV | {"packages": {"qemu-system-x86": "1:7.2-2"}, "governor": "<script>alert(1)</script>"}
        add_run(st, 6000, "regression", hostile, {"accel": "kvm", "kvm_module": "kvm_intel"})
        reset = st.begin_run(RESET_KIND, {"tier": "canary"}, {"suite": SUITE_VERSION, "reason": "new <b>kernel</b>"})
        st.finish_run(reset, "complete", note="new <b>kernel</b>")
        add_run(st, 6000, "baseline", hostile)
    return path


def test_a_chart_per_measured_metric_with_changes_marked(tmp_path: Path) -> None:
    with Store(db(tmp_path)) as st:
        rows = history(st)
    page = render_html(rows)
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") == 2  # the block IOPS and the probe boot
    iops = metric_chart(rows, IOPS)
    assert "▲1" in iops and "qemu-system-x86 1:7.2-1 → 1:7.2-2" in iops  # the package change on the time axis
    assert "run 4" in iops and "regression" in iops and "baseline" in iops
    assert "after reset 5" in iops  # the panels: before and after the reset
    assert metric_chart(rows, "datapath.stream") == ""  # never measured: no chart


def test_labelled_figures_are_separate_series(tmp_path: Path) -> None:
    with Store(db(tmp_path)) as st:
        probe = metric_chart(history(st), PROBE)
    assert "baseline (accelerator tcg (emulation))" in probe
    assert "regression (accelerator kvm, kvm_module kvm_intel)" in probe


def test_what_the_database_says_is_escaped(tmp_path: Path) -> None:
    with Store(db(tmp_path)) as st:
        page = render_html(history(st))
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "<b>kernel" not in page


def test_the_cli_writes_the_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = db(tmp_path)
    assert main(["canary", "history", "--db", str(path), "--format", "html"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("<!DOCTYPE html>") and out.count("<svg") == 2


def test_an_empty_history_is_a_page_that_says_so(tmp_path: Path) -> None:
    with Store(tmp_path / "r.db") as st:
        page = render_html(history(st))
    assert "no canary runs yet" in page and "<svg" not in page
