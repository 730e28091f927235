"""``kvmtune fix --patch``: the file changes of a plan as a patch ``git apply`` and ``patch -p1`` take.

The plan's own output is for people: a title per change, notes, and a ``# reason`` line
before each hunk. A patch has none of that between its hunks; each file's reasons come
before its ``---`` header, where both tools skip text. KubeVirt manifests are file edits too: a GitOps
repository can take the patch as a commit. Changes that are not file edits
(libvirt definitions, runtime values, image copies, ``kubectl patch``) cannot be a patch: they are named in
the preamble, and ``kvmtune fix --apply`` makes them.
"""

from __future__ import annotations

import os
from pathlib import Path

from kvmtune.fix.diff import unified
from kvmtune.fix.kubevirt import ManifestEdit
from kvmtune.fix.plan import DropIn, Plan, XmlFileEdit

FILE_EDITS = (XmlFileEdit, DropIn, ManifestEdit)


def patch_path(path: Path, cwd: Path) -> str:
    """Relative to ``cwd`` when the file is below it, else relative to ``/`` (apply it from ``/``)."""
    rel = os.path.relpath(path, cwd)
    return rel if not rel.startswith("..") else str(path).lstrip("/")


def render_patch(plan: Plan, cwd: Path) -> str:
    out: list[str] = []
    for change in plan.changes:
        if not isinstance(change, FILE_EDITS):
            out.append(f"# not in this patch (kvmtune fix --apply makes it): {change.title()}\n")
    for change in plan.changes:
        if not isinstance(change, FILE_EDITS):
            continue
        name = patch_path(change.path, cwd)
        old = (change.before.data or b"").decode("utf-8", "replace")
        new = change.after.decode("utf-8", "replace")
        out.extend(f"# {r.text}\n" for r in change.reasons)
        out.append(unified(old, new, f"a/{name}" if change.before.data is not None else "/dev/null", f"b/{name}"))
    return "".join(out)
