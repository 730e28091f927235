"""Judging canary runs against the baseline: the rule of docs/verdicts.md, busy hosts, what changed."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from kvmtune.canary.judge import Busy, judge
from kvmtune.canary.metrics import JUDGEMENT_KEY, KIND, RESET_KIND, SUITE_VERSION
from kvmtune.lab.store import Store

IOPS = "block.randread4k.qd32.iops"
RR = "datapath.rr.p50"
QUIET = {"loadavg": [0.1, 0.1, 0.1], "ncpu": 2, "packages": {"qemu-system-x86": "1:7.2-1"}}


def add_run(st: Store, iops: list[float], rr: list[float], env: dict[str, Any] | None = None, verdict: str | None = None,
            kind: str = KIND) -> int:
    run = st.begin_run(kind, env or QUIET, {"suite": SUITE_VERSION, "quick": True})
    for name, xs in ((IOPS, iops), (RR, rr)):
        for i, x in enumerate(xs):
            st.add_cell(run, f"canary|{name}", {"metric": name}, name, "ok", {"value": x}, rep=i)
    if verdict:
        st.add_cell(run, JUDGEMENT_KEY, {"verdict": verdict}, "judgement", "ok", {})
    st.finish_run(run, "complete")
    return run


def baseline(st: Store) -> None:
    for k in range(3):
        add_run(st, [10000 + 100 * k, 10100, 9900], [30.0, 30.5, 29.8], verdict="baseline")


def test_first_runs_are_the_baseline(tmp_path: Path) -> None:
    with Store(tmp_path / "r.db") as st:
        run = add_run(st, [10000, 10100, 9900], [30, 31, 30])
        j = judge(st, st.run(run), 3)
    assert j.verdict == "baseline" and {m["verdict"] for m in j.metrics} == {"baseline"}


def test_a_settled_drop_is_a_regression_with_what_changed(tmp_path: Path) -> None:
    with Store(tmp_path / "r.db") as st:
        baseline(st)
        env = QUIET | {"packages": {"qemu-system-x86": "1:7.2-2"}}
        run = add_run(st, [6000, 6100, 5900], [30.1, 30.2, 29.9], env)
        j = judge(st, st.run(run), 3)
    doc = j.to_json()
    by = {m["name"]: m for m in doc["metrics"]}
    assert by[IOPS]["verdict"] == "regression" and by[IOPS]["interval"][1] < 0.95
    assert by[RR]["verdict"] == "no-change"
    assert doc["verdict"] == "regression"
    assert doc["changed"] == [{"what": "qemu-system-x86", "before": "1:7.2-1", "after": "1:7.2-2"}]
    assert json.loads(json.dumps(doc))["suite"] == SUITE_VERSION


def test_higher_latency_is_a_regression_lower_an_improvement(tmp_path: Path) -> None:
    with Store(tmp_path / "r.db") as st:
        baseline(st)
        worse = judge(st, st.run(add_run(st, [10000, 10050, 9950], [45, 46, 44])), 3)
        better = judge(st, st.run(add_run(st, [10000, 10050, 9950], [20, 20.5, 19.5])), 3)
    assert {m["name"]: m["verdict"] for m in worse.metrics}[RR] == "regression"
    assert {m["name"]: m["verdict"] for m in better.metrics}[RR] == "improvement"


def test_a_busy_host_is_not_judged(tmp_path: Path) -> None:
    with Store(tmp_path / "r.db") as st:
        baseline(st)
        loaded = judge(st, st.run(add_run(st, [5000, 5000, 5100], [30, 30, 30], QUIET | {"loadavg": [5.0, 1, 1]})), 3)
        noisy = judge(st, st.run(add_run(st, [3000, 9000, 12000], [30, 30, 30])), 3)
        lenient = judge(st, st.run(add_run(st, [5000, 5000, 5100], [30, 30, 30], QUIET | {"loadavg": [5.0, 1, 1]})), 3,
                        busy_limits=Busy(load_per_cpu=10))
    assert loaded.verdict == "not-judged" and "load average 5.00" in (loaded.busy or "")
    assert {m["verdict"] for m in loaded.metrics} == {"not-judged"}
    assert noisy.verdict == "not-judged" and IOPS in (noisy.busy or "")
    assert lenient.verdict == "regression"


def test_own_throttling_is_judged_and_reported_not_noise(tmp_path: Path) -> None:
    with Store(tmp_path / "r.db") as st:
        baseline(st)
        j = judge(st, st.run(add_run(st, [1000, 3000, 2000], [90, 130, 200])), 3, throttled=42)
    assert j.verdict == "regression"
    assert any("nr_throttled" in c["what"] and c["after"] == "42" for c in j.changed)


def test_changed_counts_from_the_last_run_without_a_regression(tmp_path: Path) -> None:
    with Store(tmp_path / "r.db") as st:
        baseline(st)
        add_run(st, [10000, 10000, 10000], [30, 30, 30], QUIET | {"kernel": "6.2"}, verdict="no-regression")
        add_run(st, [5000, 5000, 5000], [30, 30, 30], QUIET | {"kernel": "6.2", "governor": "powersave"},
                verdict="regression")
        j = judge(st, st.run(add_run(st, [5000, 5000, 5000], [30, 30, 30],
                                     QUIET | {"kernel": "6.2", "governor": "powersave"})), 3)
    assert j.changed == [{"what": "governor", "before": "(none)", "after": "powersave"}]


def test_nothing_changed_is_said(tmp_path: Path) -> None:
    with Store(tmp_path / "r.db") as st:
        baseline(st)
        j = judge(st, st.run(add_run(st, [5000, 5000, 5100], [30, 30, 30])), 3)
    assert j.verdict == "regression" and j.changed == []


def test_a_reset_starts_a_new_baseline(tmp_path: Path) -> None:
    with Store(tmp_path / "r.db") as st:
        baseline(st)
        reset = st.begin_run(RESET_KIND, {"tier": "canary"}, {"suite": SUITE_VERSION, "reason": "new kernel"})
        st.finish_run(reset, "complete", note="new kernel")
        j = judge(st, st.run(add_run(st, [5000, 5000, 5100], [30, 30, 30])), 3)
    assert j.verdict == "baseline"


def test_figures_someone_else_wrote_into_the_db_are_not_believed(tmp_path: Path) -> None:
    with Store(tmp_path / "r.db") as st:
        baseline(st)
        run = add_run(st, [10000, 10000, 10000], [30, 30, 30], QUIET | {"loadavg": "high", "ncpu": 2})
    con = sqlite3.connect(tmp_path / "r.db")
    con.execute("UPDATE metrics SET value=-1 WHERE cell_id IN (SELECT id FROM cells WHERE run_id=? AND rep=0)", (run,))
    con.execute("UPDATE runs SET args=? WHERE id=1", (json.dumps({"suite": ["1"]}),))  # not a canary run of this suite
    con.commit()
    con.close()
    with Store(tmp_path / "r.db") as st:
        j = judge(st, st.run(run), 3)
    assert j.verdict == "baseline"  # run 1 no longer counts: two baseline runs are left
    assert all(len(m["rounds"]) == 2 for m in j.metrics)  # the negative figure is not a figure


def test_the_kvm_entry_cost_is_compared_only_within_one_kvm_module(tmp_path: Path) -> None:
    kvm = "kvm.create_vm_vcpu"
    with Store(tmp_path / "r.db") as st:
        for _ in range(3):
            run = add_run(st, [10000, 10000, 10000], [30, 30, 30], QUIET | {"kvm_module": "kvm_intel"})
            for i, x in enumerate([300.0, 310.0, 305.0]):
                st.add_cell(run, f"canary|{kvm}", {"metric": kvm}, kvm, "ok", {"value": x}, rep=i)
        other = add_run(st, [10000, 10000, 10000], [30, 30, 30], QUIET | {"kvm_module": "kvm_pvm"})
        for i, x in enumerate([1000.0, 1010.0, 990.0]):
            st.add_cell(other, f"canary|{kvm}", {"metric": kvm}, kvm, "ok", {"value": x}, rep=i)
        j = judge(st, st.run(other), 3)
    by = {m["name"]: m["verdict"] for m in j.metrics}
    assert by[kvm] == "not-judged" and j.verdict == "no-regression"
