"""The settings file the Debian package ships (packaging/deb/kvmtune.toml, issue 33): every key commented out, so
it changes nothing, and every key there to uncomment, each line valid once uncommented."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from kvmtune.audit.settings import KEYS, load

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "packaging" / "deb" / "kvmtune.toml"


def uncommented(text: str) -> str:
    """The file with its settings uncommented: a line '#key = …' or '#[table]' loses its '#'; prose ('# …') stays."""
    return "".join(line[1:] if re.match(r"#[\w\[]", line) else line for line in text.splitlines(keepends=True))


def test_the_shipped_file_sets_nothing(tmp_path: Path) -> None:
    path = tmp_path / "kvmtune.toml"
    path.write_text(SHIPPED.read_text(encoding="utf-8"))
    path.chmod(0o644)
    settings = load([(str(path), True)])
    assert [k.name for k in KEYS if settings.given(k.name)] == [] and settings.waivers == []


def test_uncommented_it_sets_every_key_and_a_waiver(tmp_path: Path) -> None:
    path = tmp_path / "kvmtune.toml"
    path.write_text(uncommented(SHIPPED.read_text(encoding="utf-8")))
    path.chmod(0o644)
    done = subprocess.run([sys.executable, "-m", "kvmtune", "config", "check", str(path)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO / "src")}, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    settings = load([(str(path), True)])
    assert [k.name for k in KEYS if not settings.given(k.name)] == []  # a key added to KEYS belongs here too
    assert [w.rule for w in settings.waivers] == ["KVM-STO-004"]
    # every value shown is the key's cited default, but for the examples of what a site sets
    changed = {k.name for k in KEYS if settings.get(k.name) != k.default}
    assert changed == {"fail_on", "skip", "db", "connect", "verify.budget"}
