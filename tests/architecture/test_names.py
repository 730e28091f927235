"""Names say what a thing is (issue 30 step 7): no module is named after a package it sits in
(``bench/storage/bench.py`` said nothing), and the stand-in's frame relay is called a relay."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import kvmtune
from kvmtune.lab.net import standin

SRC = Path(kvmtune.__file__).resolve().parent


def test_no_module_repeats_the_name_of_its_package() -> None:
    repeats = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC)
        if rel.stem in rel.parts[:-1]:
            repeats.append(str(rel))
    assert repeats == [], f"modules named after a package they sit in: {repeats}"


def test_guest_tiers_are_named_guest() -> None:
    from kvmtune.bench.net.guest import NetBenchmark
    from kvmtune.bench.storage.guest import MatrixBenchmark

    assert NetBenchmark.__module__ == "kvmtune.bench.net.guest"
    assert MatrixBenchmark.__module__ == "kvmtune.bench.storage.guest"


def test_standin_runs_the_relay_by_that_name() -> None:
    assert standin.RELAY.name == "relay.py"
    assert not (standin.RELAY.parent / "wire.py").exists()
    # the script the stand-in starts, run as the stand-in runs it; a bad side A is refused before any namespace is touched
    proc = subprocess.run(
        [sys.executable, str(standin.RELAY), "--rundir", "/nonexistent", "--a", "bogus:x", "--b-netns", "none"],
        capture_output=True, text=True, timeout=30, check=False,
    )
    assert proc.returncode != 0
    assert "relay: unknown side A 'bogus:x'" in proc.stderr
