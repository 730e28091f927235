"""Fleet pieces without a fleet: Prometheus audit output, the merged report, and -o onto devices."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from kvmtune import cli

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"


def audit_json(tmp: Path, name: str, root: str, capsys: pytest.CaptureFixture[str]) -> Path:
    out = tmp / f"{name}.json"
    assert cli.main(["audit", "--host", "--root", str(FIXTURES / root), "--format", "json", "-o", str(out)]) in (0, 1)
    capsys.readouterr()
    doc = json.loads(out.read_text())
    doc["host"] = name  # what each fleet host's own hostname would say
    out.write_text(json.dumps(doc))
    return out


def test_audit_prometheus_passes_promtool(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["audit", "--host", "--root", str(FIXTURES / "rhel6-old"), "--format", "prometheus"]) in (0, 1)
    text = capsys.readouterr().out
    assert 'kvmtune_audit_findings{host="rhel6-old",rule="KVM-HST-' in text
    assert 'kvmtune_audit_findings_by_severity{host="rhel6-old",severity="critical"}' in text
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed (Debian: prometheus); scripts/install.sh installs it")
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_json_stream_matches_the_rendered_document(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "a.json"
    assert cli.main(["audit", "--examples", "--format", "json", "-o", str(out)]) in (0, 1)
    capsys.readouterr()
    streamed = json.loads(out.read_text())
    cli.main(["audit", "--examples", "--format", "json"])
    printed = json.loads(capsys.readouterr().out)
    for doc in (streamed, printed):
        del doc["generated"]
    assert streamed == printed and len(streamed["findings"]) == streamed["summary"]["findings"] > 0


def test_output_onto_a_device_or_fifo_writes_into_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`-o /dev/null` as root once replaced /dev/null by a regular file (rename over the device node)."""
    null = tmp_path / "null"
    os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    for fmt in ("json", "text", "prometheus"):
        cli.main(["audit", "--examples", "--format", fmt, "-o", str(null)])
        assert stat.S_ISCHR(os.stat(null).st_mode), fmt
    assert cli.main(["sample", "--root", str(tmp_path), "--duration", "0.1", "--interval", "0.1",
                     "--format", "prometheus", "-o", str(null)]) == 0
    assert stat.S_ISCHR(os.stat(null).st_mode)
    assert not [p for p in tmp_path.iterdir() if p.name != "null"]  # no temp file left beside it


def test_fleet_report_merges_hosts_and_tracks_changes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hosts = tmp_path / "collected"
    hosts.mkdir()
    paths = {n: audit_json(hosts, n, r, capsys) for n, r in
             (("hv1", "rhel6-old"), ("hv2", "nvme-modern"), ("hv3", "ksm-overcommit"))}
    (hosts / "hv4.json").write_text(json.dumps({"kind": "kvmtune-fleet-status", "host": "hv4",
                                                "problem": "unreachable: \x1b[2Jno route"}))
    (hosts / "junk.json").write_text("{not json")
    db = tmp_path / "r.db"
    assert cli.main(["report", str(hosts), "--db", str(db), "--html", str(tmp_path / "f.html")]) == 2
    captured = capsys.readouterr()
    assert "junk.json: not JSON" in captured.err
    out = captured.out
    assert out.startswith("fleet: 4 host(s), 3 audited, 1 failed, 1 file(s) rejected (their hosts are not in this "
                          "report); stored as collection 1\n")
    assert f"  REJECTED {hosts / 'junk.json'}: not JSON" in out  # in the report itself, not only on stderr
    assert "FAILED hv4: unreachable: \\x1b[2Jno route" in out  # the escape sequence is shown, not obeyed
    docs = {n: json.loads(p.read_text()) for n, p in paths.items()}
    weights = {"critical": 100, "high": 10, "medium": 3, "low": 1, "info": 0}
    scores = {n: sum(weights[f["severity"]] for f in d["findings"]) for n, d in docs.items()}
    ranked = [line.split()[0] for line in out.split("Worst hosts")[1].splitlines()[2:5]]
    assert ranked == sorted(scores, key=lambda n: (-scores[n], n))
    rule_counts: dict[str, set[str]] = {}
    for n, d in docs.items():
        for f in d["findings"]:
            rule_counts.setdefault(f["rule"], set()).add(n)
    busiest = max(rule_counts, key=lambda r: len(rule_counts[r]))
    assert any(line.split()[:1] == [busiest] and line.split()[3] == str(len(rule_counts[busiest]))
               for line in out.splitlines())
    html = (tmp_path / "f.html").read_text()
    assert "<svg" in html and "\x1b" not in html and "hv4" in html
    # next collection: one host fixed one finding
    fixed = next(n for n in sorted(docs) if docs[n]["findings"])
    gone = docs[fixed]["findings"].pop()
    paths[fixed].write_text(json.dumps(docs[fixed]))
    (hosts / "junk.json").unlink()
    assert cli.main(["report", str(hosts), "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "Since collection 1" in out and "0 new, 1 resolved" in out
    assert f"- {fixed} {gone['rule']}" in out
    assert "Trend (findings per collection): #1:" in out and "#2:" in out


def test_benchmark_figures_as_prometheus_with_units(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kvmtune.lab.store import Store

    db = tmp_path / "r.db"
    with Store(db) as st:
        rid = st.begin_run("storage", {"accel": "none"}, {})
        for rep, iops in enumerate((1000.0, 1200.0)):
            st.add_cell(rid, "block/qcow2-off/none/native|randwrite-4k", {"tier": "block", "fmt": "qcow2"},
                        "randwrite-4k", "ok", {"iops": iops, "lat_mean_us": 800.0, "made_up": 1.0}, rep=rep, accel=None)
        st.finish_run(rid, "complete")
    assert cli.main(["results", "show", "1", "--db", str(db), "--format", "prometheus"]) == 0
    text = capsys.readouterr().out
    assert ('kvmtune_benchmark_value{run="1",kind="storage",tier="block",configuration="block/qcow2-off/none/native",'
            'workload="randwrite-4k",metric="iops",unit="IO/s",better="higher"} 1100') in text
    assert 'metric="lat_mean_us",unit="µs",better="lower"} 800' in text
    assert "made_up" not in text  # not in the catalogue: no unit, not exported
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed (Debian: prometheus); scripts/install.sh installs it")
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_report_reads_a_digit_named_file_among_files_by_its_own_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """RUN|FILE is typed by argparse (a run id is a number); among files, `007` is still the file named 007."""
    audit_json(tmp_path, "hv1", "rhel6-old", capsys).rename(tmp_path / "007")
    other = audit_json(tmp_path, "hv2", "nvme-modern", capsys)
    monkeypatch.chdir(tmp_path)
    assert cli.main(["report", "007", str(other), "--db", str(tmp_path / "r.db"), "--no-save"]) == 0
    assert capsys.readouterr().out.startswith("fleet: 2 host(s), 2 audited")
    assert cli.main(["report", "007", "--db", str(tmp_path / "none.db")]) == 2  # digits alone: run 7, no database
    assert "no such results database" in capsys.readouterr().err
