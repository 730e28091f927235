"""The HTML report's table of replayed workloads: a stored run's replay record, its profile, escaped."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from kvmtune.bench.report import replay_table
from kvmtune.bench.report_workload import histogram, profile_charts


def run(env: dict[str, Any]) -> Any:
    return SimpleNamespace(id=7, kind="block", env=env)


def test_a_replayed_run_shows_its_profile_and_values_from_the_database_are_escaped() -> None:
    rep = {"digest": "ab" * 32, "source": "iolog", "mode": "timed", "disk": "<script>vda", "synthesized": False,
           "profile": {"iops": 588.4, "read_fraction": 0.7, "size_mean": 16384, "sequential_fraction": 0.0,
                       "depth_mean": 7.5, "depth_p95": 8, "flush_per_write": None}}
    html = replay_table([run({"replay": rep}), run({})])
    assert "<h2>Replayed workloads</h2>" in html and html.count("<tr>") == 2
    assert "&lt;script&gt;vda" in html and "<script>" not in html
    assert ">588<" in html and ">70%<" in html and ">16.0 KiB<" in html and ">7.5 / 8<" in html and ">–<" in html
    synth = replay_table([run({"replay": dict(rep, synthesized=True, profile="junk")})])
    assert "synthesized from statistics" in synth
    assert replay_table([run({}), run({"replay": "junk"})]) == ""


def test_a_replayed_runs_profile_is_drawn_its_size_histogram_and_mix() -> None:
    rep = {"digest": "ab" * 32, "source": "iolog", "mode": "timed", "disk": "vda",
           "profile": {"iops": 588.4, "read_fraction": 0.7, "size_mean": 16384, "sequential_fraction": 0.1,
                       "depth_mean": 7.5, "depth_p95": 8, "flush_per_write": 0.0625,
                       "size_histogram": [[4096, 10], [16384, 30]]}}
    html = replay_table([run({"replay": rep})])
    assert html.count("<svg") == 2  # the size histogram, the mix
    assert "≤4 KiB" in html and "≤16 KiB" in html and "share of requests (%)" in html
    assert "queue depth mean 7.5, p95 8, 588 IOPS, mean size 16.0 KiB" in html


@pytest.mark.parametrize("hist", [
    "junk", {"a": 1}, [[4096]], [[4096, 1], [4096, 2]], [[16384, 1], [4096, 2]], [[True, 1]], [[4096, -1]],
    [[0, 1]], [[4096, 1.5]], [[2**50, 1]], [[i + 1, 1] for i in range(65)], [["9" * 400, 1]],
])
def test_a_histogram_from_the_database_that_is_not_one_is_not_drawn(hist: Any) -> None:
    assert histogram(hist) == []
    page = profile_charts({"size_histogram": hist, "read_fraction": float("nan"), "iops": 1e300}, "<b>x</b>")
    assert page == ""  # nothing checkable left: not even a title


def test_a_workload_file_disk_is_drawn_with_its_name_escaped() -> None:
    hist = {"4096": 3, "16384": 9}
    assert histogram(hist) == [(4096, 3), (16384, 9)]
    page = profile_charts({"size_histogram": hist, "read_fraction": 0.5}, "disk <script>alert(1)</script>")
    assert "&lt;script&gt;" in page and "<script>" not in page and page.count("<svg") == 2
