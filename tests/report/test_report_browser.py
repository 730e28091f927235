"""The HTML report as a person sees it: a real headless Chromium opens it, every chart must decode, the
summary's seed-claims table must be there, no console error; a PNG screenshot is kept for review."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kvmtune import cli

pytestmark = pytest.mark.integration

# appended to a copy of the report: the page reports what it rendered through its title
PROBE = """<script>
const imgs = [...document.images];
const svgs = [...document.querySelectorAll('svg')];
const bad = imgs.filter(i => !(i.complete && i.naturalWidth > 0)).length
          + svgs.filter(s => s.getBoundingClientRect().width <= 0).length;
document.title = 'PROBE imgs=' + imgs.length + ' svgs=' + svgs.length + ' bad=' + bad
  + ' claims=' + document.querySelectorAll('table.claims tr').length;
</script></body>"""


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("chromium is not installed (scripts/install.sh installs Debian's chromium)")
    return found


def open_in_chromium(html: Path, out_dir: Path) -> tuple[str, str]:
    probe = html.with_name(html.stem + "-probe.html")
    probe.write_text(html.read_text().replace("</body>", PROBE, 1))
    flags = ["--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1300,1800",
             f"--user-data-dir={out_dir / 'chromium-profile'}", "--enable-logging=stderr", "--v=0"]
    dom = subprocess.run([chromium(), *flags, "--virtual-time-budget=3000", "--dump-dom", probe.as_uri()],
                         capture_output=True, text=True, timeout=120)
    shot = out_dir / f"{html.stem}.png"
    subprocess.run([chromium(), *flags, f"--screenshot={shot}", html.as_uri()], capture_output=True, text=True,
                   timeout=120)
    assert shot.is_file() and shot.stat().st_size > 10_000, "no screenshot"
    title = re.search(r"<title>(PROBE[^<]*)</title>", dom.stdout)
    assert title, dom.stdout[:500] + dom.stderr[-1000:]
    return title.group(1), dom.stderr


def test_storage_report_in_chromium(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "r.db"
    assert cli.main(["bench", "storage", "--quick", "--format", "qcow2", "--prealloc", "off,metadata",
                     "--cache", "none,writethrough", "--aio", "threads", "--disk-size", "64",
                     "--workdir", str(tmp_path / "w"), "--db", str(db)]) == 0
    capsys.readouterr()
    html = tmp_path / "storage.html"
    assert cli.main(["report", "1", "--db", str(db), "--html", str(html)]) == 0
    text = html.read_text()
    assert text.index("Seed claims, measured here") < text.index("<h2>Runs</h2>")  # the summary comes first
    assert "http://" not in text.replace("http://www.w3.org/2000/svg", "")  # nothing fetched
    assert "Accelerator: none" not in text and "quick tier" in text
    title, log = open_in_chromium(html, tmp_path)
    counts = dict(kv.split("=") for kv in title.split()[1:])
    assert int(counts["svgs"]) >= 2 and counts["bad"] == "0", title
    assert int(counts["claims"]) >= 2, title  # header plus at least one claim
    assert "Uncaught" not in log and ":CONSOLE" not in log.replace("INFO:CONSOLE", ""), log[-2000:]
    # normalised to a baseline cell: the axis says so
    assert cli.main(["report", "1", "--db", str(db), "--html", str(tmp_path / "base.html"),
                     "--baseline", "none"]) == 0
    assert "% of none" in (tmp_path / "base.html").read_text()


def test_verify_report_in_chromium(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "r.db"
    assert cli.main(["verify", "--examples", "--only", "KVM-STO-002", "--repeat", "2", "--seconds", "0.3",
                     "--size", "64M", "--db", str(db), "--workdir", str(tmp_path / "w")]) == 0
    capsys.readouterr()
    html = tmp_path / "verify.html"
    assert cli.main(["report", "1", "--db", str(db), "--html", str(html)]) == 0
    text = html.read_text()
    assert "<h2>Verified fixes</h2>" in text and "KVM-STO-002" in text and "ratio B/A [95 %]" in text
    title, log = open_in_chromium(html, tmp_path)
    counts = dict(kv.split("=") for kv in title.split()[1:])
    assert counts["svgs"] == "1" and counts["bad"] == "0" and int(counts["claims"]) == 2, title
    assert "Uncaught" not in log, log[-2000:]
