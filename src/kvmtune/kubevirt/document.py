"""One manifest document with where each of its values was written (no YAML library here: audit starts without it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Document:
    """One YAML document (or one item of a ``kind: List``): its data and where each value was written."""

    path: str  # the file
    data: Any
    positions: dict[str, tuple[int, int]] = field(default_factory=dict)  # spec path -> (line, column), 1-based
    prefix: str = ""  # the path of this object inside the document (``items[3]`` for a List's item)
    number: int = 0  # which document of its file (0: the first), for kubevirt/edit

    def at(self, spec_path: str) -> tuple[int, int] | None:
        """Where ``spec_path`` (relative to this object) was written; ``None`` when it is not in the file."""
        return self.positions.get(self.prefix + ("." if self.prefix and spec_path else "") + spec_path
                                  if spec_path else self.prefix)

    def nearest(self, spec_path: str) -> tuple[str, tuple[int, int]]:
        """``spec_path`` if written, else its closest written ancestor: a default points at what holds it."""
        p = spec_path
        while True:
            found = self.at(p)
            if found is not None or not p:
                return p, found or (1, 1)
            p = _parent(p)


def _parent(p: str) -> str:
    cut = max(p.rfind("."), p.rfind("["))
    return p[:cut] if cut > 0 else ""
