"""The HTML report's table of replayed workloads: a stored run's replay record, its profile, escaped."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from kvmtune.bench.report import replay_table


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
