"""``host.blockdev.block_device_of``: one way to the block device behind a path, for why and the storage bench."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvmtune.host.blockdev import block_device_of
from kvmtune.host.facts import HostFacts
from kvmtune.host.root import HostRoot


def _node(root: Path, path: Path) -> Path:
    dev = os.stat(path).st_dev
    node = root / f"sys/dev/block/{os.major(dev)}:{os.minor(dev)}"
    node.parent.mkdir(parents=True, exist_ok=True)
    return node


def test_the_uevent_names_the_device_else_the_link(tmp_path: Path) -> None:
    (tmp_path / "img").mkdir()
    (tmp_path / "img/disk.raw").write_text("x")
    node = _node(tmp_path, tmp_path / "img/disk.raw")
    host = HostRoot(str(tmp_path))
    assert block_device_of(host, "/img/disk.raw") is None  # no sysfs node: not known
    node.symlink_to("../../devices/virtual/block/vdz")
    assert block_device_of(host, "/img/disk.raw") == "vdz"
    target = tmp_path / "sys/devices/virtual/block/vdz"
    target.mkdir(parents=True)
    (target / "uevent").write_text("MAJOR=252\nMINOR=0\nDEVNAME=vdz1\nDEVTYPE=partition\n")
    assert block_device_of(host, "/img/disk.raw") == "vdz1"
    # HostFacts asks the same function about a file of kvmtune's own, stat'ed where it is
    assert HostFacts(host).block_device_of(str(tmp_path / "img/disk.raw")) == "vdz1"


def test_a_source_that_is_absent_or_leads_out_of_the_tree_is_none(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("x")
    root = tmp_path / "root"
    root.mkdir()
    (root / "escape").symlink_to(outside / "secret")
    host = HostRoot(str(root))
    assert block_device_of(host, "/escape") is None
    assert block_device_of(host, "/no/such/file") is None
    with pytest.raises(OSError):
        block_device_of(host, str(tmp_path / "no-such-local-file"), local=True)
