"""The package's layers: no import loops, and every import follows docs/architecture.md §2.

Every import counts, including those inside functions and under ``TYPE_CHECKING``:
a loop hidden behind a lazy import is still two modules that cannot be understood
(or tested) one without the other.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import kvmtune

SRC = Path(kvmtune.__file__).resolve().parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def import_graph() -> dict[str, set[str]]:
    """module -> the kvmtune modules it imports (``from pkg import mod`` names the submodule)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    if sub in modules:
                        edges.add(sub)
                    elif base in modules:
                        edges.add(base)
        edges.discard(name)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _is_package_to_own_child(a: str, b: str) -> bool:
    return b.startswith(a + ".") or a.startswith(b + ".")


def test_no_import_loops() -> None:
    graph = import_graph()
    # a package's __init__ naming its own submodules (and they it) is how Python packages work, not a loop
    pruned = {m: {t for t in ts if not _is_package_to_own_child(m, t)} for m, ts in graph.items()}
    assert cycles(pruned) == []


# docs/architecture.md §2, arrow for arrow: what each top-level package (or module) may import besides itself.
BASE = frozenset({"kvmtune", "errors", "runner", "inputs", "textsafe", "prometheus", "qemuopts"})
READERS = frozenset({"model", "host", "domain", "qemu", "proxmox", "guestagent", "kubevirt"})
LAYERS: dict[str, frozenset[str]] = {
    "__main__": frozenset({"cli"}),
    "cli": frozenset({"verify", "bench", "lab", "fix", "audit", "live", "fleet", "canary", "capture"}) | READERS | BASE,
    "canary": frozenset({"bench", "lab"}) | READERS | BASE,  # the drift canary on bench/'s tiers and lab/'s store
    "capture": frozenset({"live"}) | READERS | BASE,  # a guest's disk I/O; finds it as live/why does
    "verify": frozenset({"lab", "fix", "audit"}) | READERS | BASE,  # never a bench/ tier
    "live": frozenset({"audit"}) | READERS | BASE,
    "bench": frozenset({"lab"}) | READERS | BASE,
    "lab": READERS | BASE,  # the measuring lab bench/ and verify/ stand on
    "fix": frozenset({"audit"}) | READERS | BASE,
    "audit": frozenset({"rules"}) | READERS | BASE,  # rules/: the package only, to discover its modules
    "rules": frozenset({"audit"}) | READERS | BASE,
    "fleet": frozenset({"lab"}) | BASE,  # lab/store.py: the results database the fleet history lives in
    "domain": frozenset({"model", "host"}) | BASE,
    "qemu": frozenset({"model", "host"}) | BASE,
    "proxmox": frozenset({"model", "host", "domain", "qemu"}) | BASE,  # args: with qemu/, ostype as domain/'s identity
    "guestagent": frozenset({"model"}) | BASE,
    "kubevirt": frozenset({"model"}) | BASE,  # manifests into the model; no other reader
    "host": frozenset({"model"}) | BASE,
    "model": BASE,
    "kvmtune": frozenset(),
    "errors": frozenset(),
    "textsafe": frozenset(),
    "runner": frozenset({"errors"}),
    "inputs": frozenset({"errors"}),
    "qemuopts": frozenset({"errors"}),
    "prometheus": frozenset({"textsafe", "errors"}),
}


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    out: list[str] = []
    for m, targets in graph.items():
        a = _layer(m)
        for t in targets:
            b = _layer(t)
            if a == b:
                continue
            if a == "audit" and b == "rules" and t != "kvmtune.rules":
                out.append(f"{m} -> {t} (audit/ discovers rules/, it never imports one by name)")
            elif b not in LAYERS.get(a, frozenset()):
                out.append(f"{m} -> {t}")
    return sorted(out)


def test_every_import_follows_the_documented_layers() -> None:
    """Lazy imports and ``TYPE_CHECKING`` imports count: the AST walk sees every import statement."""
    assert layer_violations(import_graph()) == []


DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
ARROWS = re.compile(r"\s*(──▶|◀──)\s*")


def _node(word: str) -> str:
    word = word.strip().removesuffix("/").removesuffix(".py")
    return "kvmtune" if word == "kvmtune/__init__" else word


def diagram_layers(text: str) -> tuple[dict[str, set[str]], set[str]]:
    """docs/architecture.md §2's diagram as arrows: along ``──▶`` a package imports every one to its right,
    ``A ◀── B`` is B importing A, ``·`` lists packages side by side; ``readers`` stands for the ``readers:``
    line's packages. Returns package -> what it may import (the base left out), and the base."""
    section = text[text.index("\n## 2. ") :]
    block = section.split("```")[1]
    lines = [re.sub(r"\s{2,}\(.*$", "", line).strip() for line in block.splitlines() if line.strip()]
    groups: dict[str, set[str]] = {}
    base: set[str] = set()
    chains: list[str] = []
    for line in lines:
        if line.startswith("everything"):
            base = {_node(w) for w in line.split("base:", 1)[1].split("·")}
            continue
        if line.startswith("readers:"):
            line = line.removeprefix("readers:")
            groups["readers"] = {_node(w) for w in ARROWS.sub("·", line).split("·")}
        chains.append(line)
    edges: dict[str, set[str]] = {}
    for line in chains:
        parts = ARROWS.split(line)
        segments = [{_node(w) for w in seg.split("·")} for seg in parts[::2]]
        segments = [set().union(*(groups.get(n, {n}) for n in seg)) for seg in segments]
        run = [segments[0]]
        for arrow, seg in zip(parts[1::2], segments[1:], strict=True):
            if arrow == "──▶":
                for earlier in run:
                    for a in earlier:
                        edges.setdefault(a, set()).update(seg)
                run.append(seg)
            else:  # A ◀── B: B imports A, and a new run starts at B
                for b in seg:
                    edges.setdefault(b, set()).update(run[-1])
                run = [seg]
    return edges, base


def test_the_layer_table_is_the_diagram() -> None:
    """LAYERS and §2's diagram agree arrow for arrow (the base's own few imports, errors at its bottom, are the
    table's alone)."""
    drawn, base = diagram_layers(DOC.read_text(encoding="utf-8"))
    assert base == BASE
    table = {a: set(ts - BASE) for a, ts in LAYERS.items() if a not in BASE}
    assert {a: drawn.get(a, set()) for a in table} == table


def test_the_diagram_reader_follows_both_arrows() -> None:
    text = "\n## 2. x\n```\n a/ ──▶ b/ · c/ ──▶ d/ ◀── e/   (note)\n readers: r/ ──▶ s/\n f/ ──▶ readers\n```\n"
    drawn, _ = diagram_layers(text)
    assert drawn == {"a": {"b", "c", "d"}, "b": {"d"}, "c": {"d"}, "e": {"d"}, "r": {"s"}, "f": {"r", "s"}}


def test_every_package_has_a_layer() -> None:
    assert sorted({_layer(m) for m in import_graph()} - set(LAYERS)) == []


def lab_modules_fleet_imports(graph: dict[str, set[str]]) -> set[str]:
    return {t for m, targets in graph.items() if _layer(m) == "fleet" for t in targets if _layer(t) == "lab"}


def test_fleet_takes_only_the_store_from_the_lab() -> None:
    """§2: ``fleet/`` imports ``lab/`` for the results store and nothing else of it."""
    assert lab_modules_fleet_imports(import_graph()) <= {"kvmtune.lab.store"}
    assert lab_modules_fleet_imports({"kvmtune.fleet.report": {"kvmtune.lab.stats"}}) == {"kvmtune.lab.stats"}


def test_the_layer_check_sees_a_lazy_import_upwards() -> None:
    assert layer_violations({"kvmtune.host.facts": {"kvmtune.lab.workdir"}}) == ["kvmtune.host.facts -> kvmtune.lab.workdir"]
    assert layer_violations({"kvmtune.audit.rule": {"kvmtune.rules.storage.cache_mode"}}) != []
    assert layer_violations({"kvmtune.audit.rule": {"kvmtune.rules"}}) == []


def test_readers_do_not_import_the_auditor() -> None:
    graph = import_graph()
    offenders = sorted(
        f"{m} -> {t}"
        for m, ts in graph.items()
        if m.startswith(("kvmtune.host", "kvmtune.qemu"))
        for t in ts
        if t == "kvmtune.audit" or t.startswith(("kvmtune.audit.", "kvmtune.rules", "kvmtune.fix", "kvmtune.cli"))
    )
    assert offenders == []


def test_the_detector_sees_a_loop() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
