"""Process-tree helpers shared by the tests that kill kvmtune and look for survivors."""

from __future__ import annotations

import os
from pathlib import Path


def proc_stat(pid: int) -> tuple[int, str, str] | None:
    """(ppid, state, start time) of ``pid``; None once it is gone."""
    try:
        rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(rest[1]), rest[0], rest[19]


def descendants(root: int) -> dict[int, str]:
    """pid → start time of every live descendant of ``root`` (zombies left out)."""
    parents: dict[int, list[int]] = {}
    starts: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := proc_stat(int(entry))) is not None and st[1] not in ("Z", "X"):
            parents.setdefault(st[0], []).append(int(entry))
            starts[int(entry)] = st[2]
    out: dict[int, str] = {}
    todo = [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            out[child] = starts[child]
            todo.append(child)
    return out


def processes_mentioning(text: str) -> list[str]:
    """Live processes (not this one, no zombies) whose command line contains ``text``: "pid command"."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            raw = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if state != "Z" and text.encode() in raw:
            cmd = raw.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{entry} {cmd[:120]}")
    return found
