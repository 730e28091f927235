"""``kvmtune canary history`` and the Prometheus textfile lines of a judged run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_canary_judge import IOPS, QUIET, RR, add_run, baseline

from kvmtune.canary.history import history, prometheus_lines, render_history
from kvmtune.canary.judge import judge
from kvmtune.cli import main
from kvmtune.lab.store import Store


def test_history_lists_runs_resets_and_changes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with Store(tmp_path / "r.db") as st:
        baseline(st)
        reset = st.begin_run("canary-reset", {"tier": "canary"}, {"suite": "1", "reason": "x"})
        st.finish_run(reset, "complete", note="kernel 6.12\x1b[2J")
        add_run(st, [5000, 5000, 5000], [30, 30, 30], QUIET | {"packages": {"qemu-system-x86": "1:7.2-2"}},
                verdict="baseline")
        rows = history(st)
    assert [r.get("verdict") for r in rows] == ["baseline"] * 3 + [None, "baseline"]
    assert rows[3]["reset"] == "kernel 6.12\\x1b[2J"
    assert rows[4]["changed"] == [{"what": "qemu-system-x86", "before": "1:7.2-1", "after": "1:7.2-2"}]
    assert rows[4]["metrics"][IOPS] == 5000
    text = render_history(rows)
    assert "baseline reset: kernel 6.12" in text and "\x1b" not in text and "qemu-system-x86 1:7.2-1 → 1:7.2-2" in text
    assert main(["canary", "history", "--db", str(tmp_path / "r.db"), "--format", "json"]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 5


def test_prometheus_lines(tmp_path: Path) -> None:
    with Store(tmp_path / "r.db") as st:
        baseline(st)
        doc = judge(st, st.run(add_run(st, [5000, 5000, 5100], [30, 30.2, 29.9])), 3).to_json()
    text = prometheus_lines(doc)
    assert f'kvmtune_canary_regression{{metric="{IOPS}"}} 1' in text
    assert f'kvmtune_canary_regression{{metric="{RR}"}} 0' in text
    assert f'kvmtune_canary_ratio{{metric="{IOPS}"}} 0.5' in text
    assert "# TYPE kvmtune_canary_ratio gauge" in text and "kvmtune_canary_judged 1" in text
