"""The settings file (issue 33): search order and layering, refusals, one-line errors with file and
line, `kvmtune config show|check`, and the values reaching the commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvmtune.audit.settings import SYSTEM_FILE, load, search_paths
from kvmtune.errors import InputError

REPO = Path(__file__).resolve().parents[2]
HOSTS = REPO / "tests" / "fixtures" / "hosts"


def kvmtune(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "PYTHONPATH": str(REPO / "src"), **(env or {})}
    if not env or "KVMTUNE_CONFIG" not in env:
        full.pop("KVMTUNE_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "kvmtune", *argv], capture_output=True, text=True, env=full,
                          timeout=120, check=False)


def write(path: Path, text: str, mode: int = 0o644) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    return path


MALFORMED = {
    "unknown key": ('fail_on = "high"\nskip_list = ["KVM-STO-004"]\n', 2, "unknown key 'skip_list'"),
    "unknown key in a table": ('[thresholds]\nvcpu_overcomit = 8\n', 2, "did you mean 'vcpu_overcommit'?"),
    "wrong type": ('fail_on = "high"\n\n[thresholds]\nvcpu_overcommit = "eight"\n', 4,
                   "thresholds.vcpu_overcommit: expected a number"),
    "wrong type, a list": ('only = "KVM-STO"\n', 1, "only: expected a list of strings"),
    "unknown severity": ('fail_on = "hihg"\n', 1, "unknown severity 'hihg'"),
    "unknown rule id": ('[[waiver]]\nrule = "KVM-STO-904"\nreason = "x"\n', 2, "unknown rule id 'KVM-STO-904'; did you mean"),
    "unknown rule in skip": ('skip = ["KVM-XXX-001"]\n', 1, "unknown rule id 'KVM-XXX-001'"),
    "waiver without a reason": ('# c\n\n[[waiver]]\nrule = "KVM-STO-004"\nguest = "db*"\n', 3, "without a reason"),
    "expires not a date": ('[[waiver]]\nrule = "KVM-STO-004"\nreason = "x"\nexpires = "next spring"\n', 4,
                           "'next spring' is not a date"),
    "expires not a real date": ('[[waiver]]\nrule = "KVM-STO-004"\nreason = "x"\nexpires = "2025-02-30"\n', 4,
                                "is not a date"),
    "unknown waiver key": ('[[waiver]]\nrule = "KVM-STO-004"\nreason = "x"\nguset = "db01"\n', 4,
                           "did you mean 'guest'?"),
    "syntax": ('fail_on = "high\n', 1, "not valid TOML"),
    "second waiver": ('[[waiver]]\nrule = "KVM-STO-004"\nreason = "x"\n\n[[waiver]]\nrule = "KVM-STO"\n', 5,
                      "without a reason"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_setting_is_one_line_naming_file_and_line(case: str, tmp_path: Path) -> None:
    text, line, problem = MALFORMED[case]
    path = write(tmp_path / "kvmtune.toml", text)
    for argv in (["config", "check", str(path)], ["audit", "--examples", "--config", str(path)],
                 ["--config", str(path), "audit", "--examples"]):
        done = kvmtune(*argv)
        assert done.returncode == 2, done.stdout
        assert done.stdout == ""
        assert len(done.stderr.splitlines()) == 1, done.stderr
        assert done.stderr.startswith(f"kvmtune: {path}:{line}: "), done.stderr
        assert problem in done.stderr


FIVE_MISTAKES = (
    'fail_on = "hihg"\n'                      # 1: unknown severity
    'skip_list = ["KVM-STO-004"]\n'           # 2: unknown key
    '\n[thresholds]\n'
    'vcpu_overcommit = "eight"\n'             # 5: wrong type
    '\n[[waiver]]\n'                          # 7: without a reason
    'rule = "KVM-STO-004"\n'
    'guset = "db01"\n'                        # 9: unknown waiver key
)


def test_config_check_and_every_settings_load_report_all_mistakes_of_a_file_in_one_run(tmp_path: Path) -> None:
    """Issue 46 item 4: five mistakes, five FILE:LINE lines, in one `config check` and in any command's load."""
    path = write(tmp_path / "kvmtune.toml", FIVE_MISTAKES)
    for argv in (["config", "check", str(path)], ["audit", "--examples", "--config", str(path)]):
        done = kvmtune(*argv)
        assert done.returncode == 2 and done.stdout == ""
        lines = done.stderr.splitlines()
        assert [ln.split(": ", 2)[1] for ln in lines] == [f"{path}:{n}" for n in (1, 2, 5, 7, 9)], done.stderr
        for line, problem in zip(lines, ("unknown severity 'hihg'", "unknown key 'skip_list'",
                                         "thresholds.vcpu_overcommit: expected a number", "without a reason",
                                         "did you mean 'guest'?"), strict=True):
            assert line.startswith(f"kvmtune: {path}:") and problem in line
    with pytest.raises(InputError) as caught:
        load([(str(path), True)])
    assert str(caught.value).endswith("(and 4 more mistake(s) in this file)")


def test_the_mistakes_reported_are_capped(tmp_path: Path) -> None:
    from kvmtune.audit.settings import MAX_ERRORS

    path = write(tmp_path / "kvmtune.toml", "".join(f"key{i} = 1\n" for i in range(MAX_ERRORS + 5)))
    done = kvmtune("config", "check", str(path))
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == MAX_ERRORS + 1
    assert lines[0].startswith(f"kvmtune: {path}:1: unknown key 'key0'")
    assert lines[-1] == f"kvmtune: {path}: 5 more mistake(s) not shown"


def test_config_check_accepts_a_good_file(tmp_path: Path) -> None:
    path = write(tmp_path / "k.toml", 'fail_on = "high"\n[thresholds]\nvcpu_overcommit = 8\n'
                 '[[waiver]]\nrule = "KVM-STO"\nreason = "x"\nexpires = 2030-01-01\n')
    done = kvmtune("config", "check", str(path))
    assert done.returncode == 0 and done.stdout == f"{path}: OK (2 setting(s), 1 waiver(s))\n"


def test_a_settings_file_others_can_write_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "k.toml", 'fail_on = "high"\n', mode=0o664)
    done = kvmtune("config", "show", "--config", str(path))
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert done.stderr == f"kvmtune: {path}: settings file writable by group or others (mode 0664); refused\n"
    path.chmod(0o646)
    assert "writable by group or others" in kvmtune("audit", "--examples", "--config", str(path)).stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_settings_file_of_another_user_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path / "k.toml", 'fail_on = "high"\n')
    os.chown(path, 4242, 4242)
    done = kvmtune("config", "show", "--config", str(path))
    assert done.returncode == 2
    assert done.stderr == (f"kvmtune: {path}: settings file owned by uid 4242, neither root nor the invoking user "
                           "(uid 0); refused\n")


def test_search_order_and_layering(tmp_path: Path) -> None:
    system = write(tmp_path / "etc" / "kvmtune.toml", 'fail_on = "medium"\nskip = ["KVM-STO-008"]\n'
                   '[thresholds]\nvcpu_overcommit = 6\ncpu_utilization = 0.9\n')
    user = write(tmp_path / "home" / ".config" / "kvmtune" / "kvmtune.toml", '# mine\n[thresholds]\nvcpu_overcommit = 8\n')
    env = {"HOME": str(tmp_path / "home")}
    paths = search_paths(None, env, system=str(system))
    assert paths == [(str(system), False), (str(user), False)]
    s = load(paths)
    assert s.files == [str(system), str(user)]
    # the later file overrides the earlier key by key: the rest stays the system file's
    assert s.get("thresholds.vcpu_overcommit") == 8 and s.values["thresholds.vcpu_overcommit"].origin == f"{user}:3"
    assert s.get("thresholds.cpu_utilization") == 0.9 and s.values["thresholds.cpu_utilization"].origin == f"{system}:5"
    assert s.get("fail_on") == "medium" and s.values["fail_on"].origin == f"{system}:1"
    assert s.values["agent_timeout"].origin.startswith("default (")
    # $KVMTUNE_CONFIG replaces the search; --config replaces both; --no-config reads none
    assert search_paths(None, {**env, "KVMTUNE_CONFIG": "/x.toml"}, system=str(system)) == [("/x.toml", True)]
    assert search_paths("/y.toml", {**env, "KVMTUNE_CONFIG": "/x.toml"}) == [("/y.toml", True)]
    assert search_paths("/y.toml", env, no_config=True) == []
    assert search_paths(None, {"XDG_CONFIG_HOME": "/xdg"}) == [(SYSTEM_FILE, False), ("/xdg/kvmtune/kvmtune.toml", False)]
    # absent files in the search are skipped; a named one must exist
    assert load([(str(tmp_path / "none.toml"), False)]).files == []
    with pytest.raises(InputError, match="no such file"):
        load([(str(tmp_path / "none.toml"), True)])


def test_config_show_says_where_each_value_came_from(tmp_path: Path) -> None:
    user = write(tmp_path / "home" / ".config" / "kvmtune" / "kvmtune.toml",
                 'fail_on = "high"\n\n[thresholds]\nvcpu_overcommit = 8\n\n'
                 '[[waiver]]\nrule = "KVM-STO-004"\nreason = "scratch"\n')
    done = kvmtune("config", "show", env={"HOME": str(tmp_path / "home")})
    assert done.returncode == 0, done.stderr
    lines = {line.split("=", 1)[0].strip(): line for line in done.stdout.splitlines() if " = " in line}
    assert lines["fail_on"].endswith(f"# {user}:1")
    assert lines["thresholds.vcpu_overcommit"].endswith(f"# {user}:4")
    assert "# default (OpenStack Nova initial_cpu_allocation_ratio" not in lines["thresholds.vcpu_overcommit"]
    assert lines["thresholds.cpu_utilization"].endswith("# default (seed 000: target system use at 80 % or lower)")
    assert f"waiver KVM-STO-004 ({user}:6): scratch" in done.stdout
    js = json.loads(kvmtune("config", "show", "--format", "json", env={"HOME": str(tmp_path / "home")}).stdout)
    assert js["settings"]["fail_on"] == {"value": "high", "from": f"{user}:1"}
    # --no-config, before or after the subcommand: only defaults
    for argv in (["--no-config", "config", "show"], ["config", "show", "--no-config"]):
        out = kvmtune(*argv, env={"HOME": str(tmp_path / "home")}).stdout
        assert out.startswith("# files read: none") and f"{user}" not in out


def test_a_waiver_rule_takes_a_slug_as_only_does_and_keeps_the_id(tmp_path: Path) -> None:
    """Issue 46 item 7: rule = "disk-cache-unsafe" waives KVM-STO-004; a slug prefix naming several rules is refused
    with their ids."""
    path = write(tmp_path / "kvmtune.toml", '[[waiver]]\nrule = "disk-cache-unsafe"\nguest = "app02-clone"\n'
                 'reason = "scratch clone"\n')
    shown = kvmtune("config", "show", "--config", str(path))
    assert shown.returncode == 0 and f"waiver KVM-STO-004 guest=app02-clone ({path}:1): scratch clone" in shown.stdout
    audit = kvmtune("audit", "--examples", "--no-images", "--only", "KVM-STO-004", "--config", str(path), "--color", "never")
    assert audit.returncode == 0, audit.stderr
    assert any(ln.strip().startswith("WAIVED   KVM-STO-004") and ln.endswith(f"waived: scratch clone [{path}:1]")
               for ln in audit.stdout.splitlines()), audit.stdout
    several = write(tmp_path / "several.toml", '[[waiver]]\nrule = "disk"\nreason = "x"\n')
    done = kvmtune("config", "check", str(several))
    assert done.returncode == 2 and f"{several}:2: waiver rule: slug prefix 'disk' names " in done.stderr
    assert "KVM-STO-004" in done.stderr


def test_config_show_marks_an_expired_waiver(tmp_path: Path) -> None:
    """Issue 46 item 7: an expired waiver waives nothing; config show says so, in text and JSON."""
    path = write(tmp_path / "kvmtune.toml", '[[waiver]]\nrule = "KVM-STO-004"\nreason = "old"\nexpires = 2020-01-01\n\n'
                 '[[waiver]]\nrule = "KVM-STO-002"\nreason = "live"\nexpires = 2999-12-31\n')
    done = kvmtune("config", "show", "--config", str(path))
    waivers = [ln for ln in done.stdout.splitlines() if ln.startswith("waiver ")]
    assert waivers[0].endswith("old EXPIRED 2020-01-01 (waives nothing; its findings count again)")
    assert waivers[1].endswith("live until 2999-12-31") and "EXPIRED" not in waivers[1]
    js = json.loads(kvmtune("config", "show", "--config", str(path), "--format", "json").stdout)
    assert [w["expired"] for w in js["waivers"]] == [True, False]


def test_the_settings_reach_audit(tmp_path: Path) -> None:
    """fail_on, skip and thresholds from the file; the command line wins over the file."""
    root = str(HOSTS / "ksm-overcommit")
    argv = ["audit", "--host", "--root", root, "--only", "KVM-HST-018,KVM-HST-019,KVM-HST-020", "--format", "json"]
    base = json.loads(kvmtune("--no-config", *argv).stdout)
    assert sorted(f["rule"] for f in base["findings"]) == ["KVM-HST-018", "KVM-HST-019", "KVM-HST-020"]
    path = write(tmp_path / "k.toml", '[thresholds]\nvcpu_overcommit = 5\ncpu_utilization = 0.9\nmemory_overcommit = 1.5\n')
    tuned = json.loads(kvmtune("--config", str(path), *argv).stdout)
    assert tuned["findings"] == []
    lower = write(tmp_path / "l.toml", '[thresholds]\nvcpu_overcommit = 2\n')
    found = json.loads(kvmtune("--config", str(lower), *argv).stdout)
    assert [f["expected"] for f in found["findings"] if f["rule"] == "KVM-HST-019"] == ["≤ 2:1"]
    gate = write(tmp_path / "g.toml", 'fail_on = "medium"\nskip = ["KVM-HST-020"]\n')
    done = kvmtune("audit", "--host", "--root", root, "--only", "KVM-HST-019,KVM-HST-020", "--format", "json",
                   "--config", str(gate))
    assert done.returncode == 1  # fail_on from the file
    assert [f["rule"] for f in json.loads(done.stdout)["findings"]] == ["KVM-HST-019"]  # skip from the file
    assert kvmtune("audit", "--host", "--root", root, "--only", "KVM-HST-019", "--fail-on", "critical",
                   "--config", str(gate)).returncode == 0  # the command line wins


def test_the_documented_example_is_a_valid_settings_file(tmp_path: Path) -> None:
    page = (REPO / "docs" / "settings.md").read_text(encoding="utf-8")
    example = page.split("```toml\n", 1)[1].split("```", 1)[0]
    path = write(tmp_path / "kvmtune.toml", example)
    done = kvmtune("config", "check", str(path))
    assert done.returncode == 0, done.stderr
    shown = kvmtune("config", "show", "--config", str(path)).stdout
    # every key the file can hold is in the example
    from kvmtune.audit.settings import KEYS

    assert [k.name for k in KEYS if f"{path}:" not in next(ln for ln in shown.splitlines()
                                                            if ln.startswith(f"{k.name} "))] == []
