"""The fix diff looks only at the edited ranges: never a quadratic difflib search over the whole file."""

from __future__ import annotations

import difflib
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from kvmtune.fix import diff
from kvmtune.fix.diff import Reason, opcodes, unified

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "fix_diff"))
from bench_fix_diff import domain


def _apply(a: list[str], b: list[str], codes: list[tuple[str, int, int, int, int]]) -> list[str]:
    out: list[str] = []
    pos_a = pos_b = 0
    for tag, i1, i2, j1, j2 in codes:
        assert (i1, j1) == (pos_a, pos_b), "opcodes must be contiguous"
        if tag == "equal":
            assert a[i1:i2] == b[j1:j2]
            out += a[i1:i2]
        else:
            out += b[j1:j2]
        pos_a, pos_b = i2, j2
    assert (pos_a, pos_b) == (len(a), len(b))
    return out


@pytest.mark.parametrize("cells", [diff.DIFFLIB_MAX_CELLS, 4])
def test_opcodes_rebuild_the_new_text(monkeypatch: pytest.MonkeyPatch, cells: int) -> None:
    monkeypatch.setattr(diff, "DIFFLIB_MAX_CELLS", cells)  # 4: the anchored path everywhere
    rng = random.Random(19)
    for _ in range(400):
        a = [rng.choice("abcdefgh") + "\n" for _ in range(rng.randint(0, 40))]
        b = list(a)
        for _ in range(rng.randint(0, 6)):
            k = rng.randint(0, len(b))
            op = rng.random()
            if op < 0.4 and b:
                del b[min(k, len(b) - 1)]
            elif op < 0.7:
                b.insert(k, rng.choice("abcxyz") + str(rng.randint(0, 99)) + "\n")
            elif b:
                b[min(k, len(b) - 1)] = "changed\n"
        assert _apply(a, b, opcodes(a, b)) == b


def _difflib_unified(old: str, new: str) -> str:
    a, b = old.splitlines(keepends=True), new.splitlines(keepends=True)
    return "".join(difflib.unified_diff(a, b, "x", "y", n=3)).replace("--- x\n+++ y\n", "")


def test_same_hunks_as_difflib_on_a_many_disk_domain(monkeypatch: pytest.MonkeyPatch) -> None:
    old = domain(300, sparse=True)
    new = old.replace("cache='writethrough'", "cache='none' io='native'")
    ours = unified(old, new, "x", "y")
    monkeypatch.setattr(diff, "DIFFLIB_MAX_CELLS", 4)
    anchored = unified(old, new, "x", "y")
    reference = _difflib_unified(old, new)
    strip = lambda t: "".join(ln for ln in t.splitlines(keepends=True) if not ln.startswith(("---", "+++")))  # noqa: E731
    assert strip(ours) == strip(anchored) == reference


def test_no_difflib_search_over_the_whole_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """10,000 disks, every one edited: difflib only ever sees a small gap."""
    seen: list[int] = []
    real = difflib.SequenceMatcher

    def spy(isjunk: Any, a: Any, b: Any, autojunk: bool = True) -> difflib.SequenceMatcher[str]:
        seen.append(len(a) * len(b))
        return real(isjunk, a, b, autojunk=autojunk)

    monkeypatch.setattr(diff.difflib, "SequenceMatcher", spy)
    old = domain(10_000, sparse=False)
    new = old.replace("cache='writethrough'", "cache='none' io='native'")
    text = unified(old, new, "a", "b", [Reason("r", (k * 5 + 10,)) for k in range(10_000)])
    assert text.count("\n+      <driver") == 10_000
    assert text.count("# r\n") == 10_000
    assert max(seen, default=0) <= diff.DIFFLIB_MAX_CELLS
