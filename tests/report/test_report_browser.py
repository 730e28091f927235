"""The HTML report as a person sees it: a real headless Chromium opens it, every chart must decode, the
summary's seed-claims table must be there, no console error; a PNG screenshot is kept for review."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
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


def open_in_chromium(html: Path, out_dir: Path, height: int = 1800) -> tuple[str, str]:
    probe = html.with_name(html.stem + "-probe.html")
    probe.write_text(html.read_text().replace("</body>", PROBE, 1))
    flags = ["--headless=new", "--no-sandbox", "--disable-gpu", f"--window-size=1300,{height}",
             f"--user-data-dir={out_dir / 'chromium-profile'}", "--enable-logging=stderr", "--v=0"]
    dom = subprocess.run([chromium(), *flags, "--virtual-time-budget=3000", "--dump-dom", probe.as_uri()],
                         capture_output=True, text=True, timeout=120)
    shot = out_dir / f"{html.stem}.png"
    subprocess.run([chromium(), *flags, f"--screenshot={shot}", html.as_uri()], capture_output=True, text=True,
                   timeout=120)
    assert shot.is_file() and shot.stat().st_size > 10_000, "no screenshot"
    pdf = out_dir / f"{html.stem}.pdf"  # printed as a reader would print it (the @media print rules apply)
    subprocess.run([chromium(), *flags, "--no-pdf-header-footer", f"--print-to-pdf={pdf}", html.as_uri()],
                   capture_output=True, text=True, timeout=120)
    assert pdf.is_file() and pdf.read_bytes().startswith(b"%PDF") and pdf.stat().st_size > 10_000, "not printed"
    title = re.search(r"<title>(PROBE[^<]*)</title>", dom.stdout)
    assert title, dom.stdout[:500] + dom.stderr[-1000:]
    return title.group(1), dom.stderr


def test_storage_report_in_chromium(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "r.db"
    assert cli.main(["bench", "storage", "--quick", "--image-format", "qcow2", "--prealloc", "off,metadata",
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
                     "--baseline", "qemu-img/qcow2-off/none"]) == 0  # completed: the one name it begins
    assert "% of qemu-img/qcow2-off/none/threads" in (tmp_path / "base.html").read_text()


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


def _clean_log(log: str) -> None:
    assert "Uncaught" not in log and ":CONSOLE" not in log.replace("INFO:CONSOLE", ""), log[-2000:]


def test_network_report_and_compare_in_chromium(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Real datapath-tier runs (netload in namespaces, no QEMU; about 5 s each): bridge, Open vSwitch, and
    bridge again so that its bars carry 95 % whiskers."""
    if os.geteuid() != 0:
        pytest.skip("the datapath tier builds network namespaces: needs root")
    db = tmp_path / "r.db"
    work = Path(tempfile.mkdtemp(prefix="kvr-"))  # short: Open vSwitch's socket paths must fit in 108 bytes
    try:
        for topology in ("bridge", "ovs", "bridge"):
            assert cli.main(["bench", "net", "--tier", "datapath", "--topology", topology, "--tests",
                             "rr1c-1x1--1,str-readx30k--1", "--duration", "1", "--workdir", str(work),
                             "--db", str(db)]) == 0, capsys.readouterr().err
    finally:
        shutil.rmtree(work, ignore_errors=True)
    capsys.readouterr()
    report = tmp_path / "network-report.html"
    assert cli.main(["report", "1", "2", "3", "--db", str(db), "--html", str(report)]) == 0
    text = report.read_text()
    assert text.index("Seed claims, measured here") < text.index("Network: datapath tier (no guest)")
    assert "the Linux bridge performs within 10 % of Open vSwitch" in text and "Which topology won" in text
    assert "accelerator(s): none (no guest)" in text and "(95 %, n=2)" in text  # bridge ran twice: whiskers
    title, log = open_in_chromium(report, tmp_path, height=3000)
    counts = dict(kv.split("=") for kv in title.split()[1:])
    # throughput, tx/s, transaction time, path CPU, client and server CPU per MB
    assert int(counts["svgs"]) == 6 and counts["bad"] == "0" and counts["imgs"] == "0", title
    assert int(counts["claims"]) == 6, title  # header plus seed 002's five claims
    _clean_log(log)

    compare = tmp_path / "network-compare.html"
    assert cli.main(["compare", "1", "2", "--db", str(db), "--html", str(compare)]) == 0
    page = compare.read_text()
    assert "topology bridge → ovs" in page and "<svg" in page and "data:image" not in page
    title, log = open_in_chromium(compare, tmp_path)
    counts = dict(kv.split("=") for kv in title.split()[1:])
    assert counts["svgs"] == "1" and counts["bad"] == "0", title
    assert int(counts["claims"]) >= 5 + 2, title  # the four seed-002 figures, and the bridge-vs-ovs claim
    _clean_log(log)
