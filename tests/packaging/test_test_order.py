"""The unit tier runs in a fixed order unless asked: pytest-randomly is a development dependency (install.sh
installs the dev extras), and pyproject's addopts keep it off, so CI and scripts/test.sh run in file order and
``-p randomly --randomly-seed=N`` turns it on for an order check (issue 44)."""

from __future__ import annotations

import shlex
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_pytest_randomly_is_a_dev_dependency_and_off_by_default() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    dev = project["project"]["optional-dependencies"]["dev"]
    assert any(d.split(">")[0].split("=")[0].strip() == "pytest-randomly" for d in dev)
    addopts = shlex.split(project["tool"]["pytest"]["ini_options"]["addopts"])
    i = addopts.index("-p")
    assert addopts[i + 1] == "no:randomly"
    assert '".[dev' in (REPO / "scripts" / "install.sh").read_text(encoding="utf-8")  # install.sh installs them
