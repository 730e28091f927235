"""Issue 33, the remaining parts: verify's band and budgets and the results database come from the settings
file (the command line still wins), every command with ``--db`` reads the file's ``db`` through one helper,
and ``config show`` names the new keys with their cited defaults."""

from __future__ import annotations

import argparse
import json
import sqlite3
from pathlib import Path

import pytest

from cli_child import kvmtune
from kvmtune.cli import build_parser


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o644)
    return path


def stored_args(db: Path) -> list[dict[str, object]]:
    with sqlite3.connect(db) as conn:
        return [json.loads(row[0]) for row in conn.execute("SELECT args FROM runs ORDER BY id")]


def test_verify_takes_its_band_budgets_and_database_from_the_settings(tmp_path: Path) -> None:
    db = tmp_path / "site" / "results.db"
    config = write(tmp_path / "k.toml", f'db = "{db}"\n\n[verify]\nthreshold = 7\nfinding_budget = 2\nbudget = 1\n')
    argv = ["verify", "--examples", "--only", "KVM-STO-002", "--format", "json", "--workdir", str(tmp_path / "w"),
            "--config", str(config)]
    done = kvmtune(*argv, home=tmp_path)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["threshold_pct"] == 7.0  # the band from the file
    # a 1 s budget from the file leaves no room for the experiment (about 9 s): skipped, nothing measured
    assert [r["skipped_for_budget"] for r in report["results"]] == [True]
    assert db.exists() and not (tmp_path / "data" / "kvmtune" / "results.db").exists()  # the file's database
    first = stored_args(db)[0]
    assert (first["threshold"], first["finding_budget"], first["budget"], first["db"]) == (7.0, 2.0, 1.0, str(db))
    assert "settings" not in first
    # the command line wins over the file, option by option
    done = kvmtune(*argv, "--threshold", "3", "--finding-budget", "4", home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["threshold_pct"] == 3.0
    second = stored_args(db)[1]
    assert (second["threshold"], second["finding_budget"], second["budget"]) == (3.0, 4.0, 1.0)
    other = tmp_path / "other.db"
    assert kvmtune(*argv, "--db", str(other), home=tmp_path).returncode == 0
    assert len(stored_args(db)) == 2 and len(stored_args(other)) == 1


def test_without_a_settings_file_verify_keeps_its_cited_defaults(tmp_path: Path) -> None:
    done = kvmtune("verify", "--examples", "--only", "KVM-STO-002", "--budget", "1", "--format", "json",
                   "--workdir", str(tmp_path / "w"), "--no-config", home=tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["threshold_pct"] == 5.0
    args = stored_args(tmp_path / "data" / "kvmtune" / "results.db")[0]
    assert (args["threshold"], args["finding_budget"]) == (5.0, 30.0)


def test_the_read_commands_open_the_database_the_settings_name(tmp_path: Path) -> None:
    db = tmp_path / "site" / "results.db"
    config = write(tmp_path / "k.toml", f'db = "{db}"\n')
    assert kvmtune("verify", "--examples", "--only", "KVM-STO-002", "--budget", "1", "--workdir", str(tmp_path / "w"),
                   "--config", str(config), home=tmp_path).returncode == 0
    listed = kvmtune("results", "list", "--config", str(config), home=tmp_path)
    assert listed.returncode == 0 and " verify " in listed.stdout, listed.stdout + listed.stderr
    shown = kvmtune("results", "show", "1", "--format", "json", "--config", str(config), home=tmp_path)
    assert json.loads(shown.stdout)["run"]["kind"] == "verify"
    assert kvmtune("report", "1", "--config", str(config), home=tmp_path).stdout.startswith("verified fixes:")
    assert kvmtune("compare", "1", "1", "--config", str(config), home=tmp_path).stdout.startswith("runs 1 and 1 ")
    # without the file, the default database: none yet
    assert kvmtune("results", "list", "--no-config", home=tmp_path).stdout.startswith("no runs yet")
    # a database the file names must exist where it is read: one line, not "no runs yet"
    missing = write(tmp_path / "m.toml", f'db = "{tmp_path / "none.db"}"\n')
    done = kvmtune("results", "list", "--config", str(missing), home=tmp_path)
    assert done.returncode == 2 and done.stdout == "" and len(done.stderr.splitlines()) == 1
    assert str(tmp_path / "none.db") in done.stderr


def test_the_fleet_report_keeps_its_history_in_the_settings_database(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.mkdir()
    audit = kvmtune("audit", "--examples", "--no-config", "--format", "json", home=tmp_path)
    name = json.loads(audit.stdout)["host"]  # a fleet directory's files are named after their host
    (hosts / f"{name}.json").write_text(audit.stdout)
    db = tmp_path / "site" / "results.db"
    config = write(tmp_path / "k.toml", f'db = "{db}"\n')
    done = kvmtune("report", str(hosts), "--config", str(config), home=tmp_path)
    assert done.returncode in (0, 1), done.stderr
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM fleet_collections").fetchone() == (1,)


def _commands(parser: argparse.ArgumentParser, path: str = "kvmtune") -> list[tuple[str, argparse.ArgumentParser]]:
    out = [(path, parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                out += _commands(child, f"{path} {name}")
    return out


def test_every_command_with_db_reads_the_settings() -> None:
    with_db = [(where, p) for where, p in _commands(build_parser())
               if any("--db" in a.option_strings for a in p._actions)]
    assert {w for w, _ in with_db} >= {"kvmtune bench storage", "kvmtune bench net", "kvmtune results list",
                                       "kvmtune results show", "kvmtune compare", "kvmtune report", "kvmtune verify"}
    for where, p in with_db:
        command = p.get_default("command_object")
        assert command is not None and command.uses_settings, where
        help_text = next(a.help for a in p._actions if "--db" in a.option_strings)
        assert help_text and "the settings file's db" in help_text, where


@pytest.mark.parametrize(("text", "line", "problem"), [
    ('fail_on = "high"\ndb = "results.db"\n', 2, "'results.db' is not an absolute path"),
    ('db = 3\n', 1, "db: expected a non-empty string"),
    ('[verify]\nthreshold = 0\n', 2, "verify.threshold: 0 is out of range"),
    ('[verify]\nbudget = 0.5\n', 2, "verify.budget: 0.5 is out of range (give at least 1"),
    ('[verify]\nfinding_budget = "30s"\n', 2, "verify.finding_budget: expected a number"),
    ('[verify]\nfinding-budget = 30\n', 2, "unknown key 'verify.finding-budget'; did you mean 'finding_budget'?"),
])
def test_a_bad_new_key_is_one_line_naming_file_and_line(tmp_path: Path, text: str, line: int, problem: str) -> None:
    path = write(tmp_path / "k.toml", text)
    for argv in (["config", "check", str(path)], ["verify", "--examples", "--config", str(path)],
                 ["results", "list", "--config", str(path)]):
        done = kvmtune(*argv, home=tmp_path)
        assert done.returncode == 2 and done.stdout == ""
        assert len(done.stderr.splitlines()) == 1, done.stderr
        assert done.stderr.startswith(f"kvmtune: {path}:{line}: ") and problem in done.stderr, done.stderr


def test_config_show_names_the_new_keys_and_their_cited_defaults(tmp_path: Path) -> None:
    shown = kvmtune("config", "show", "--no-config", "--format", "json", home=tmp_path)
    settings = json.loads(shown.stdout)["settings"]
    assert settings["verify.threshold"] == {"value": 5.0, "from": settings["verify.threshold"]["from"]}
    assert "docs/verdicts.md" in settings["verify.threshold"]["from"]
    assert settings["verify.finding_budget"]["value"] == 30.0 and "docs/verify.md" in settings["verify.finding_budget"]["from"]
    assert settings["verify.budget"] == {"value": None, "from": "default (unset: no cap on the whole run)"}
    assert settings["db"]["value"] is None and "default_db" in settings["db"]["from"]
    text = kvmtune("config", "show", "--no-config", home=tmp_path).stdout
    assert any(ln.startswith("verify.budget ") and "(unset)" in ln for ln in text.splitlines())
