"""Judging canary runs against the baseline: the rule of docs/verdicts.md, busy hosts, what changed."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from kvmtune.canary.history import prometheus_lines
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


PROBE = "probe.boot_to_agent"


def add_probe(st: Store, run: int, boots: list[float], labels: Any) -> None:
    config: dict[str, Any] = {"metric": PROBE}
    if labels is not None:
        config["labels"] = labels
    for i, x in enumerate(boots):
        st.add_cell(run, f"canary|{PROBE}", config, PROBE, "ok", {"value": x}, rep=i)


def probe_run(st: Store, boots: list[float], labels: Any, env: dict[str, Any] | None = None) -> int:
    run = st.begin_run(KIND, env or QUIET, {"suite": SUITE_VERSION, "quick": False})
    for name, xs in ((IOPS, [10000.0, 10000.0, 10000.0]), (RR, [30.0, 30.0, 30.0])):
        for i, x in enumerate(xs):
            st.add_cell(run, f"canary|{name}", {"metric": name}, name, "ok", {"value": x}, rep=i)
    add_probe(st, run, boots, labels)
    st.finish_run(run, "complete")
    return run


TCG = {"accel": "tcg"}
KVM_INTEL = {"accel": "kvm", "kvm_module": "kvm_intel"}


def test_a_tcg_boot_is_never_compared_with_a_kvm_baseline(tmp_path: Path) -> None:
    with Store(tmp_path / "r.db") as st:
        for _ in range(3):
            probe_run(st, [0.40, 0.41, 0.39], KVM_INTEL)
        # ten times slower under emulation: compared with the KVM baseline this would be a regression
        j = judge(st, st.run(probe_run(st, [4.5, 4.6, 4.4], TCG)), 3)
    by = {m["name"]: m for m in j.to_json()["metrics"]}
    assert by[PROBE]["verdict"] == "not-judged" and by[PROBE]["ratio"] is None and by[PROBE]["baseline"] is None
    assert by[PROBE]["labels"] == TCG
    assert "accelerator kvm, kvm_module kvm_intel" in by[PROBE]["note"]
    assert "accelerator tcg (emulation)" in by[PROBE]["note"]
    assert j.verdict == "no-regression"  # the other metrics are judged as ever


def test_a_kvm_boot_is_never_compared_with_a_tcg_baseline_nor_across_kvm_modules(tmp_path: Path) -> None:
    with Store(tmp_path / "r.db") as st:
        for _ in range(3):
            probe_run(st, [4.5, 4.6, 4.4], TCG)
        kvm = judge(st, st.run(probe_run(st, [9.0, 9.1, 8.9], KVM_INTEL)), 3)
    with Store(tmp_path / "s.db") as st:
        for _ in range(3):
            probe_run(st, [0.40, 0.41, 0.39], KVM_INTEL)
        pvm = judge(st, st.run(probe_run(st, [2.0, 2.1, 1.9], {"accel": "kvm", "kvm_module": "kvm_pvm"})), 3)
    for j in (kvm, pvm):
        by = {m["name"]: m for m in j.metrics}
        assert by[PROBE]["verdict"] == "not-judged" and by[PROBE]["note"].startswith("not compared")


def test_boots_under_the_same_accelerator_are_judged(tmp_path: Path) -> None:
    with Store(tmp_path / "r.db") as st:
        for _ in range(3):
            probe_run(st, [4.5, 4.6, 4.4], TCG)
        probe_run(st, [0.4, 0.4, 0.4], KVM_INTEL)  # a KVM run between them takes nothing from the TCG baseline
        slower = judge(st, st.run(probe_run(st, [6.5, 6.6, 6.4], TCG)), 3)
        same = judge(st, st.run(probe_run(st, [4.5, 4.55, 4.45], TCG)), 3)
    assert {m["name"]: m["verdict"] for m in slower.metrics}[PROBE] == "regression"
    assert slower.verdict == "regression"
    prom = prometheus_lines(slower.to_json())
    assert f'kvmtune_canary_regression{{metric="{PROBE}",accel="tcg"}} 1' in prom
    assert f'kvmtune_canary_regression{{metric="{IOPS}"}} 0' in prom
    by = {m["name"]: m for m in same.metrics}
    assert by[PROBE]["verdict"] == "no-change" and by[PROBE]["note"] is None and len(by[PROBE]["rounds"]) == 3


def test_the_baseline_mixes_no_accelerators(tmp_path: Path) -> None:
    """Baseline runs of both accelerators: only those of this run's are pooled (the ratio is against them alone)."""
    with Store(tmp_path / "r.db") as st:
        probe_run(st, [4.0, 4.0, 4.0], TCG)
        probe_run(st, [0.4, 0.4, 0.4], KVM_INTEL)
        probe_run(st, [4.0, 4.0, 4.0], TCG)
        j = judge(st, st.run(probe_run(st, [4.0, 4.0, 4.0], TCG)), 3)
    m = {m["name"]: m for m in j.metrics}[PROBE]
    assert m["baseline"] == 4.0 and m["ratio"] == 1.0


def test_labels_that_are_not_kvmtunes_are_not_believed(tmp_path: Path) -> None:
    with Store(tmp_path / "r.db") as st:
        for _ in range(3):
            probe_run(st, [4.5, 4.6, 4.4], TCG)
        run = probe_run(st, [4.5, 4.6, 4.4], {"accel": ["tcg"]})  # not a string
        bogus = judge(st, st.run(run), 3)
        run = probe_run(st, [4.5, 4.6, 4.4], {"accel": "tcg", "colour": "blue"})  # a key no metric is compared within
        extra = judge(st, st.run(run), 3)
        run = probe_run(st, [4.5], TCG)
        add_probe(st, run, [0.4, 0.4], KVM_INTEL)  # rounds of one run under two labels: only the first label's count
        mixed = judge(st, st.run(run), 3)
    assert PROBE not in {m["name"] for m in bogus.metrics} and PROBE not in {m["name"] for m in extra.metrics}
    m = {m["name"]: m for m in mixed.metrics}[PROBE]
    assert m["rounds"] == [4.5] and m["labels"] == TCG


def test_a_kvm_entry_cost_of_an_older_kvmtune_takes_its_label_from_the_environment(tmp_path: Path) -> None:
    kvm = "kvm.create_vm_vcpu"
    with Store(tmp_path / "r.db") as st:
        for _ in range(3):
            run = add_run(st, [10000, 10000, 10000], [30, 30, 30], QUIET | {"kvm_module": "kvm_intel"})
            for i, x in enumerate([300.0, 310.0, 305.0]):  # no labels in the cell: written before they were
                st.add_cell(run, f"canary|{kvm}", {"metric": kvm}, kvm, "ok", {"value": x}, rep=i)
        new = add_run(st, [10000, 10000, 10000], [30, 30, 30], QUIET | {"kvm_module": "kvm_intel"})
        for i, x in enumerate([600.0, 610.0, 605.0]):
            st.add_cell(new, f"canary|{kvm}", {"metric": kvm, "labels": {"kvm_module": "kvm_intel"}}, kvm, "ok",
                        {"value": x}, rep=i)
        j = judge(st, st.run(new), 3)
    assert {m["name"]: m["verdict"] for m in j.metrics}[kvm] == "regression"


def test_a_metric_the_baseline_runs_did_not_measure_says_so(tmp_path: Path) -> None:
    """Baseline runs with --quick, then a full run: the probe boot has nothing to be compared with."""
    with Store(tmp_path / "r.db") as st:
        baseline(st)
        j = judge(st, st.run(probe_run(st, [4.5, 4.6, 4.4], TCG)), 3)
    m = {m["name"]: m for m in j.metrics}[PROBE]
    assert m["verdict"] == "not-judged" and m["note"].startswith("not compared: no baseline run measured it")
