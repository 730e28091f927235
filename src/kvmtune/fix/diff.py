"""Unified diffs with a one-line reason before each hunk."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Reason:
    text: str
    lines: tuple[int, ...] = ()  # 1-based lines of the old text the change touches


def _range(start: int, length: int) -> str:
    if length == 1:
        return f"{start + 1}"
    if length == 0:
        return f"{start},0"
    return f"{start + 1},{length}"


def unified(
    old: str, new: str, old_name: str, new_name: str, reasons: Sequence[Reason] = (), context: int = 3
) -> str:
    """A unified diff of ``old`` → ``new``; each hunk is preceded by ``# reason`` lines for the
    reasons whose lines fall in it (reasons without lines go before the first hunk)."""
    a = old.splitlines(keepends=True)
    b = new.splitlines(keepends=True)
    out = [f"--- {old_name}\n", f"+++ {new_name}\n"]
    used: set[int] = set()
    groups = list(difflib.SequenceMatcher(None, a, b, autojunk=False).get_grouped_opcodes(context))
    for n, group in enumerate(groups):
        i1, i2 = group[0][1], group[-1][2]
        j1, j2 = group[0][3], group[-1][4]
        for k, r in enumerate(reasons):
            if k in used:
                continue
            if any(i1 < line <= max(i2, i1 + 1) for line in r.lines) or (not r.lines and n == 0):
                out.append(f"# {r.text}\n")
                used.add(k)
        out.append(f"@@ -{_range(i1, i2 - i1)} +{_range(j1, j2 - j1)} @@\n")
        for tag, x1, x2, y1, y2 in group:
            if tag == "equal":
                out.extend(" " + line for line in a[x1:x2])
                continue
            if tag in ("replace", "delete"):
                out.extend("-" + line for line in a[x1:x2])
            if tag in ("replace", "insert"):
                out.extend("+" + line for line in b[y1:y2])
    leftover = [r for k, r in enumerate(reasons) if k not in used]
    if leftover and groups:
        # a reason whose line was not inside any hunk's old range (e.g. an insertion point): say it last
        out.extend(f"# {r.text}\n" for r in leftover)
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in out)
