"""`kvmtune doctor`, shell completion, the man page, rules --format json and NO_COLOR."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kvmtune import cli

REPO = Path(__file__).resolve().parents[2]
KVMTUNE = str(REPO / ".venv" / "bin" / "kvmtune")


def bash_completion(tmp_path: Path) -> tuple[str, Callable[..., list[str]]]:
    """``kvmtune completion bash``'s script (kept in ``tmp_path``), and what bash completes ``kvmtune WORDS…`` to with
    it."""
    script = subprocess.run([KVMTUNE, "completion", "bash"], capture_output=True, text=True, check=True).stdout
    (tmp_path / "c.bash").write_text(script)

    def complete(*words: str) -> list[str]:
        words_list = " ".join(f"'{w}'" for w in words)
        probe = (f"source {tmp_path / 'c.bash'}; COMP_WORDS=(kvmtune {words_list}); "
                 f"COMP_CWORD={len(words)}; _kvmtune; printf '%s\\n' \"${{COMPREPLY[@]}}\"")
        return subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True).stdout.split()

    return script, complete


def fish_completion(tmp_path: Path, fish: str = "fish") -> Callable[[str], list[str]]:
    """What ``fish`` completes a command line to with ``kvmtune completion fish``'s script (kept in ``tmp_path``)."""
    script = subprocess.run([KVMTUNE, "completion", "fish"], capture_output=True, text=True, check=True).stdout
    (tmp_path / "kvmtune.fish").write_text(script)

    def complete(line: str) -> list[str]:
        probe = f"source {tmp_path / 'kvmtune.fish'}; complete -C '{line}'"
        proc = subprocess.run([fish, "--no-config", "-c", probe], capture_output=True, text=True, check=True)
        return [row.split("\t")[0] for row in proc.stdout.splitlines()]

    return complete


def test_doctor_reads_the_cached_accelerator_verdict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    release = Path("/proc/sys/kernel/osrelease").read_text().strip()
    (tmp_path / "accel.json").write_text(json.dumps({
        "key": f"guest|qemu|{release}", "at": time.time() - 3600,
        "choice": {"accel": "tcg", "reason": "the probe guest did not boot under KVM \x1b[2J"}}))
    assert cli.main(["doctor", "--workdir", str(tmp_path), "--format", "json"]) == 0
    checks = {c["what"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    kvm = checks["KVM boots a guest"]
    assert kvm["ok"] is False and "tcg" in kvm["detail"] and "\x1b" not in kvm["detail"]
    assert checks["qemu-img"]["ok"] is (shutil.which("qemu-img") is not None)
    assert checks["fio engine nbd"]["ok"] is True  # Debian's fio is built with the nbd engine
    assert "GiB free" in checks["free space in the work directory"]["detail"]
    assert cli.main(["doctor", "--workdir", str(tmp_path / "none")]) == 0
    text = capsys.readouterr().out
    assert "??   KVM boots a guest: not probed yet (run `kvmtune guest accel`)" in text


def test_bash_completion_completes_commands_options_and_choices(tmp_path: Path) -> None:
    _, complete = bash_completion(tmp_path)

    assert "audit" in complete("au") and "doctor" in complete("do")
    assert complete("audit", "--fail") == ["--fail-on"]
    assert sorted(complete("audit", "--format", "")) == ["json", "prometheus", "sarif", "text"]
    assert "storage" in complete("bench", "")


def test_zsh_completion_parses() -> None:
    script = subprocess.run([KVMTUNE, "completion", "zsh"], capture_output=True, text=True, check=True).stdout
    zsh = shutil.which("zsh")
    if zsh is None:
        pytest.fail("zsh is not installed (scripts/install.sh installs it)")
    check = subprocess.run([zsh, "-n"], input=script, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    assert "    top) _arguments" in script and "'--format[" in script


def test_fish_completion_completes_commands_nested_actions_and_choices(tmp_path: Path) -> None:
    fish = shutil.which("fish")
    if fish is None:
        pytest.fail("fish is not installed (scripts/install.sh installs it)")
    complete = fish_completion(tmp_path, fish)

    assert complete("kvmtune au") == ["audit"]
    assert set(complete("kvmtune audit --format ")) == {"text", "json", "sarif", "prometheus"}
    assert "storage" in complete("kvmtune bench ") and "--cache" in complete("kvmtune bench storage --c")
    assert "--cache" not in complete("kvmtune audit --c")


def test_man_page_renders_without_warnings() -> None:
    page = subprocess.run([KVMTUNE, "man"], capture_output=True, text=True, check=True).stdout
    render = subprocess.run(["groff", "-man", "-Tutf8", "-ww"], input=page, capture_output=True, text=True)
    assert render.returncode == 0 and render.stderr == "", render.stderr
    for command in ("kvmtune audit", "kvmtune fix", "kvmtune top", "kvmtune doctor"):
        assert f".SS {command}" in page.replace("\\-", "-")
    assert "fail-on" in render.stdout


def test_rules_list_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["rules", "list", "--format", "json", "--topic", "disk-cache"]) == 0
    rules = json.loads(capsys.readouterr().out)["rules"]
    assert rules and {r["topic"] for r in rules} == {"disk-cache"}
    assert all(r["id"].startswith("KVM-STO-") for r in rules)


def test_no_color_turns_automatic_colour_off() -> None:
    """In a terminal (script(1) gives one), findings are coloured unless NO_COLOR is set."""
    def run(env: dict[str, str]) -> str:
        cmd = f"{KVMTUNE} audit --examples --only KVM-STO-002"
        return subprocess.run(["script", "-qec", cmd, "/dev/null"], capture_output=True, text=True,
                              env={**os.environ, **env}).stdout

    assert "\x1b[" in run({})
    assert "\x1b[" not in run({"NO_COLOR": "1"})


def _commands(parser: argparse.ArgumentParser, path: str = "kvmtune") -> list[tuple[str, argparse.ArgumentParser]]:
    """Every command and nested action (``kvmtune bench storage``) with its parser, depth first."""
    out: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                out += [(f"{path} {name}", child), *_commands(child, f"{path} {name}")]
    return out


def _shown_options(parser: argparse.ArgumentParser) -> list[str]:
    return [o for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS
            for o in a.option_strings if o not in ("-h", "--help")]


def test_man_page_lists_every_command_action_and_option(capsys: pytest.CaptureFixture[str]) -> None:
    """The man page reads the parser: each command and nested action has its section with all its options."""
    assert cli.main(["man"]) == 0
    page = capsys.readouterr().out.replace("\\-", "-")
    sections = page.split("\n.SS ")[1:]
    by_title = {s.split("\n", 1)[0]: s for s in sections}
    commands = _commands(cli.build_parser())
    assert {"kvmtune bench storage", "kvmtune results show", "kvmtune net cleanup"} <= {p for p, _ in commands}
    for path, parser in commands:
        assert path in by_title, f"no section for {path}"
        missing = [o for o in _shown_options(parser) if f"\\fB{o}\\fR" not in by_title[path]]
        assert missing == [], f"{path}: {missing}"


def test_completion_completes_nested_actions_and_their_options(tmp_path: Path) -> None:
    script, complete = bash_completion(tmp_path)

    assert complete("bench", "st") == ["storage"]
    assert complete("bench", "storage", "--image") == ["--image-format"]
    assert complete("results", "show", "--for") == ["--format"]
    assert sorted(complete("bench", "net", "--tier", "")) == ["auto", "datapath", "guest"]
    assert sorted(complete("results", "show", "--format", "")) == ["json", "prometheus", "text"]
    for path, parser in _commands(cli.build_parser()):
        if not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions):
            missing = [o for o in _shown_options(parser) if f" {o} " not in script and f"'{o} " not in script]
            assert missing == [], f"{path}: {missing}"
    zsh = subprocess.run([KVMTUNE, "completion", "zsh"], capture_output=True, text=True, check=True).stdout
    assert "storage) _arguments" in zsh and "'--image-format[" in zsh and "compadd storage net" in zsh


def test_man_page_is_written_for_its_readers(capsys: pytest.CaptureFixture[str]) -> None:
    """NAME, a SYNOPSIS line per command and action, FILES, ENVIRONMENT, EXIT STATUS with 3, every settings key and
    waiver key, EXAMPLES (issue 46 item 5)."""
    from kvmtune.audit.settings import KEYS, WAIVER_KEYS

    assert cli.main(["man"]) == 0
    page = capsys.readouterr().out
    sections = {s.split("\n", 1)[0]: s for s in page.split("\n.SH ")[1:]}
    assert list(sections) == ["NAME", "SYNOPSIS", "DESCRIPTION", "COMMANDS", "SETTINGS", "WAIVERS", "FILES",
                              "ENVIRONMENT", "EXIT STATUS", "EXAMPLES", "SEE ALSO"]
    plain = {k: v.replace("\\-", "-").replace("\\fB", "").replace("\\fR", "").replace("\\fI", "") for k, v in sections.items()}
    leaves = [p for p, parser in _commands(cli.build_parser()) if not any(q.startswith(p + " ") for q, _ in
                                                                        _commands(cli.build_parser()))]
    synopsis = plain["SYNOPSIS"].splitlines()
    for path in leaves:
        assert any(line.startswith(path + " [options]") for line in synopsis), path
    assert "kvmtune rules explain [options] ID" in synopsis and "kvmtune config check [options] FILE" in synopsis
    for path in ("/etc/kvmtune/kvmtune.toml", "/etc/default/kvmtune", "/var/lib/kvmtune", "kvmtune-audit.timer",
                 "kvmtune-sample.timer", "/var/lib/prometheus/node-exporter/kvmtune.prom",
                 "/var/lib/prometheus/node-exporter/kvmtune-live.prom", "/usr/share/doc/kvmtune"):
        assert path in plain["FILES"], path
    for var in ("KVMTUNE_CONFIG", "KVMTUNE_JOURNAL_DIR", "NO_COLOR"):
        assert f".TP\n{var}\n" in plain["ENVIRONMENT"], var
    exit_status = plain["EXIT STATUS"]
    for code in ("0", "1", "2", "3", "130"):
        assert f".TP\n{code}\n" in exit_status, code
    assert "fix --apply stopped" in exit_status and "kvmtune undo ID" in exit_status
    for key in KEYS:
        table, _, name = key.name.rpartition(".")
        assert f".TP\n{f'[{table}] ' if table else ''}{name} (default " in plain["SETTINGS"], key.name
        assert key.help in plain["SETTINGS"], key.name
    for key in WAIVER_KEYS:
        assert f".TP\n{key}\n" in plain["WAIVERS"], key
    assert "[[waiver]]" in plain["WAIVERS"] and "reason = " in plain["WAIVERS"]
    assert plain["EXAMPLES"].count(".TP") >= 10
    render = subprocess.run(["groff", "-man", "-Tutf8", "-ww"], input=page, capture_output=True, text=True)
    assert render.returncode == 0 and render.stderr == "", render.stderr


def test_rule_ids_complete_in_bash_zsh_and_fish(tmp_path: Path) -> None:
    """Issue 46 item 7: --only/--skip of audit, fix and verify, and `rules explain`, complete to rule ids."""
    from kvmtune.audit.rule import all_rules

    ids = sorted(r.id for r in all_rules())
    sto = [i for i in ids if i.startswith("KVM-STO-00")]
    _, bash_complete = bash_completion(tmp_path)

    assert bash_complete("rules", "explain", "KVM-STO-00") == sto
    for command in ("audit", "fix", "verify"):
        assert bash_complete(command, "--only", "KVM-STO-00") == sto, command
        assert bash_complete(command, "--skip", "KVM-STO-00") == sto, command
    zsh = subprocess.run([KVMTUNE, "completion", "zsh"], capture_output=True, text=True, check=True).stdout
    assert f"'*:rule:({' '.join(ids)})'" in zsh and "'--only[" in zsh and f":RULES:({' '.join(ids)})" in zsh
    assert subprocess.run(["zsh", "-n"], input=zsh, capture_output=True, text=True).returncode == 0
    fish_complete = fish_completion(tmp_path)

    assert fish_complete("kvmtune rules explain KVM-STO-00") == sto
    assert fish_complete("kvmtune audit --only KVM-STO-00") == sto
