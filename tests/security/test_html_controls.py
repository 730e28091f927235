"""HTML pages show control characters from the data as the terminal does (\\x1b, \\x07, \\u202e), never raw:
html.escape alone leaves them in the page, where a bidi override reorders what the reader sees."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvmtune import cli
from kvmtune.fleet.collect import read_collection
from kvmtune.fleet.report import build, render_html
from kvmtune.lab.store import Store
from kvmtune.textsafe import html_safe

FIXTURE = Path(__file__).parents[1] / "fixtures" / "bench" / "net_runs_tcg.json"
HOSTILE = "evil\x1b]0;owned\x07\u202eenil"
SHOWN = "evil\\x1b]0;owned\\x07\\u202eenil"
RAW = ("\x1b", "\x07", "\u202e", "\x9b", "\u2028")


def _clean(page: str) -> None:
    assert not [c for c in RAW if c in page], [hex(ord(c)) for c in RAW if c in page]
    assert SHOWN in page


@pytest.fixture
def hostile_db(tmp_path: Path) -> Path:
    """The real network runs, with a hostile CPU model, QEMU version, run note and (run 1) topology name."""
    db = tmp_path / "r.db"
    doc = json.loads(FIXTURE.read_text())
    with Store(db) as st:
        for n, run in enumerate(doc["runs"], 1):
            env = {**run["env"], "cpu_model": HOSTILE, "qemu": HOSTILE, "host_kernel": HOSTILE}
            rid = st.begin_run(run["kind"], env, run["args"])
            for c in run["cells"]:
                config = {**c["config"], "topology": HOSTILE} if n == 1 else c["config"]
                st.add_cell(rid, c["key"], config, c["workload"], c["status"], c["metrics"], rep=c["rep"],
                            accel=c["accel"], duration_s=c["duration_s"])
            st.finish_run(rid, run["status"], note=HOSTILE)
    return db


def test_report_page_shows_controls_escaped(hostile_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report.html"
    assert cli.main(["report", "1", "2", "3", "4", "5", "--db", str(hostile_db), "--html", str(out)]) == 0
    capsys.readouterr()
    page = out.read_text()
    _clean(page)
    assert page.count(SHOWN) >= 3  # the summary's host line, the runs table, the charts' labels


def test_compare_page_shows_controls_escaped(hostile_db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cmp.html"
    assert cli.main(["compare", "1", "2", "--db", str(hostile_db), "--html", str(out)]) == 0
    capsys.readouterr()
    _clean(out.read_text())


def test_fleet_page_shows_controls_escaped(tmp_path: Path) -> None:
    """Already escaped this way before the shared helper; kept here so all HTML pages are held to one rule."""
    hosts = tmp_path / "collected"
    hosts.mkdir()
    (hosts / "h.json").write_text(json.dumps({"kind": "kvmtune-fleet-status", "host": HOSTILE, "problem": HOSTILE}))
    found, errors = read_collection([str(hosts / "h.json")])  # named on the command line: its host claim is shown
    assert not errors
    _clean(render_html(build(found, None, [], None)))


def test_html_safe() -> None:
    assert html_safe("<a href='x'>\x1b[2J\x9b\u2028\u202e&</a>") == (
        "&lt;a href=&#x27;x&#x27;&gt;\\x1b[2J\\x9b\\u2028\\u202e&amp;&lt;/a&gt;")
