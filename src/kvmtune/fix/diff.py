"""Unified diffs with a one-line reason before each hunk.

The diff is linear in practice, whatever the file's size: ``difflib`` alone is
quadratic on a domain with thousands of near-identical ``<disk>`` blocks (800
disks took 29 s, 10,000 never finished). Only the edited ranges are diffed: the
common head and tail are cut off, lines that occur exactly once on each side and
in the same order (patience anchors, found in O(n log n)) split the rest, and
``difflib`` sees only the small gaps between anchors. A gap too large for that
(no anchors in it) is shown as one replaced block instead of being searched.
"""

from __future__ import annotations

import bisect
import difflib
from collections.abc import Sequence
from dataclasses import dataclass

Opcode = tuple[str, int, int, int, int]
DIFFLIB_MAX_CELLS = 250_000  # a gap of len(a) * len(b) up to this goes to difflib (well under 0.1 s)


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


def _unique_anchors(a: Sequence[str], a1: int, a2: int, b: Sequence[str], b1: int, b2: int) -> list[tuple[int, int]]:
    """Pairs (i, j) of lines unique in a[a1:a2] and in b[b1:b2], equal, in increasing order on both sides."""
    count_a: dict[str, int] = {}
    pos_a: dict[str, int] = {}
    for i in range(a1, a2):
        count_a[a[i]] = count_a.get(a[i], 0) + 1
        pos_a[a[i]] = i
    count_b: dict[str, int] = {}
    pos_b: dict[str, int] = {}
    for j in range(b1, b2):
        if count_a.get(b[j]) == 1:
            count_b[b[j]] = count_b.get(b[j], 0) + 1
            pos_b[b[j]] = j
    pairs = sorted((pos_a[line], j) for line, j in pos_b.items() if count_b[line] == 1)
    # longest increasing subsequence of the b positions (patience sorting)
    tails: list[int] = []
    tail_idx: list[int] = []
    back: list[int] = [-1] * len(pairs)
    for k, (_i, j) in enumerate(pairs):
        n = bisect.bisect_left(tails, j)
        if n == len(tails):
            tails.append(j)
            tail_idx.append(k)
        else:
            tails[n] = j
            tail_idx[n] = k
        back[k] = tail_idx[n - 1] if n else -1
    out: list[tuple[int, int]] = []
    k = tail_idx[-1] if tail_idx else -1
    while k >= 0:
        out.append(pairs[k])
        k = back[k]
    out.reverse()
    return out


def _gap(a: Sequence[str], a1: int, a2: int, b: Sequence[str], b1: int, b2: int, out: list[Opcode]) -> None:
    """Opcodes turning a[a1:a2] into b[b1:b2], appended to ``out``."""
    while a1 < a2 and b1 < b2 and a[a1] == b[b1]:
        out.append(("equal", a1, a1 + 1, b1, b1 + 1))
        a1, b1 = a1 + 1, b1 + 1
    tail: list[Opcode] = []
    while a1 < a2 and b1 < b2 and a[a2 - 1] == b[b2 - 1]:
        tail.append(("equal", a2 - 1, a2, b2 - 1, b2))
        a2, b2 = a2 - 1, b2 - 1
    if a1 == a2 or b1 == b2:
        if a1 < a2 or b1 < b2:
            out.append(("delete" if b1 == b2 else "insert", a1, a2, b1, b2))
    elif a2 - a1 == 1 and b2 - b1 == 1:
        out.append(("replace", a1, a2, b1, b2))  # one line edited in place: the common case, no search needed
    elif (a2 - a1) * (b2 - b1) <= DIFFLIB_MAX_CELLS:
        matcher = difflib.SequenceMatcher(None, a[a1:a2], b[b1:b2], autojunk=False)
        out.extend((tag, x1 + a1, x2 + a1, y1 + b1, y2 + b1) for tag, x1, x2, y1, y2 in matcher.get_opcodes())
    else:
        anchors = _unique_anchors(a, a1, a2, b, b1, b2)
        if not anchors:
            out.append(("replace", a1, a2, b1, b2))
        else:
            i, j = a1, b1
            for ai, bj in anchors:
                _gap(a, i, ai, b, j, bj, out)
                out.append(("equal", ai, ai + 1, bj, bj + 1))
                i, j = ai + 1, bj + 1
            _gap(a, i, a2, b, j, b2, out)
    out.extend(reversed(tail))


def opcodes(a: Sequence[str], b: Sequence[str]) -> list[Opcode]:
    """``difflib``-style opcodes for a → b, adjacent runs of one kind merged; near-linear time."""
    raw: list[Opcode] = []
    _gap(a, 0, len(a), b, 0, len(b), raw)
    merged: list[Opcode] = []
    for op in raw:
        if op[1] == op[2] and op[3] == op[4]:
            continue
        if merged and merged[-1][0] == op[0] and merged[-1][2] == op[1] and merged[-1][4] == op[3]:
            last = merged[-1]
            merged[-1] = (last[0], last[1], op[2], last[3], op[4])
        elif merged and merged[-1][0] != "equal" and op[0] != "equal" and merged[-1][2] == op[1] and merged[-1][4] == op[3]:
            last = merged[-1]
            merged[-1] = ("replace", last[1], op[2], last[3], op[4])
        else:
            merged.append(op)
    return merged or [("equal", 0, len(a), 0, len(b))]


def grouped(codes: list[Opcode], context: int) -> list[list[Opcode]]:
    """Split opcodes into hunks with up to ``context`` equal lines around each change."""
    codes = list(codes)
    if not any(op[0] != "equal" for op in codes):
        return []
    if codes[0][0] == "equal":
        _t, i1, i2, j1, j2 = codes[0]
        codes[0] = ("equal", max(i1, i2 - context), i2, max(j1, j2 - context), j2)
    if codes[-1][0] == "equal":
        _t, i1, i2, j1, j2 = codes[-1]
        codes[-1] = ("equal", i1, min(i2, i1 + context), j1, min(j2, j1 + context))
    groups: list[list[Opcode]] = []
    group: list[Opcode] = []
    for tag, i1, i2, j1, j2 in codes:
        if tag == "equal" and i2 - i1 > 2 * context:
            group.append((tag, i1, i1 + context, j1, j1 + context))
            groups.append(group)
            group = []
            i1, j1 = i2 - context, j2 - context
        group.append((tag, i1, i2, j1, j2))
    if group and not (len(group) == 1 and group[0][0] == "equal"):
        groups.append(group)
    return groups


def lines_of(text: str) -> list[str]:
    """``text``'s lines with their ends, split on ``\n`` only: a ``\r``, U+2028 or other character that
    ``str.splitlines`` breaks on is inside a line of the file (PVE and libvirt read them so), not a line of its own."""
    lines = [line + "\n" for line in text.split("\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]


def unified(
    old: str, new: str, old_name: str, new_name: str, reasons: Sequence[Reason] = (), context: int = 3
) -> str:
    """A unified diff of ``old`` → ``new``; each hunk is preceded by ``# reason`` lines for the
    reasons whose lines fall in it (reasons without lines go before the first hunk)."""
    a, b = lines_of(old), lines_of(new)
    out = [f"--- {old_name}\n", f"+++ {new_name}\n"]
    used: set[int] = set()
    groups = grouped(opcodes(a, b), context)
    by_line: dict[int, list[int]] = {}
    for k, r in enumerate(reasons):
        for line in r.lines:
            by_line.setdefault(line, []).append(k)
    for n, group in enumerate(groups):
        i1, i2 = group[0][1], group[-1][2]
        j1, j2 = group[0][3], group[-1][4]
        here = {k for k, r in enumerate(reasons) if not r.lines} if n == 0 else set()
        for line in range(i1 + 1, max(i2, i1 + 1) + 1):
            here.update(by_line.get(line, ()))
        for k in sorted(here - used):
            out.append(f"# {reasons[k].text}\n")
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
