"""Options typed the way people type them: bus aliases, "did you mean", and the ETA on progress lines."""

from __future__ import annotations

import time

import pytest

from kvmtune.bench.storage.matrix import build_matrix
from kvmtune.errors import InputError
from kvmtune.lab.runner import _eta


def test_virtio_means_virtio_blk_and_typos_get_a_suggestion() -> None:
    cells = build_matrix({"bus": ["virtio"], "aio": ["native"]})
    assert {c.bus for c in cells} == {"virtio-blk"}
    with pytest.raises(InputError, match=r"did you mean virtio-blk"):
        build_matrix({"bus": ["virtio-blck"], "aio": ["native"]})
    with pytest.raises(InputError, match=r"did you mean writethrough"):
        build_matrix({"bus": ["ide"], "cache": ["writethru"]})


def test_eta_from_the_pace_so_far() -> None:
    since = time.monotonic() - 60  # 3 of 12 cells in a minute: 9 more take about 3 minutes
    assert _eta(since, 3, 12) in (" ETA 3m00s", " ETA 3m01s")
    assert _eta(since, 12, 12) == "" and _eta(0.0, 3, 12) == ""


def test_compare_json(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    import json
    from pathlib import Path

    from kvmtune import cli
    from kvmtune.lab.store import Store

    db = Path(str(tmp_path)) / "r.db"
    with Store(db) as st:
        for iops in ((100.0, 110.0, 105.0), (200.0, 190.0, 195.0)):
            rid = st.begin_run("storage", {"accel": "tcg"}, {})
            for rep, v in enumerate(iops):
                st.add_cell(rid, "ide/raw-off/none/threads|randwrite-4k", {}, "randwrite-4k", "ok", {"iops": v},
                            rep=rep, accel="tcg")
            st.finish_run(rid, "complete")
    assert cli.main(["compare", "1", "2", "--db", str(db), "--format", "json"]) == 0
    (d,) = json.loads(capsys.readouterr().out)["diffs"]
    assert (d["metric"], d["median_a"], d["median_b"], d["better"]) == ("iops", 105.0, 195.0, "B")
    assert d["ci95_pct"][0] < d["diff_pct"] < d["ci95_pct"][1]
