"""What the host cannot give is said, not left out: vhost-net without /dev/vhost-net (a HostRoot fixture tree), the
KVM entry cost without a KVM module; each is in the run's environment and in its judgement as "not measured: …"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvmtune.canary.fleet import load
from kvmtune.canary.history import history, prometheus_lines, render_history
from kvmtune.canary.judge import judge
from kvmtune.canary.metrics import KIND, SUITE_VERSION
from kvmtune.canary.suite import KVM_METRIC, VHOST_METRIC, CanaryBenchmark, CanaryPlan, unmeasured
from kvmtune.cli.canary import render_text
from kvmtune.host.root import HostRoot
from kvmtune.lab.store import Store
from kvmtune.runner import Runner

IOPS = "block.randread4k.qd32.iops"
NO_VHOST = "no /dev/vhost-net (modprobe vhost_net)"


def tree(tmp_path: Path, vhost: bool) -> HostRoot:
    root = tmp_path / ("with" if vhost else "without")
    (root / "dev").mkdir(parents=True)
    if vhost:
        (root / "dev/vhost-net").write_text("")  # a stand-in for the character device
    return HostRoot(str(root))


def test_no_vhost_net_is_marked_not_measured(tmp_path: Path) -> None:
    host = tree(tmp_path, vhost=False)
    assert unmeasured(host, ("block", "datapath"), quick=True) == {VHOST_METRIC: NO_VHOST}
    assert unmeasured(host, ("block",), quick=True) == {}  # no datapath tier, no vhost-net metric to miss


def test_with_vhost_net_the_reason_is_not_its_absence(tmp_path: Path) -> None:
    reason = unmeasured(tree(tmp_path, vhost=True), ("block", "datapath"), quick=True)[VHOST_METRIC]
    assert "/dev/vhost-net" not in reason and "KVM probe guest" in reason


def test_the_full_suite_without_kvm_says_so(tmp_path: Path) -> None:
    host = tree(tmp_path, vhost=False)
    full = unmeasured(host, ("block", "probe", "datapath"), quick=False)
    assert full[KVM_METRIC].startswith("no KVM module") and full[VHOST_METRIC] == NO_VHOST
    assert KVM_METRIC not in unmeasured(host, ("block", "kvm", "probe", "datapath"), quick=False)
    assert KVM_METRIC not in unmeasured(host, ("block", "datapath"), quick=True)  # --quick never has it


def test_the_planned_cells_do_not_count_what_is_not_measured(tmp_path: Path) -> None:
    bench = CanaryBenchmark(runner=Runner(), host=tree(tmp_path, vhost=False), scratch_dir=tmp_path, workdir=tmp_path,
                            netload=None, plan_=CanaryPlan(rounds=3), environment_of=dict)
    assert bench.planned_cells() == 3 * 5  # three block metrics, two datapath ones


def add_run(st: Store, env: dict[str, Any]) -> int:
    run = st.begin_run(KIND, env, {"suite": SUITE_VERSION, "quick": True})
    for i, x in enumerate([10000.0, 10100.0, 9900.0]):
        st.add_cell(run, f"canary|{IOPS}", {"metric": IOPS}, IOPS, "ok", {"value": x}, rep=i)
    st.finish_run(run, "complete")
    return run


ENV = {"loadavg": [0.1, 0.1, 0.1], "ncpu": 2, "hostname": "h1"}


def test_a_run_lists_it_not_measured_with_why(tmp_path: Path) -> None:
    env = ENV | {"not_measured": {VHOST_METRIC: NO_VHOST}}
    with Store(tmp_path / "r.db") as st:
        first = judge(st, st.run(add_run(st, env)), 3)
        for _ in range(2):
            add_run(st, env)
        later = judge(st, st.run(add_run(st, env)), 3)
        rows = history(st)
    for j in (first, later):
        by = {m["name"]: m for m in j.to_json()["metrics"]}
        assert by[VHOST_METRIC]["verdict"] == "not-judged" and by[VHOST_METRIC]["value"] is None
        assert by[VHOST_METRIC]["note"] == f"not measured: {NO_VHOST}"
    assert later.verdict == "no-regression"  # a metric not measured is never a regression, nor blocks the others
    doc = later.to_json()
    text = render_text(doc)
    assert f"not-judged    {VHOST_METRIC}: not measured: {NO_VHOST}" in text
    assert f'kvmtune_canary_regression{{metric="{VHOST_METRIC}"}} 0' in prometheus_lines(doc)
    (tmp_path / "h1.json").write_text(json.dumps(doc))
    assert load(str(tmp_path / "h1.json")).verdict == "no-regression"  # the fleet reads such a document
    assert rows[-1]["not_measured"] == {VHOST_METRIC: NO_VHOST}
    assert f"not measured: {VHOST_METRIC}" in render_history(rows)


def test_a_not_measured_entry_someone_else_wrote_is_left_out(tmp_path: Path) -> None:
    env = ENV | {"not_measured": {VHOST_METRIC: ["no"], "made.up": "why", IOPS: "x" * 301, KVM_METRIC: "\u2028spoof"}}
    with Store(tmp_path / "r.db") as st:
        j = judge(st, st.run(add_run(st, env)), 3)
    by = {m["name"]: m for m in j.metrics}
    assert set(by) == {IOPS, KVM_METRIC}  # the measured one, and the one well-formed entry
    assert "\u2028" not in by[KVM_METRIC]["note"]  # printed through textsafe
    with Store(tmp_path / "s.db") as st:
        j = judge(st, st.run(add_run(st, ENV | {"not_measured": "all of them"})), 3)
    assert [m["name"] for m in j.metrics] == [IOPS]


def test_a_measured_metric_is_never_also_not_measured(tmp_path: Path) -> None:
    with Store(tmp_path / "r.db") as st:
        j = judge(st, st.run(add_run(st, ENV | {"not_measured": {IOPS: "claimed"}})), 3)
    assert [(m["name"], m["value"] is not None) for m in j.metrics] == [(IOPS, True)]
