"""docs/architecture.md §3 names every package and module in src/kvmtune, and §1 says who writes HTML."""

from __future__ import annotations

import re
from pathlib import Path

import kvmtune

SRC = Path(kvmtune.__file__).resolve().parent
DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
TEXT = DOC.read_text(encoding="utf-8")


def _section(number: int) -> str:
    start = TEXT.index(f"\n## {number}. ")
    return TEXT[start : TEXT.index("\n## ", start + 1)]


def _rows() -> dict[str, list[str]]:
    """First cell of each §3 table row (split on ', ') -> the backticked spans of its second cell."""
    rows: dict[str, list[str]] = {}
    for line in _section(3).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if not line.startswith("| `") or len(cells) < 2:
            continue
        for name in re.findall(r"`([^`]+)`", cells[0]):
            rows[name] = re.findall(r"`([^`]+)`", cells[1])
    return rows


def _named(module: str, spans: list[str]) -> bool:
    return any(s in (module, f"{module}.py") or s.startswith(f"{module}.") for s in spans)


def test_every_package_has_a_row_naming_each_of_its_modules() -> None:
    rows = _rows()
    missing = []
    for init in sorted(SRC.rglob("__init__.py")):
        pkg = init.parent
        rel = pkg.relative_to(SRC).as_posix()
        if rel == ".":
            continue
        if rel.startswith("rules/"):  # rules/<group>/: the group is named in the rules/<group>/ row
            if not _named(pkg.name, rows.get("rules/<group>/", [])):
                missing.append(f"rules group {pkg.name}")
            continue
        if f"{rel}/" not in rows:
            missing.append(f"row {rel}/")
            continue
        for path in sorted(pkg.iterdir()):
            if path.name == "__init__.py" or path.name == "__pycache__" or path.suffix == ".md" or path.is_dir():
                continue
            name = path.stem if path.suffix == ".py" else path.name
            if not _named(name, rows[f"{rel}/"]):
                missing.append(f"{rel}/{path.name}")
    for path in sorted(SRC.iterdir()):
        if path.is_file() and path.name not in rows:
            missing.append(path.name)
        if path.is_dir() and path.name != "__pycache__" and f"{path.name}/" not in rows:
            missing.append(f"row {path.name}/")
    assert missing == [], f"docs/architecture.md §3 does not name: {missing}"


def test_flow_diagram_sends_html_from_report_not_from_audit() -> None:
    flow = _section(1)
    audit_line = next(line for line in flow.splitlines() if "audit engine" in line)
    assert "HTML" not in audit_line
    assert "SARIF" in audit_line and "Prometheus" in audit_line
    assert any("report" in line and "HTML" in line for line in flow.splitlines())
