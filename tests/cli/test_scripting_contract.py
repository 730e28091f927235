"""The scripting contract of every command: bad input is one line on stderr and exit 2, never a
traceback; a CI gate cannot pass on a typo; files are written whatever happens to stdout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvmtune.cli import main
from kvmtune.lab.store import Store

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "src" / "kvmtune" / "examples"
LEGACY = EXAMPLES / "web01-legacy.xml"


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------- one line, exit 2, never a traceback

MISSING = "/nonexistent-kvmtune-dir"
BAD_INPUTS = [
    ["audit", "--examples", "-o", f"{MISSING}/out.txt"],
    ["audit", "--examples", "--fail-on", "bogus"],
    ["audit", "--examples", "--format", "bogus"],
    ["audit", "--root", MISSING],
    ["audit", "--examples", "--only", "KVM-XXX-999"],
    ["rules", "explain", "KVM-XXX-999"],
    ["fix", str(LEGACY), "--only", "bogus"],
    ["fix", str(LEGACY), "--root", MISSING],
    ["fix", str(LEGACY), "--apply", "--yes", "--journal-dir", "{file}/journal"],
    ["undo", "no-such-journal"],
    ["undo", "--list", "--root", MISSING],
    ["ksm", "--root", MISSING],
    ["capture-host", "{file}/tree"],
    ["results", "list", "--db", f"{MISSING}/results.db"],
    ["results", "show", "1", "--db", f"{MISSING}/results.db"],
    ["compare", "1", "2", "--db", f"{MISSING}/results.db"],
    ["report", "1", "--db", f"{MISSING}/results.db", "--html", "{tmp}/r.html"],
    ["bench", "storage", "--quick", "--runtime", "-1", "--db", "{tmp}/r.db"],
    ["bench", "storage", "--quick", "--workdir", "{file}/work", "--db", "{tmp}/r.db"],
    ["bench", "net", "--topology", "bogus", "--db", "{tmp}/r.db"],
    ["guest", "accel", "--timeout", "abc"],
    ["net", "cleanup", "--bogus"],
    ["verify", "--examples", "--only", "bogus"],
    ["verify", "--examples", "--root", MISSING],
    ["verify", "--examples", "--threshold", "abc"],
    ["top", "--root", MISSING, "--count", "1", "--plain"],
    ["top", "--interval", "-1", "--count", "1", "--plain", "--no-libvirt"],
    ["sample", "--no-libvirt", "--duration", "1", "--interval", "1", "-o", f"{MISSING}/x.json"],
    ["sample", "--duration", "abc"],
    ["capacity", "--disk-tps", "100", "--from", f"{MISSING}/sample.json"],
    ["capacity", "--disk-tps", "-5", "--no-libvirt", "--duration", "1", "--interval", "1"],
    ["why", "no-such-guest-anywhere", "--no-libvirt", "--seconds", "1"],
    ["why", "web", "--seconds", "0"],
    ["canary", "run", "--quick", "--dir", MISSING, "--db", "{tmp}/r.db"],
    ["canary", "run", "--quick", "--db", "{file}"],
    ["canary", "baseline", "--reset", "--reason", " ", "--db", "{tmp}/r.db"],
    ["capture", "no-such-guest-anywhere", "--no-libvirt", "--seconds", "1", "-o", "{tmp}/w.json",
     "--workdir", "{tmp}/work"],
    ["capture", "--show", "{file}"],
    ["capture", "web", "--max-events", "0", "-o", "{tmp}/w.json"],
    ["doctor", "--format", "bogus"],
    ["completion", "tcsh"],  # bash, zsh and fish are the shells it knows
    ["man", "--bogus"],
    ["config", "check", "{file}"],
    ["config", "show", "--config", f"{MISSING}/kvmtune.toml"],
    ["audit", "--examples", "--config", "{file}"],
    ["audit", "--examples", "--new-since", "{file}"],
]


def test_every_command_is_fed_bad_input_here() -> None:
    from kvmtune.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    commands = set(sub.choices)  # type: ignore[arg-type]
    assert commands - {argv[0] for argv in BAD_INPUTS} == set()


@pytest.mark.parametrize("argv", BAD_INPUTS, ids=lambda a: " ".join(a)[:60])
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVMTUNE_JOURNAL_DIR", str(tmp_path / "journals"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    plain_file = tmp_path / "a-file"
    plain_file.write_text("not a directory\n")
    argv = [a.format(file=plain_file, tmp=tmp_path) for a in argv]
    code, _out, err = run_cli(argv, capsys)
    assert code == 2, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("kvmtune: ")
    assert not Path(MISSING).exists()


def test_read_only_commands_do_not_create_a_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "typo" / "x.db"
    for argv in (["results", "list"], ["results", "show", "1"], ["compare", "1", "2"], ["report", "1"]):
        code, _out, err = run_cli([*argv, "--db", str(db)], capsys)
        assert code == 2 and "no such results database" in err
    assert not (tmp_path / "typo").exists()


# ---------------------------------------------------------------- a typo never turns a gate green

@pytest.mark.parametrize("command", ["audit", "fix"])
@pytest.mark.parametrize("option", [["--only", "KVM-XXX-999"], ["--skip", "bogus"], ["--only", "disk-cahce"],
                                    ["--only", "KVM-STO-002,KVM-STO-9999"]])
def test_unknown_rule_keys_exit_2_with_did_you_mean(
    command: str, option: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli([command, str(LEGACY), *option, "--fail-on", "critical"] if command == "audit"
                             else [command, str(LEGACY), *option], capsys)
    assert code == 2
    assert "did you mean" in err and option[1].split(",")[-1] in err
    assert out == ""


def test_misspelt_slug_suggests_the_right_one(capsys: pytest.CaptureFixture[str]) -> None:
    _code, _out, err = run_cli(["audit", str(LEGACY), "--only", "disk-cahce-unsafe"], capsys)
    assert "disk-cache-unsafe" in err


def test_slug_prefix_selects_the_rules_the_help_promises(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _err = run_cli(["audit", str(EXAMPLES), "--no-images", "--format", "json", "--only", "disk-cache"], capsys)
    rules = {f["rule"] for f in json.loads(out)["findings"]}
    assert rules and rules <= {"KVM-STO-002", "KVM-STO-003", "KVM-STO-004", "KVM-STO-005"}
    assert code == 0
    code, out, _err = run_cli(["audit", str(EXAMPLES), "--no-images", "--format", "json", "--skip", "disk-cache,KVM-SEC"],
                              capsys)
    rules = {f["rule"] for f in json.loads(out)["findings"]}
    assert rules and not rules & {"KVM-STO-002", "KVM-STO-003", "KVM-STO-004", "KVM-STO-005", "KVM-SEC-001"}


# ---------------------------------------------------------------- errors once

def test_text_mode_prints_an_input_error_once_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "vm.xml"
    code, out, err = run_cli(["audit", str(missing)], capsys)
    assert code == 2
    assert out == ""
    assert err == f"kvmtune: {missing}: no such file\n"
    code, out, err = run_cli(["audit", str(missing), str(LEGACY), "--no-images"], capsys)
    assert code == 2
    assert "no such file" not in out and "web01-legacy" in out  # the report of what could be read
    assert err.count("no such file") == 1


def test_json_keeps_its_errors_array(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "vm.xml"
    code, out, _err = run_cli(["audit", str(missing), "--format", "json"], capsys)
    assert code == 2
    assert json.loads(out)["errors"] == [f"{missing}: no such file"]


# ---------------------------------------------------------------- a domain XML after --images

def test_domain_xml_after_images_is_audited_as_a_domain(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    image = tmp_path / "a.raw"
    image.write_bytes(b"\0" * 1024 * 1024)
    vm = tmp_path / "vm.xml"
    vm.write_bytes(LEGACY.read_bytes())
    code, out, err = run_cli(["audit", "--images", str(image), str(vm), "--format", "json"], capsys)
    doc = json.loads(out)
    assert code == 0, err
    assert any(f["target"]["domain"] == "web01-legacy" for f in doc["findings"])
    assert any("audited as a domain" in line for line in doc["looked_at"])
    assert not any(str(vm) in e for e in doc["errors"])

    code, out, err = run_cli(["fix", "--images", str(image), str(vm)], capsys)
    assert code == 0, err
    assert "fixed as a domain definition" in out and f"rewrite {vm}" in out


# ---------------------------------------------------------------- files whatever happens to stdout

def test_report_html_is_written_when_stdout_closes_early(tmp_path: Path) -> None:
    db = tmp_path / "results.db"
    with Store(db) as st:
        run_id = st.begin_run("storage", {"accel": "tcg"}, {}, preset="quick")
        for rep, iops in enumerate((1000.0, 1010.0, 990.0)):
            st.add_cell(run_id, "format=raw|randread", {"format": "raw"}, "randread", "ok", {"iops": iops},
                        rep=rep, accel="tcg")
        st.finish_run(run_id, "done")
    html = tmp_path / "r.html"
    # stdout is a pipe whose reader is already gone (`| head -1` after its line), unbuffered so
    # the first print meets it at once
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", "kvmtune", "report", str(run_id), "--db", str(db), "--html", str(html)],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    finally:
        os.close(write_end)
    assert html.is_file() and "<html" in html.read_text().lower(), proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr


def test_a_runs_note_is_shown_with_what_happened_after_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "results.db"
    with Store(db) as st:
        run_id = st.begin_run("storage", {"accel": "tcg"}, {})
        st.finish_run(run_id, "partial", note="after BIOS update; interrupted")
    code, out, _err = run_cli(["results", "list", "--db", str(db)], capsys)
    assert code == 0 and out.splitlines()[1].endswith("after BIOS update; interrupted")
    code, out, _err = run_cli(["results", "show", str(run_id), "--db", str(db)], capsys)
    assert "note: after BIOS update; interrupted" in out
    code, out, _err = run_cli(["results", "show", str(run_id), "--db", str(db), "--json"], capsys)
    assert json.loads(out)["run"]["note"] == "after BIOS update; interrupted"


def test_a_refused_bench_leaves_no_scratch_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plain_file = tmp_path / "a-file"
    plain_file.write_text("not a directory\n")
    workdir = tmp_path / "work"
    code, _out, err = run_cli(["bench", "storage", "--quick", "--workdir", str(workdir),
                               "--db", str(plain_file / "r.db")], capsys)
    assert code == 2 and len(err.splitlines()) == 1
    assert not list(workdir.glob("scratch-*"))
