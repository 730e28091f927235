"""Fixtures for the fix/undo tests. Nothing here writes outside pytest's tmp dirs:
journals go to a tmp dir (KVMTUNE_JOURNAL_DIR), host trees are built in tmp dirs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixhelpers import SEED_ERA_HOST, write


@pytest.fixture(autouse=True)
def journal_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path_factory.mktemp("journal")
    monkeypatch.setenv("KVMTUNE_JOURNAL_DIR", str(d))
    return d


@pytest.fixture
def seed_host(tmp_path: Path) -> Path:
    """A small host tree as a 2012-era tuning guide leaves it, in a tmp dir (safe to write)."""
    root = tmp_path / "host"
    for path, text in SEED_ERA_HOST.items():
        write(root, path, text)
    return root


@pytest.fixture
def in_tmp(tmp_path: Path) -> Iterator[Path]:
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        yield tmp_path
    finally:
        os.chdir(old)
