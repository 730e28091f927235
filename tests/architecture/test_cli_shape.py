"""Every subcommand has one shape (cli/command.py): no module writes to ``args``, prints its own usage error
or returns a raw exit number; ``--format`` is always an output format."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

import kvmtune.cli
from kvmtune.cli import COMMAND_MODULES, build_parser

CLI = Path(kvmtune.cli.__file__).resolve().parent
OUTPUT_FORMATS = {"text", "json", "sarif", "prometheus", "html", "roff"}


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
    helpers = {"__init__", "command", "audit_host", "bench_net"}  # parts of audit and bench, not commands of their own
    assert {p.stem for p in CLI.glob("*.py")} - helpers == listed
    for name in listed:
        module = __import__(f"kvmtune.cli.{name}", fromlist=["COMMANDS"])
        assert module.COMMANDS, name


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
