"""Real disk images built with qemu-img and sfdisk, once per test session."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

MIB = 1024 * 1024

MBR_63 = """label: dos
unit: sectors

start=63, size=20000, type=83
start=20480, size=40960, type=5
start=20543, size=8000, type=83
start=30000, size=8192, type=82
"""
MBR_2048 = """label: dos
unit: sectors

start=2048, size=40960, type=83
start=43008, size=20480, type=83
"""
GPT_MIXED = """label: gpt
first-lba: 34

start=34, size=2014, type=21686148-6449-6E6F-744E-656564454649
start=2048, size=40960, type=0FC63DAF-8483-4772-8E79-3D69D8477DE4, name="root"
start=43015, size=8000, type=0FC63DAF-8483-4772-8E79-3D69D8477DE4, name="odd"
"""


def need(*tools: str) -> None:
    for t in tools:
        if shutil.which(t) is None:
            pytest.skip(f"{t} not installed (Debian: qemu-utils, fdisk)")


def qemu_img(*args: str) -> None:
    subprocess.run(["qemu-img", *args], check=True, capture_output=True)


def partitioned_raw(path: Path, script: str, size: str = "64M") -> Path:
    qemu_img("create", "-q", "-f", "raw", str(path), size)
    subprocess.run(
        ["sfdisk", "--no-reread", "--no-tell-kernel", "-q", str(path)], input=script.encode(), check=True,
        capture_output=True,
    )
    return path


@pytest.fixture(scope="session")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Name → path of every test image (built once, then only read)."""
    need("qemu-img", "sfdisk")
    d = tmp_path_factory.mktemp("images")
    out: dict[str, Path] = {}

    def p(name: str) -> Path:
        out[name] = d / name
        return out[name]

    qemu_img("create", "-q", "-f", "raw", str(p("sparse.raw")), "64M")
    qemu_img("create", "-q", "-f", "raw", "-o", "preallocation=falloc", str(p("falloc.raw")), "16M")
    for mode in ("off", "metadata", "falloc", "full"):
        qemu_img("create", "-q", "-f", "qcow2", "-o", f"preallocation={mode}", str(p(f"prealloc-{mode}.qcow2")), "64M")
    partitioned_raw(p("mbr63.raw"), MBR_63)
    partitioned_raw(p("mbr2048.raw"), MBR_2048)
    partitioned_raw(p("gpt.raw"), GPT_MIXED)
    qemu_img("convert", "-O", "qcow2", str(out["mbr63.raw"]), str(p("mbr63.qcow2")))
    qemu_img("convert", "-O", "qcow2", str(out["gpt.raw"]), str(p("gpt.qcow2")))
    qemu_img("convert", "-c", "-O", "qcow2", str(out["mbr63.raw"]), str(p("mbr63-compressed.qcow2")))
    qemu_img("convert", "-O", "qcow2", "-o", "extended_l2=on,cluster_size=128k", str(out["gpt.raw"]),
             str(p("gpt-extl2.qcow2")))
    qemu_img("convert", "-O", "qcow2", "-o", "compat=0.10", str(out["mbr2048.raw"]), str(p("mbr2048-v2.qcow2")))
    qemu_img("create", "-q", "-f", "qcow2", "-b", str(out["mbr63.raw"]), "-F", "raw", str(p("overlay-on-mbr63.qcow2")))
    qemu_img("create", "-q", "-f", "qcow2", "-b", str(out["gpt.qcow2"]), "-F", "qcow2", str(p("overlay-on-gpt.qcow2")))
    # a chain of three backing files
    qemu_img("create", "-q", "-f", "qcow2", str(p("chain0.qcow2")), "64M")
    for i in range(1, 4):
        qemu_img("create", "-q", "-f", "qcow2", "-b", f"chain{i - 1}.qcow2", "-F", "qcow2", str(p(f"chain{i}.qcow2")))
    qemu_img("create", "-q", "-f", "qcow2", str(p("big-1t.qcow2")), "1T")
    qemu_img("create", "-q", "-f", "qcow2", "-o", "cluster_size=4096", str(p("small-clusters.qcow2")), "32G")
    qemu_img("create", "-q", "-f", "vmdk", str(p("foreign.vmdk")), "64M")
    return out


@pytest.fixture
def scratch_copy(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Copy an image into the test's own directory (for tests that damage it)."""

    def copy(src: Path, name: str | None = None) -> Path:
        dst = tmp_path / (name or src.name)
        shutil.copyfile(src, dst)
        return dst

    return copy
