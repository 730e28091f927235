"""Journals of the security tests go to a tmp dir, never to the host's."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def journal_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path_factory.mktemp("journal")
    monkeypatch.setenv("KVMTUNE_JOURNAL_DIR", str(d))
    return d
