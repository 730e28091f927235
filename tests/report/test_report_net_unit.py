"""The network report and compare page without a browser: the SVG drawing, seed 002's claims and their
badges, and both pages rendered from real network runs read back from a results store."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from kvmtune import cli
from kvmtune.bench.net.claims import judge_better, judge_within, net_claims, per_run, winners_by_setting
from kvmtune.bench.svgchart import Bar, BarChart, bar_chart, log_ticks, nice_ticks, tick_text, wrap
from kvmtune.bench.verdicts import Ratio
from kvmtune.lab.store import CellRow, Store

FIXTURE = Path(__file__).parents[1] / "fixtures" / "bench" / "net_runs_tcg.json"
SVG = "{http://www.w3.org/2000/svg}"


def _svg(text: str) -> ET.Element:
    return ET.fromstring(text)  # well-formed, or this raises


def test_ticks() -> None:
    assert nice_ticks(0, 940) == [0, 200, 400, 600, 800, 1000]
    assert nice_ticks(-38, 33) == [-40, -20, 0, 20, 40]
    assert log_ticks(0.0013, 230) == [0.001, 0.01, 0.1, 1, 10, 100, 1000]
    assert log_ticks(1300, 21000) == [1000, 2000, 5000, 10000, 20000, 50000]
    assert tick_text(12345) == "12,345" and tick_text(0.00125) == "0.00125" and tick_text(20, percent=True) == "+20 %"
    assert wrap("a bb ccc dddd", 6) == ["a bb", "ccc", "dddd"]


def _chart(values: dict[str, float], **kw: Any) -> str:
    xs = [("", "rr1c-1x1", "1"), ("", "rr1c-1x1", "10"), ("", "str-readx30k", "1")]
    bars = {(x, s): Bar(v, kw.pop("hw", None) if s == "ovs" and x == xs[0] else None)
            for x in xs for s, v in values.items()}
    return bar_chart(BarChart(label="t", y_title="tx/s", xs=xs, series=list(values), bars=bars, **kw))


def test_log_axis_only_beyond_twenty_times() -> None:
    assert "log scale" not in _chart({"bridge": 100.0, "ovs": 1999.0})
    assert "log scale" in _chart({"bridge": 100.0, "ovs": 2001.0})
    signed = _chart({"bridge": -30.0, "ovs": 12.0}, percent=True)
    assert "log scale" not in signed and "+10 %" in signed and "-30 %" in signed


def test_bars_whiskers_groups_and_legend() -> None:
    root = _svg(_chart({"bridge": 100.0, "ovs": 150.0}, hw=40.0, series_title="configuration:",
                       level_names=("", "workload", "users")))
    rects = [r for r in root.iter(f"{SVG}rect") if r.find(f"{SVG}title") is not None]
    assert len(rects) == 6  # 3 tests × 2 configurations
    whiskers = [p for p in root.iter(f"{SVG}path") if p.get("stroke") == "#222"]
    assert len(whiskers) == 1  # only the repeated bar
    texts = [t.text for t in root.iter(f"{SVG}text")]
    for label in ("rr1c-1x1", "str-readx30k", "bridge", "ovs", "users", "workload", "configuration:"):
        assert label in texts, (label, texts)
    assert texts.count("rr1c-1x1") == 1  # the outer group is labelled once, under its bracket
    # a whisker reaching below zero does not drag the axis below zero
    low = _svg(_chart({"bridge": 100.0, "ovs": 150.0}, hw=400.0))
    assert not any((t.text or "").startswith("-") for t in low.iter(f"{SVG}text"))


def test_judges() -> None:
    """A claim holds or fails only when the whole interval says so; one run a side is always inconclusive."""
    for one_run in (1.3, 1.05, 0.9):
        assert judge_better(Ratio(one_run, None, None, 1), 1.10) == "inconclusive"
        assert judge_within(Ratio(one_run, None, None, 1), 0.10) == "inconclusive"
    assert judge_better(Ratio(1.3, 0.9, 1.8, 3), 1.10) == "inconclusive"
    assert judge_better(Ratio(1.3, 1.05, 1.6, 3), 1.10) == "inconclusive"  # apart from 1, not from the claim's 10 %
    assert judge_better(Ratio(1.3, 1.2, 1.4, 3), 1.10) == "holds"
    assert judge_better(Ratio(0.8, 0.7, 0.9, 3), 1.10) == "does not hold"
    assert judge_within(Ratio(1.05, 1.01, 1.09, 3), 0.10) == "holds"
    assert judge_within(Ratio(1.3, 1.2, 1.4, 3), 0.10) == "does not hold"
    assert judge_within(Ratio(1.05, 0.84, 1.31, 3), 0.10) == "inconclusive"


def _cell(run: int, topo: str, test: str, tps: float, bps: float, mtu: int = 1500, pair: int = 0,
          accel: str = "kvm", **extra: Any) -> CellRow:
    cfg = {"topology": topo, "mtu": mtu, "hosts": 1, "pairs": 1, "pair": pair, "tunings": {}, **extra}
    return CellRow(run * 100 + pair, run, f"{topo}|{test}", cfg, test, pair, "ok", None, accel, 1.0,
                   {"tps": tps, "throughput_Bps": bps})


def test_claims_from_cells() -> None:
    """Three runs a side, close together: each claim is settled by its interval."""
    cells = []
    for k, r in enumerate((0, 10, 20)):
        jitter = 1 + 0.01 * (k - 1)
        cells += [_cell(1 + r, "bridge", "rr1c-1x1--1", 100 * jitter, 200), _cell(1 + r, "bridge", "str-readx30k--1", 10,
                                                                                  1e6 * jitter),
                  _cell(2 + r, "ovs", "rr1c-1x1--1", 102 / jitter, 210), _cell(2 + r, "ovs", "str-readx30k--1", 10,
                                                                               1.02e6 / jitter),
                  _cell(3 + r, "macvtap", "rr1c-1x1--1", 130 * jitter, 260),
                  _cell(3 + r, "macvtap", "str-readx30k--1", 12, 1.3e6 * jitter),
                  _cell(4 + r, "bridge", "str-readx30k--1", 20, 1.6e6 * jitter, mtu=9000)]
    got = {c.seed.split(" p.")[1].strip(): c for c in net_claims(cells)}
    assert got["33"].badge == "holds" and "macvtap vs bridge" in (got["33"].measured or "")
    assert "+30 %" in (got["33"].measured or "")  # tx/s of the one request/response test both ran
    assert got["38"].badge == "holds"  # bridge within 10 % of ovs
    assert got["51, fig. 17"].badge == "holds" and "+60 %" in (got["51, fig. 17"].measured or "")
    assert got["52, fig. 18"].badge == "not measured" and "--hosts 2" in got["52, fig. 18"].hint
    summary = got["57"]
    assert summary.badge == "holds" and "streaming → macvtap" in (summary.measured or "")
    assert "large transactions not measured" in (summary.measured or "")
    table = winners_by_setting(per_run(cells))
    assert table[(9000, 1, 1, "")]["streaming"] == "only bridge measured"
    assert table[(1500, 1, 1, "")]["large transactions"] == "not measured"


def test_one_run_a_side_is_never_a_verdict() -> None:
    """bridge +127 % over OVS from one run each: inconclusive, and no topology is named the winner."""
    cells = [_cell(1, "bridge", "rr1c-1x1--1", 227, 1, tier="datapath", ovs_datapath=""),
             _cell(1, "ovs", "rr1c-1x1--1", 100, 1, tier="datapath", ovs_datapath="system"),
             _cell(1, "macvtap", "rr1c-1x1--1", 90, 1, tier="datapath")]
    claims = net_claims(cells)
    assert {c.badge for c in claims} <= {"inconclusive", "not measured"}, [(c.badge, c.measured) for c in claims]
    near = next(c for c in claims if "within 10 %" in c.claim)
    assert near.badge == "inconclusive" and "+127 %" in (near.measured or "") and "no interval" in (near.measured or "")
    small = winners_by_setting(per_run(cells))[(1500, 1, 1, "")]["small transactions"]
    assert not isinstance(small, str) and not small.decided and small.text().startswith("no winner: bridge +127 %")


def test_ovs_userspace_is_not_comparable_with_the_seed() -> None:
    """Seed 002 measured Open vSwitch's kernel datapath: the userspace one is another mechanism."""
    cells = [_cell(r, topo, "rr1c-1x1--1", tps * (1 + 0.01 * r), 1, tier="datapath",
                   ovs_datapath="netdev" if topo == "ovs" else "")
             for r in (1, 2, 3) for topo, tps in (("bridge", 227), ("ovs", 100), ("macvtap", 300))]
    got = {c.seed.split(" p.")[1].strip(): c for c in net_claims(cells)}
    assert got["38"].badge == "not comparable"
    assert "not comparable (Open vSwitch's userspace datapath (netdev)" in (got["38"].measured or "")
    assert got["33"].badge == "holds" and "macvtap vs ovs (userspace), MTU 1500, tx/s: not comparable" in (
        got["33"].measured or "")  # the bridge comparison still decides
    tcg = [_cell(r, topo, "rr1c-1x1--1", tps, 1, accel="tcg") for r in (1, 2) for topo, tps in (("bridge", 9), ("ovs", 9))]
    assert {c.badge for c in net_claims(tcg)} == {"not comparable"}


def test_repeated_runs_give_an_interval() -> None:
    cells = [_cell(r, "macvtap", "rr1c-1x1--1", 130 + r, 1) for r in (1, 2, 3)]
    cells += [_cell(r, "bridge", "rr1c-1x1--1", 100 - r, 1) for r in (4, 5, 6)]
    claim = net_claims(cells)[0]
    assert "95 % interval" in (claim.measured or "") and claim.badge == "holds"


@pytest.fixture
def net_db(tmp_path: Path) -> Path:
    """The fixture's real runs (bench net, guest tier under TCG) written back into a results store."""
    db = tmp_path / "r.db"
    doc = json.loads(FIXTURE.read_text())
    with Store(db) as st:
        for run in doc["runs"]:
            rid = st.begin_run(run["kind"], run["env"], run["args"])
            for c in run["cells"]:
                st.add_cell(rid, c["key"], c["config"], c["workload"], c["status"], c["metrics"], rep=c["rep"],
                            accel=c["accel"], duration_s=c["duration_s"])
            st.finish_run(rid, run["status"])
    return db


def test_network_report_from_real_runs(net_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "net.html"
    assert cli.main(["report", "1", "2", "3", "4", "5", "--db", str(net_db), "--html", str(out)]) == 0
    text_out = capsys.readouterr().out
    assert "seed:002 p. 33 [network guest, tcg]" in text_out and "MTU 1500, 1 host, 1 pair: small transactions" in text_out
    page = out.read_text()
    order = ("Seed claims, measured here", "<h2>Runs</h2>", "Network: probe guests, accelerator tcg")
    assert [page.index(x) for x in order] == sorted(page.index(x) for x in order)
    assert "Measured under TCG" in page and "network guest" in page and "Accelerator: tcg" not in page
    assert "Which topology won" in page and "transaction time percentiles" in page
    percentiles = page[page.index("transaction time percentiles"):page.index("<h3>All cells</h3>")]
    assert "rr1c-1x1" in percentiles and "str-readx30k" not in percentiles  # request/response tests only
    assert "print-color-adjust:exact" in page  # white-on-colour badges keep their colour on paper
    assert "data:image" not in page and "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    svgs = [page[i:page.index("</svg>", i) + 6] for i in range(len(page)) if page.startswith("<svg", i)]
    assert len(svgs) == 5  # tx/s, transaction time; throughput, client and server CPU per GB
    for s in svgs:
        _svg(s)
    # request/response tests get transactions/s and time, streams throughput and CPU: no axis spans both
    assert all("rr1c" in s and "str-readx30k" not in s for s in svgs[:2])
    assert all("str-readx30k" in s and "rr1c" not in s for s in svgs[2:])
    assert "Mb/s" in svgs[2]  # TCG guests stay far below a gigabit
    assert "CPU per GB, s/GB" in svgs[3]
    assert all(label in svgs[0] for label in ("bridge MTU 1500", "bridge MTU 9000", "macvtap MTU 1500",
                                               "ovs (userspace) MTU 1500"))
    # bridge MTU 1500 ran twice: its bars carry whiskers, the others none
    assert "(95 %, n=2)" in svgs[0] and "(95 %, n=1)" not in svgs[0]
    # normalised to one configuration, test by test
    base = tmp_path / "base.html"
    assert cli.main(["report", "1", "2", "3", "4", "5", "--db", str(net_db), "--html", str(base),
                     "--baseline", "ovs"]) == 0  # the only configuration whose label begins with it
    assert "% of ovs (userspace) MTU 1500 in the same test" in base.read_text()
    capsys.readouterr()
    assert cli.main(["report", "1", "2", "3", "4", "5", "--db", str(net_db), "--html", str(base),
                     "--baseline", "bridge"]) == 2  # two bridge configurations: ambiguous
    assert "'bridge' begins 2 configurations (bridge MTU 1500, bridge MTU 9000)" in capsys.readouterr().err
    assert cli.main(["report", "1", "2", "--db", str(net_db), "--html", str(base), "--baseline", "brigde"]) == 2
    assert "did you mean 'bridge'" in capsys.readouterr().err


def test_network_compare_from_real_runs(net_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cmp.html"
    assert cli.main(["compare", "1", "2", "--db", str(net_db), "--html", str(out)]) == 0
    table = capsys.readouterr().out
    page = out.read_text()
    assert "topology bridge → ovs" in page and "B against A, summed up" in page and "<svg" in page
    assert "data:image" not in page
    root = _svg(page[page.index("<svg"):page.index("</svg>") + 6])
    bars = {}
    for tip in (t.text or "" for t in root.iter(f"{SVG}title")):
        if " — " in tip:
            where, _, rest = tip.partition(" — ")
            label, _, value = rest.partition(": ")
            bars[(where, label)] = float(value.split(" (")[0].replace(",", ""))
    # every bar's % is the one the text table prints for that test and figure
    rows = [line for line in table.splitlines()[2:] if not line.startswith("wrote ")]
    assert len(bars) == 4 * len(rows) == 12
    for line in rows:
        test, *pcts = line.split()
        for label, pct in zip(("throughput", "transaction time", "client CPU efficiency", "server CPU efficiency"),
                              pcts, strict=True):
            where = " / ".join(test.split("--"))
            assert abs(bars[(where, label)] - float(pct.rstrip("%"))) < 0.051, (where, label, pct)
    assert "Seed 002's claims, measured by these two runs" in page and "the Linux bridge performs within 10 %" in page


def test_network_compare_as_json(net_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["compare", "1", "2", "--db", str(net_db)]) == 0
    text = capsys.readouterr().out
    assert cli.main(["compare", "1", "2", "--db", str(net_db), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["kind"] == "network" and [t["test"] for t in doc["tests"]] == ["rr1c-1x1--1", "rr1c-1x1--10",
                                                                             "str-readx30k--1"]
    first = doc["tests"][0]
    assert f"{first['pct_better']['throughput']:+.1f}%" in text  # the same figure the text table prints
    assert first["a"]["tps"] > 0 and first["b"]["lat_avg_us"] > 0


def test_network_compare_warns_when_netload_versions_differ(net_db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["compare", "1", "2", "--db", str(net_db)]) == 0
    assert "WARNING" not in capsys.readouterr().err  # both runs: netload 0.1.0
    with Store(net_db) as st:
        env = dict(st.run(2).env, netload="netload 0.2.0")
        with st.db:
            st.db.execute("UPDATE runs SET env = ? WHERE id = 2", (json.dumps(env),))
    assert cli.main(["compare", "1", "2", "--db", str(net_db)]) == 0
    err = capsys.readouterr().err
    assert "run 1 was measured with netload 0.1.0 and run 2 with netload 0.2.0" in err
