from __future__ import annotations

import shutil
from pathlib import Path

import pytest

HOSTS = next(d / "fixtures" / "hosts" for d in Path(__file__).resolve().parents if (d / "fixtures" / "hosts").is_dir())
SCENARIOS = ["this-machine", "rhel6-old", "nvme-modern", "ksm-overcommit"]


def variant(base: str, tmp: Path, edits: dict[str, str | bytes | None]) -> Path:
    """Copy a fixture host tree and change files in it (None deletes; a str or bytes replaces)."""
    root = tmp / f"{base}-variant"
    shutil.copytree(HOSTS / base, root, symlinks=True)
    for path, content in edits.items():
        p = root / path.lstrip("/")
        if content is None:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            elif p.exists() or p.is_symlink():
                p.unlink()
            continue
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content)
    return root


@pytest.fixture
def make_variant(tmp_path: Path):  # type: ignore[no-untyped-def]
    def make(base: str, edits: dict[str, str | bytes | None]) -> Path:
        return variant(base, tmp_path, edits)

    return make
