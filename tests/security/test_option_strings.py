"""No option string is pasted together outside :mod:`kvmtune.qemuopts` (issue 43, item 1).

QEMU and qemu-storage-daemon keep the *last* of two equal keys, so a value pasted into ``key=value,…`` unchecked
can swap in a file of its choosing (``io='threads,filename=/etc/shadow'``). This walks every module that builds
an argv for qemu, qemu-storage-daemon, qemu-img, fio, ``qm``, ``pvesh`` or ``ip`` and fails on any f-string,
``%`` or ``+`` whose constant part holds a ``key=`` (``(^|,)[a-z_.-]+=``) next to an interpolated value. The
exceptions: a module constant (an ``ALL_CAPS`` name, kvmtune's own text), and a line marked
``# not-an-option:`` with the reason (a hash input, a status file); everything else goes through
``qemuopts.keyval``/``fio_option``/``long_option``/``operand``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import kvmtune

SRC = Path(kvmtune.__file__).resolve().parent
REPO = SRC.parents[1]
ROOTS = (SRC, REPO / "bench")
ALLOWED = {SRC / "qemuopts.py"}
KEY = re.compile(r"(^|,)[a-z_.-]+=")
TOOLS = frozenset({"qemu-img", "qemu-storage-daemon", "fio", "qm", "pvesh", "ip", "-drive", "-device", "-netdev",
                   "-object", "-chardev", "-blockdev", "--blockdev", "--export", "--nbd-server"})
CONSTANT = re.compile(r"[A-Z][A-Z0-9_]*")


def builds_argv(tree: ast.AST) -> bool:
    """A module that names one of the tools (or one of QEMU's device options) as a string of its own."""
    return any(isinstance(n, ast.Constant) and isinstance(n.value, str)
               and (n.value in TOOLS or n.value.startswith("qemu-system")) for n in ast.walk(tree))


def _own_constant(node: ast.expr) -> bool:
    """``NAME`` or ``module.NAME`` in capitals: text kvmtune wrote, not a value it read."""
    if isinstance(node, ast.Constant):
        return True
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return bool(CONSTANT.fullmatch(name))


def _keyed(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and KEY.search(node.value) is not None


def pasted_options(tree: ast.AST, source: str = "") -> list[int]:
    """Line numbers of option strings built by pasting a value next to a ``key=`` (``source``: lines marked
    ``# not-an-option:`` are not option strings)."""
    marked = {n for n, line in enumerate(source.splitlines(), 1) if "# not-an-option:" in line}
    lines: list[int] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            values = [v.value for v in node.values if isinstance(v, ast.FormattedValue)]
            if any(_keyed(v) for v in node.values) and not all(_own_constant(v) for v in values):
                lines.append(node.lineno)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mod, ast.Add)):
            for a, b in ((node.left, node.right), (node.right, node.left)):
                if _keyed(a) and not _own_constant(b):
                    lines.append(node.lineno)
                    break
    return sorted(set(lines) - marked)


def option_sites(roots: tuple[Path, ...] = ROOTS) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if path in ALLOWED:
                continue
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source, str(path))
            if builds_argv(tree) and (lines := pasted_options(tree, source)):
                found[str(path.relative_to(REPO))] = lines
    return found


def test_no_option_string_is_pasted_together_outside_qemuopts() -> None:
    assert option_sites() == {}


def test_the_walk_finds_a_pasted_option() -> None:
    """The check itself: the hole of issue 43 and its relatives are found, kvmtune's own constants are not."""
    bad = [
        'argv = ["qemu-storage-daemon", "--blockdev", f"driver=file,filename={path},aio={lay.io}"]',
        'argv = ["qemu-img", "create", "-o", "preallocation=%s" % prealloc]',
        'argv = ["fio", "--filename=" + path]',
        'argv = ["qemu-system-x86_64", "-drive", f"{opts},cache=none"]',
        'opts = "fio"; s = ",aio=" + disk.io',
    ]
    for source in bad:
        tree = ast.parse(source)
        assert builds_argv(tree) and pasted_options(tree) == [1], source
    fine = [
        'argv = ["qemu-img", f"id={DISK_ID}", "cache=none", f"--timeout={mod.OVS_TIMEOUT:.0f}"]',
        'argv = ["fio", keyval(("filename", path))]',
        'print(f"cache={disk.cache}")',  # a module that runs none of the tools
    ]
    for source in fine:
        tree = ast.parse(source)
        assert not (builds_argv(tree) and pasted_options(tree)), source
