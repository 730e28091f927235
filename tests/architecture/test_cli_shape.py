"""Every subcommand has one shape (cli/command.py): no module writes to ``args``, prints its own usage error
or returns a raw exit number; ``--format`` is always an output format. ``COMMAND_TABLE`` (what ``--help``
lists without importing a command) says what the modules' ``COMMANDS`` say."""

from __future__ import annotations

import argparse
import ast
from itertools import zip_longest
from pathlib import Path

import pytest

import kvmtune.cli
from kvmtune.cli import COMMAND_MODULES, COMMAND_TABLE, _root_parser, build_parser

CLI = Path(kvmtune.cli.__file__).resolve().parent
OUTPUT_FORMATS = {"text", "json", "sarif", "prometheus", "html", "roff"}
HELPERS = {"__init__", "command", "audit_host", "bench_net"}  # parts of audit and bench, not commands of their own


def problems(tree: ast.AST) -> list[str]:
    out: list[str] = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "args":
                out.append(f"line {node.lineno}: assigns args.{t.attr}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "setattr" and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == "args":
                out.append(f"line {node.lineno}: setattr(args, …)")
            if node.func.id == "print" and node.args:
                first = node.args[0]
                text = first.value if isinstance(first, ast.Constant) else (
                    first.values[0].value if isinstance(first, ast.JoinedStr) and first.values
                    and isinstance(first.values[0], ast.Constant) else None)
                if isinstance(text, str) and text.startswith("kvmtune: error"):
                    out.append(f"line {node.lineno}: prints its own usage error")
        if isinstance(node, ast.Return) and isinstance(node.value, ast.Constant) and type(node.value.value) is int:
            out.append(f"line {node.lineno}: returns the raw number {node.value.value}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Outcome" and node.args \
                and isinstance(node.args[0], ast.Constant):
            out.append(f"line {node.lineno}: Outcome with a raw exit number")
    return out


@pytest.mark.parametrize("path", sorted(CLI.glob("*.py")), ids=lambda p: p.stem)
def test_a_command_module_has_the_one_shape(path: Path) -> None:
    if path.stem in ("__init__", "command"):
        pytest.skip("the shape itself")
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    assert problems(tree) == []
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assert "register" not in names, "a Command in COMMANDS, not register()"


def test_every_command_module_is_listed_and_converted_modules_name_their_commands() -> None:
    listed = {m.rsplit(".", 1)[1] for m in COMMAND_MODULES}
    assert {p.stem for p in CLI.glob("*.py")} - HELPERS == listed
    for name in listed:
        module = __import__(f"kvmtune.cli.{name}", fromlist=["COMMANDS"])
        assert module.COMMANDS, name


def table_drift(table: tuple[tuple[str, str, str], ...]) -> list[str]:
    """Where ``table`` and the ``COMMANDS`` of every command module under ``cli/`` disagree: a name, a module,
    a help line or the order (``--help``'s order: module by module, each module's commands in its own order)."""
    on_disk = sorted(f"kvmtune.cli.{p.stem}" for p in CLI.glob("*.py") if p.stem not in HELPERS)
    modules = [*dict.fromkeys(module for _, module, _ in table if module in on_disk),
               *(m for m in on_disk if m not in {module for _, module, _ in table})]
    real = [(cls.name, module, cls.help) for module in modules
            for cls in __import__(module, fromlist=["COMMANDS"]).COMMANDS]
    return [f"COMMAND_TABLE has {t}, the modules {r}" for t, r in zip_longest(table, real) if t != r]


def test_the_command_table_is_what_the_modules_say() -> None:
    assert table_drift(COMMAND_TABLE) == []


def test_the_drift_check_sees_each_disagreement() -> None:
    rows = list(COMMAND_TABLE)
    top = next(i for i, row in enumerate(rows) if row[0] == "top")
    changed_help = [(n, m, h + "!" if n == "rules" else h) for n, m, h in rows]
    swapped = [*rows[:top], rows[top + 1], rows[top], *rows[top + 2:]]  # top and sample, one module
    split = [row for row in rows if row[0] != "capacity"] + [next(row for row in rows if row[0] == "capacity")]
    first_module_last = [*rows[1:], rows[0]]  # the table orders the modules (`--help`'s order): no disagreement
    assert len(table_drift(tuple(changed_help))) == 1
    assert len(table_drift(tuple(rows[:-1]))) == 1  # a command (and its module) the table lacks
    assert len(table_drift(tuple(row for row in rows if row[0] != "man"))) == 2  # man, then config one row up
    assert len(table_drift((*rows, ("ghost", "kvmtune.cli.rules", "a command no module has")))) == 1
    assert len(table_drift(tuple(swapped))) == 2
    assert table_drift(tuple(split)) != []  # one module's commands, apart
    assert table_drift(tuple(first_module_last)) == []
    assert table_drift(tuple((n, "kvmtune.cli.audit" if n == "rules" else m, h) for n, m, h in rows)) != []


def test_a_command_loaded_alone_is_the_one_build_parser_builds() -> None:
    full = build_parser()
    lazy, sub = _root_parser()
    assert lazy.format_help() == full.format_help()
    whole = next(a for a in full._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert whole is not None and list(whole) == list(sub.choices or ())
    for name, _, _ in reversed(COMMAND_TABLE):  # each as if it were the one invoked, in another order
        sub.load(name)
        assert [(p, a.option_strings, a.help) for p, a in _options(sub.choices[name])] == \
            [(p, a.option_strings, a.help) for p, a in _options(whole[name])], name
        assert sub.choices[name].format_help() == whole[name].format_help(), name
    assert list(sub.choices or ()) == list(whole) == [n for n, _, _ in COMMAND_TABLE]
    assert lazy.format_help() == full.format_help()


def _options(parser: argparse.ArgumentParser, path: str = "kvmtune") -> list[tuple[str, argparse.Action]]:
    out: list[tuple[str, argparse.Action]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                out += _options(child, f"{path} {name}")
        else:
            out.append((path, action))
    return out


def test_format_is_always_an_output_format() -> None:
    offenders = [f"{where}: {sorted(a.choices or ())}" for where, a in _options(build_parser())
                 if "--format" in a.option_strings and not set(a.choices or ()) <= OUTPUT_FORMATS]
    # bench storage: --format qcow2|raw (its image format) for one release; fix accepts its old --format qcow2|raw
    # too, but does not list it (tests/fix/test_fix_image_format.py)
    allowed_for_one_release = {"kvmtune bench storage"}
    assert [o for o in offenders if o.split(":")[0] not in allowed_for_one_release] == []


def test_the_checker_sees_each_problem() -> None:
    src = '''
def run(args):
    args.root = "/"
    setattr(args, "x", 1)
    print(f"kvmtune: error: {x}", file=sys.stderr)
    return Outcome(2)
def other():
    return 2
'''
    found = problems(ast.parse(src))
    assert sorted(f.split(": ", 1)[1] for f in found) == sorted([
        "assigns args.root", "setattr(args, …)", "prints its own usage error", "Outcome with a raw exit number",
        "returns the raw number 2"])
