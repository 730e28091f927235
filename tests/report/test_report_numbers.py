"""What the report's numbers and words may say (issue 31): bars are the tables' figures, ``--baseline`` takes the
names kvmtune prints, verdict words come from the vocabulary and their direction from the sign."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvmtune import cli
from kvmtune.lab.store import Store
from kvmtune.lab.vocabulary import VOCABULARY

# (fmt, prealloc, cache, aio) → IOPS in each of three rounds: raw is slower than qcow2 with metadata here
CONFIGS = {
    ("raw", "off", "none", "native"): (8257.0, 8190.0, 8400.0),
    ("qcow2", "metadata", "none", "native"): (11430.0, 11200.0, 11800.0),
    ("qcow2", "off", "none", "native"): (2100.0, 2050.0, 2230.0),
    ("qcow2", "off", "writethrough", "threads"): (600.0, 580.0, 640.0),
    ("qcow2", "metadata", "writethrough", "threads"): (3100.0, 2900.0, 3300.0),
}


@pytest.fixture
def block_db(tmp_path: Path) -> Path:
    """One stored block-tier run: five configurations, three rounds each."""
    db = tmp_path / "r.db"
    with Store(db) as st:
        rid = st.begin_run("block", {"accel": "none"}, {})
        for rnd in range(3):
            for (fmt, pre, cache, aio), rounds in CONFIGS.items():
                cfg = {"tier": "block", "bus": "nbd", "fmt": fmt, "prealloc": pre, "cache": cache, "aio": aio,
                       "target": "file"}
                st.add_cell(rid, f"nbd/{fmt}-{pre}/{cache}/{aio}|randwrite-4k", cfg, "randwrite-4k", "ok",
                            {"iops": rounds[rnd], "bw_Bps": rounds[rnd] * 4096}, rep=rnd, accel="none")
        st.finish_run(rid, "complete")
    return db


def _svgs(page: str) -> list[str]:
    return [page[i:page.index("</svg>", i)] for i in (m.start() for m in re.finditer("<svg", page))]


def _bar_values(svg: str) -> list[float]:
    """The value each bar's tooltip states ("… — label: 1.143e+04 [… – …] (95 %, n=3)")."""
    return [float(m.group(1).replace(",", "")) for m in re.finditer(r"<title>[^<]* — [^<]*?: ([-\d.,e+]+)[ <]", svg)]


def test_chart_bars_equal_the_tables_centre(block_db: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    assert cli.main(["report", "1", "--db", str(block_db), "--html", str(out)]) == 0
    page = out.read_text()
    table = page[page.index("Median over rounds, with 95 % interval"):]
    medians = {cfg: float(m.replace(",", "")) for cfg, m in
               re.findall(r"<tr><td>([^<]+)</td><td>randwrite-4k</td><td>3</td><td>([\d,.]+) \[", table)}
    assert len(medians) == len(CONFIGS)
    iops_chart = next(s for s in _svgs(page) if "IOPS" in s)
    bars = _bar_values(iops_chart)
    assert len(bars) == len(CONFIGS)
    for value in bars:  # every bar is one configuration's median, to the tooltip's 4 digits
        assert any(abs(value - m) <= 5e-4 * m for m in medians.values()), (value, medians)
    assert sorted(round(v, -1) for v in bars) == sorted(round(m, -1) for m in medians.values())
    assert "bars: median over rounds" in iops_chart and "bars: mean" not in page


def test_a_bogus_baseline_exits_2_with_a_suggestion(block_db: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.html"
    assert cli.main(["report", "1", "--db", str(block_db), "--html", str(out), "--baseline", "nbd/raw-of/none/native"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "did you mean 'nbd/raw-off/none/native'" in err[0], err
    assert not out.exists()  # nothing half-written
    assert cli.main(["report", "1", "--db", str(block_db), "--html", str(out), "--baseline", "nbd/qcow2-off"]) == 2
    assert "begins 2 configurations" in capsys.readouterr().err
    assert cli.main(["report", "1", "--db", str(block_db), "--html", str(out), "--baseline", "none"]) == 2
    capsys.readouterr()


def test_the_baseline_takes_printed_names_and_their_unambiguous_start(block_db: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    assert cli.main(["report", "1", "--db", str(block_db), "--html", str(out), "--baseline", "nbd/raw"]) == 0
    page = out.read_text()
    assert "Normalised to</b>: nbd/raw-off/none/native = 100 %" in page
    iops = next(s for s in _svgs(page) if "% of nbd/raw-off/none/native" in s)
    assert any(abs(v - 100.0) < 0.05 for v in _bar_values(iops))  # the baseline itself is 100 %


def test_verdict_words_direction_and_no_block_twice(block_db: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r.html"
    assert cli.main(["report", "1", "1", "--db", str(block_db), "--html", str(out)]) == 0
    text = capsys.readouterr().out
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == len(set(lines)), text  # the same run named twice: its verdicts once
    assert "[none]" not in text and "[no guest: block tier]" in text
    raw = next(ln for ln in lines if "cache=none" in ln)
    # raw 8,257 against qcow2+metadata 11,430: raw is slower, whatever the ratio's side of 1
    assert "raw is 1.38× (" in raw and ") slower: tie does not hold" in raw and "faster" not in raw.split(";")[1], raw
    page = out.read_text()
    badges = re.findall(r"class='badge' style='background:[^']+'>([^<]+)</span>", page)
    assert badges and set(badges) <= set(VOCABULARY), badges
    assert "How a verdict is decided" in page  # the legend names the vocabulary
