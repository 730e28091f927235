"""The kernel command-line drop-in (``/etc/default/grub.d/90-kvmtune.cfg``, KVM-HST-047's ``iommu=pt``) read back as
hostile input: whatever a file under that name says, the plan keeps only arguments kvmtune sets, on a line of its
own shape; and ``/etc/default/grub`` that leads out of the tree does not make it a GRUB host."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from kvmtune.fix.host import GRUB_DROPIN, plan_host
from kvmtune.fix.plan import DropIn

REPO = Path(__file__).resolve().parents[2]
LINE = 'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX iommu=pt"'


def _tree(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    shutil.copytree(REPO / "tests" / "fixtures" / "hosts" / "pinned-latency", tree, symlinks=True)
    (tree / "etc/default/grub").write_text('GRUB_CMDLINE_LINUX=""\n')
    (tree / "usr/sbin").mkdir(parents=True, exist_ok=True)
    shutil.copy(REPO / "tests" / "fixtures" / "grub" / "grub-mkconfig.debian", tree / "usr/sbin/grub-mkconfig")
    return tree


def _grub_change(tree: Path) -> DropIn | None:
    found = [c for c in plan_host(str(tree), "virtual-host").changes if isinstance(c, DropIn) and c.shown == GRUB_DROPIN]
    return found[0] if found else None


@pytest.mark.parametrize(
    "planted",
    [
        'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX init=/bin/sh"\n',
        'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX iommu=pt init=/bin/sh"\n',
        'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX $(reboot)"\n',
        'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX iommu=pt"\rreboot\n',
        'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX iommu=pt"\u2028reboot\n',
        'GRUB_CMDLINE_LINUX="$GRUB_CMDLINE_LINUX iommu=pt*"\n',
        "\xff\xfe not text\n",
    ],
)
def test_a_planted_drop_in_keeps_only_kvmtune_s_arguments(planted: str, tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    dropin = tree / GRUB_DROPIN.lstrip("/")
    dropin.parent.mkdir(parents=True)
    dropin.write_bytes(planted.encode("utf-8", "surrogateescape") if planted.isascii() else planted.encode())
    change = _grub_change(tree)
    assert change is not None
    lines = change.after.decode().splitlines()
    assert [x for x in lines if not x.startswith("#")] == [LINE]
    assert [p.rule for p in change.planned] == ["KVM-HST-047"] and change.takes_effect() == "host-boot"


def test_kvmtune_s_own_drop_in_is_kept_as_it_is(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    change = _grub_change(tree)
    assert change is not None
    dropin = tree / GRUB_DROPIN.lstrip("/")
    dropin.parent.mkdir(parents=True)
    dropin.write_bytes(change.after)
    assert _grub_change(tree) is None  # the argument is still wanted (no boot since) and already there


def test_a_grub_mkconfig_without_the_grub_d_loop_is_no_grub_host(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    (tree / "usr/sbin/grub-mkconfig").write_text("#! /bin/sh\n. /etc/default/grub\n")
    assert _grub_change(tree) is None
    (tree / "usr/sbin/grub-mkconfig").write_bytes(b"\x7fELF" + b"/default/grub.d/" + b"\0" * (2 << 20))  # too large
    assert _grub_change(tree) is None


def test_a_grub_defaults_link_out_of_the_tree_is_no_grub_host(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    outside = tmp_path / "outside-grub"
    outside.write_text('GRUB_CMDLINE_LINUX=""\n')
    os.unlink(tree / "etc/default/grub")
    os.symlink(outside, tree / "etc/default/grub")
    plan = plan_host(str(tree), "virtual-host")
    assert not [c for c in plan.changes if c.title().endswith("90-kvmtune.cfg") and "grub" in c.title()]
    assert any("has no /etc/default/grub" in s for s in plan.skipped)
