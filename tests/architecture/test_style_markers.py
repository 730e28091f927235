"""No formatter is run on this tree (ruff check's E/W rules and review keep the style), so markers that only
a formatter reads would be noise: none are left (issue 30, step 8)."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MARKERS = ("fmt: " + "skip", "fmt: " + "off", "fmt: " + "on")


def test_no_formatter_markers() -> None:
    found = [
        f"{path.relative_to(REPO)}:{n}"
        for top in ("src", "tests", "bench", "tools")
        for path in sorted((REPO / top).rglob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if any(m in line for m in MARKERS)
    ]
    assert found == []
