"""tools/new_rule.py: the scaffold writes every file a guest rule (and its fixer) needs, so that once its logic
is written, and nothing else, the contract tests pass for it; a taken or malformed id or slug is refused."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "new_rule.py"
RID, SLUG = "KVM-STO-099", "scaffold-probe"
CONTRACTS = ["tests/rules/test_rule_docs.py", "tests/rules/test_rule_fixtures.py", "tests/fix/test_remedies.py",
             "tests/fix/test_fix_golden.py", "tests/verify/test_verify_plans.py", "tests/fix/test_takes_effect.py"]

# "its logic": the check, the fixer body and the golden output; the scaffold's other texts stay as written
CHECK = '''        if guest.name.endswith("-bad"):
            yield self.finding(target=self.target(guest), actual=guest.name, expected="a name without -bad",
                               evidence="/domain/name", source=guest.origin)
'''
FIX = '''    name = call.root.find("name")
    if name is None:
        raise NotFixable("the domain has no <name>")
    call.doc.set_text(name, "fixed")
    return "renamed to fixed"
'''


def _copy(tmp: Path) -> Path:
    repo = tmp / "repo"
    for part in ("src", "tests", "tools"):
        shutil.copytree(REPO / part, repo / part, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copy(REPO / "pyproject.toml", repo)
    return repo


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One copy for the refusals: each checks that it wrote nothing."""
    return _copy(tmp_path_factory.mktemp("refusals"))


def _scaffold(repo: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(repo / "tools" / "new_rule.py"), *argv], capture_output=True, text=True,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}, check=False)


def _between(text: str, start: str, end: str, new: str) -> str:
    i = text.index(start)
    j = text.index(end, i)
    return text[:i] + new + text[j + len(end):]


def _contracts(repo: Path) -> subprocess.CompletedProcess[str]:
    select = f"{RID} or test_every or test_bad_fixtures_of_fixable"
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", *CONTRACTS, "-k", select],
        cwd=repo, capture_output=True, text=True, check=False,
        env={**os.environ, "PYTHONPATH": str(repo / "src"), "PYTHONDONTWRITEBYTECODE": "1"},
    )


def test_scaffolded_rule_with_fixer_passes_the_contracts_once_its_logic_is_written(tmp_path: Path) -> None:
    repo = _copy(tmp_path)
    res = _scaffold(repo, RID, SLUG, "--group", "storage", "--topic", "disk-cache", "--fixer")
    assert res.returncode == 0, res.stderr
    # the eighth file, not written: the ALL golden, named for when the new check fires on its input
    assert "tests/fix/golden/ALL/legacy-everything.out.xml" in res.stderr
    rule = repo / "src/kvmtune/rules/storage/scaffold_probe.py"
    golden = repo / "tests/fix/golden" / RID
    written = {
        rule, rule.with_suffix(".md"), repo / "tests/rules" / RID / "bad/scaffold-probe.xml",
        repo / "tests/rules" / RID / "good/scaffold-probe.xml", golden / "scaffold-probe.in.xml",
        golden / "scaffold-probe.out.xml",
    }
    assert {repo / p for p in res.stdout.split()} == written | {repo / "src/kvmtune/fix/fixers/storage.py"}
    lint = subprocess.run([str(REPO / ".venv" / "bin" / "ruff"), "check", "--config", str(REPO / "pyproject.toml"),
                           str(rule), str(repo / "src/kvmtune/fix/fixers/storage.py")],
                          capture_output=True, text=True, check=False)
    assert lint.returncode == 0, lint.stdout
    assert _type_only_imports_at_runtime(rule) == ""

    # as written, the contracts hold the new rule to its TODOs: the bad fixture does not fire yet
    before = _contracts(repo)
    assert before.returncode == 1 and RID in before.stdout

    rule.write_text(_between(rule.read_text(), "        # TODO: one finding", "return iter(())\n", CHECK))
    fixers = repo / "src/kvmtune/fix/fixers/storage.py"
    fixers.write_text(_between(fixers.read_text(), "    # TODO: edit call.doc", "is not written yet\")\n", FIX))
    fixed = (golden / "scaffold-probe.in.xml").read_text().replace("<name>scaffold-probe-bad</name>", "<name>fixed</name>")
    (golden / "scaffold-probe.out.xml").write_text(fixed)

    after = _contracts(repo)
    assert after.returncode == 0, after.stdout[-3000:]
    assert " passed" in after.stdout and RID in _ids(repo)
    assert _type_only_imports_at_runtime(rule) == ""
    assert 'topic = "disk-cache"' in rule.read_text()

    # the check fires on the ALL golden's input too: that golden fails, naming its output, until the edit is in it
    rule.write_text(rule.read_text().replace('if guest.name.endswith("-bad"):',
                                             'if guest.name.endswith("-bad") or guest.name == "golden-legacy-everything":'))
    every = _golden_all(repo)
    assert every.returncode == 1 and "ALL/legacy-everything.out.xml is not what the fixers write" in every.stdout
    out = repo / "tests/fix/golden/ALL/legacy-everything.out.xml"
    out.write_text(out.read_text().replace("<name>golden-legacy-everything</name>", "<name>fixed</name>"))
    every = _golden_all(repo)
    assert every.returncode == 0, every.stdout[-3000:]


def _golden_all(repo: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/fix/test_fix_golden.py", "-k", "ALL"],
        cwd=repo, capture_output=True, text=True, check=False,
        env={**os.environ, "PYTHONPATH": str(repo / "src"), "PYTHONDONTWRITEBYTECODE": "1"},
    )


def _type_only_imports_at_runtime(rule: Path) -> str:
    """ruff's flake8-type-checking rules, strict: an import used only in annotations outside ``if TYPE_CHECKING:``
    (TC001-TC003), or one inside it that is used at runtime (TC004), is reported; '' when there is none."""
    res = subprocess.run([str(REPO / ".venv" / "bin" / "ruff"), "check", "--config", str(REPO / "pyproject.toml"),
                          "--select", "TC", "--config", "lint.flake8-type-checking.strict = true",
                          "--output-format", "concise", str(rule)],
                         capture_output=True, text=True, check=False)
    assert res.returncode in (0, 1), res.stderr
    return res.stdout if res.returncode else ""


def _ids(repo: Path) -> str:
    return subprocess.run(
        [sys.executable, "-c", "from kvmtune.audit.rule import all_rules; print(' '.join(r.id for r in all_rules()))"],
        capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(repo / "src")},
    ).stdout


def test_scaffold_without_fixer_is_a_manual_rule(tmp_path: Path) -> None:
    repo = _copy(tmp_path)
    res = _scaffold(repo, "KVM-INS-099", "inside-probe", "--group", "inside", "--topic", "guest-drivers")
    assert res.returncode == 0, res.stderr
    assert "ALL" not in res.stderr  # no fixer, no ALL golden
    text = (repo / "src/kvmtune/rules/inside/inside_probe.py").read_text()
    assert 'fix_kind = "manual"' in text and "verify" not in text
    assert _type_only_imports_at_runtime(repo / "src/kvmtune/rules/inside/inside_probe.py") == ""
    assert not (repo / "tests/fix/golden/KVM-INS-099").exists() and not (repo / "src/kvmtune/fix/fixers/inside.py").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["KVM-STO-002", "fresh-slug", "--group", "storage", "--topic", "disk-cache"],
         "KVM-STO-002: the id is taken by disk-cache-writethrough"),
        (["KVM-STO-099", "disk-cache-unsafe", "--group", "storage", "--topic", "disk-cache"],
         "disk-cache-unsafe: the slug is taken by KVM-STO-004"),
        (["KVM-sto-99", "fresh-slug", "--group", "storage", "--topic", "disk-cache"], "a rule id looks like KVM-STO-030"),
        (["KVM-STO-099", "Fresh_Slug", "--group", "storage", "--topic", "disk-cache"], "a slug is lower-case words"),
        (["KVM-STO-099", "fresh--slug", "--group", "storage", "--topic", "disk-cache"], "a slug is lower-case words"),
        (["KVM-HST-099", "fresh-slug", "--group", "host", "--topic", "ksm"], "the scaffold makes guest rules"),
        (["KVM-STO-099", "fresh-slug", "--group", "nope", "--topic", "disk-cache"], "not a rule group"),
        (["KVM-STO-099", "fresh-slug", "--group", "storage", "--topic", "nope"], "not a topic"),
        (["KVM-NET-021", "fresh-slug", "--group", "storage", "--topic", "mtu"], "the id is taken"),
        # no default topic: a balloon rule in cpu_memory is not about the group's commonest topic
        (["KVM-MEM-099", "balloon-probe", "--group", "cpu_memory", "--fixer"], "--topic: required"),
    ],
)
def test_refused_in_one_line_and_nothing_written(pristine: Path, argv: list[str], message: str) -> None:
    repo = pristine
    files = sorted(p for p in repo.rglob("*") if "__pycache__" not in p.parts)
    res = _scaffold(repo, *argv)
    assert res.returncode == 2 and res.stdout == ""
    assert len(res.stderr.strip().splitlines()) == 1 and message in res.stderr and "Traceback" not in res.stderr
    assert sorted(p for p in repo.rglob("*") if "__pycache__" not in p.parts) == files


def test_existing_fixtures_are_refused(tmp_path: Path) -> None:
    repo = _copy(tmp_path)
    (repo / "tests/rules/KVM-STO-098").mkdir()
    res = _scaffold(repo, "KVM-STO-098", "fresh-slug", "--group", "storage", "--topic", "disk-cache")
    assert res.returncode == 2 and "tests/rules/KVM-STO-098: already exists" in res.stderr
    assert not (repo / "src/kvmtune/rules/storage/fresh_slug.py").exists()
