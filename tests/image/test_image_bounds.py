"""What kvmtune reads of ``qemu-img --output=json`` about an image it did not write is bounded: ``info``/``check``
by a size per answer, ``map`` (whose length the guest chooses through its allocation pattern) as sums over windows,
each answer bounded. Real qemu-img, real images made here with qemu-img and qemu-io."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from kvmtune.cli import main
from kvmtune.errors import KvmtuneError
from kvmtune.fix.images import plan_image
from kvmtune.host.root import HostRoot
from kvmtune.qemu import image
from kvmtune.qemu.image import ImageSpec, read_image
from kvmtune.runner import CommandResult, Runner

pytestmark = pytest.mark.skipif(shutil.which("qemu-img") is None or shutil.which("qemu-io") is None,
                                reason="qemu-img and qemu-io not installed (Debian: qemu-utils)")
MIB = 1024 * 1024
FRAG_SIZE = 16 * MIB  # 4 KiB clusters, every other one written: 2048 allocated, 4096 extents (~430 KB of JSON)


def qemu_img(*args: str) -> str:
    return subprocess.run(["qemu-img", *args], check=True, capture_output=True, text=True).stdout


def qemu_io(path: Path, fmt: str, commands: Sequence[str]) -> None:
    subprocess.run(["qemu-io", "-t", "unsafe", "-f", fmt, str(path)], input="\n".join(commands) + "\n", text=True,
                   check=True, capture_output=True)


def fragmented(path: Path, size: int = FRAG_SIZE) -> Path:
    qemu_img("create", "-q", "-f", "qcow2", "-o", "cluster_size=4096", str(path), str(size))
    qemu_io(path, "qcow2", [f"write -q {at} 4k" for at in range(0, size, 8192)])
    return path


def whole_map_sums(path: Path, fmt: str) -> tuple[int, int]:
    """(mapped, unmapped) as kvmtune summed them before: one qemu-img map of the top layer, the whole list held."""
    extents = json.loads(qemu_img("map", "--output=json", ImageSpec(str(path), fmt).filename()))
    return (sum(e["length"] for e in extents if e["depth"] == 0 and "offset" in e),
            sum(e["length"] for e in extents if e["depth"] == 0 and "offset" not in e))


def virtual_size(path: Path, fmt: str) -> int:
    return int(json.loads(qemu_img("info", "--output=json", "-f", fmt, str(path)))["virtual-size"])


def bound(monkeypatch: pytest.MonkeyPatch, sub: str, limit: int) -> None:
    """Set the per-answer bound of one subcommand (set on the module, so a run on code without bounds still runs)."""
    monkeypatch.setattr(image, "MAX_JSON_OUTPUT", {**getattr(image, "MAX_JSON_OUTPUT", {}), sub: limit},
                        raising=False)


@dataclass
class Recording(Runner):
    """A real runner that also notes, per command, the bound it ran under and how much stdout it held."""

    seen: list[tuple[tuple[str, ...], int | None, int, bool]] = field(default_factory=list)

    def run(self, argv: Sequence[str], **kw: Any) -> CommandResult:
        res = super().run(argv, **kw)
        self.seen.append((tuple(argv), kw.get("max_output"), len(res.stdout.encode()), res.too_large))
        return res

    def maps(self) -> list[tuple[tuple[str, ...], int | None, int, bool]]:
        return [s for s in self.seen if "map" in s[0]]


@pytest.fixture(scope="module")
def disks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    d = tmp_path_factory.mktemp("bounds")
    raw = d / "sparse.raw"
    qemu_img("create", "-q", "-f", "raw", str(raw), "64M")
    qemu_io(raw, "raw", ["write -q 4M 1M", "write -q 40M 64k"])
    meta = d / "metadata.qcow2"
    qemu_img("create", "-q", "-f", "qcow2", "-o", "preallocation=metadata", str(meta), "64M")
    base = d / "base.qcow2"
    qemu_img("create", "-q", "-f", "qcow2", str(base), "64M")
    qemu_io(base, "qcow2", ["write -q 0 8M"])
    overlay = d / "overlay.qcow2"
    qemu_img("create", "-q", "-f", "qcow2", "-b", str(base), "-F", "qcow2", str(overlay))
    qemu_io(overlay, "qcow2", ["write -q 1M 64k", "write -q 20M 3M"])
    return {"raw": (raw, "raw"), "metadata": (meta, "qcow2"), "fragmented": (fragmented(d / "frag.qcow2"), "qcow2"),
            "overlay": (overlay, "qcow2")}


@pytest.mark.parametrize("name", ["raw", "metadata", "fragmented", "overlay"])
def test_map_sums_equal_the_whole_map_in_one_call(disks: dict[str, tuple[Path, str]], name: str) -> None:
    path, fmt = disks[name]
    runner = Runner()
    sums, err = image.qemu_img_map_sums(ImageSpec(str(path), fmt), virtual_size(path, fmt), runner)
    assert err is None and sums is not None
    assert (sums.mapped, sums.unmapped) == whole_map_sums(path, fmt)
    assert sums.mapped + sums.unmapped == virtual_size(path, fmt)
    assert sums.calls == len(runner.history) == 1  # few extents: one qemu-img map, as before
    assert runner.history[0].argv[3:5] == ("--start-offset=0", f"--max-length={virtual_size(path, fmt)}")


def test_map_windows_start_at_their_offset_and_cover_it(disks: dict[str, tuple[Path, str]]) -> None:
    """What the walk relies on, asked of qemu-img itself: a window's extents start at --start-offset (also inside a
    cluster) and their lengths add up to --max-length."""
    path, fmt = disks["fragmented"]
    for start, length in ((0, 65536), (1000, 5000), (8192 * 7 + 100, 300_000), (FRAG_SIZE - 4096, 4096)):
        extents = json.loads(qemu_img("map", "--output=json", f"--start-offset={start}", f"--max-length={length}",
                                      "-f", fmt, str(path)))
        assert extents[0]["start"] == start
        assert sum(e["length"] for e in extents) == length
        assert all(a["start"] + a["length"] == b["start"] for a, b in pairwise(extents))


def test_a_fragmented_map_is_read_in_bounded_windows_by_the_audit(disks: dict[str, tuple[Path, str]],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    path, _ = disks["fragmented"]
    mapped, _ = whole_map_sums(path, "qcow2")
    bound(monkeypatch, "map", 16 * 1024)
    runner = Recording()
    img = read_image(str(path), runner, [], declared_format="qcow2")
    assert f"qemu-img map: {mapped} B of the top layer have host clusters" in img.preallocation_evidence
    assert img.preallocation == "off" and mapped == FRAG_SIZE // 2
    maps = runner.maps()
    assert len(maps) > 10 and any(too_large for *_, too_large in maps)  # windows were split
    assert all(limit == 16 * 1024 and held <= 16 * 1024 + 1 for _, limit, held, _ in maps)  # + the byte that tells
    assert max(len(e.stdout) for e in runner.history) == 0  # the record keeps no answer


def test_a_fragmented_map_is_read_in_bounded_windows_by_fix(disks: dict[str, tuple[Path, str]], tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "guest.qcow2"
    shutil.copyfile(disks["fragmented"][0], path)
    bound(monkeypatch, "map", 16 * 1024)
    runner = Recording()
    change, why = plan_image(path, runner, HostRoot("/"), "qcow2")
    assert why is None and change is not None
    assert "8 MiB of 16 MiB unallocated" in change.reasons[0].text
    maps = runner.maps()
    assert len(maps) > 10 and all(limit == 16 * 1024 and held <= 16 * 1024 + 1 for _, limit, held, _ in maps)


def test_a_window_that_cannot_be_made_small_enough_is_one_line(disks: dict[str, tuple[Path, str]], tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "guest.qcow2"
    shutil.copyfile(disks["fragmented"][0], path)
    bound(monkeypatch, "map", 200)  # 64 KiB of alternating 4 KiB clusters: 16 extents, ~1.7 KB
    img = read_image(str(path), Runner(), [], declared_format="qcow2")
    line = f"qemu-img map of {path}: more than 200 bytes of extents for the 65536 bytes at offset 0; not read"
    assert img.preallocation_evidence == f"qemu-img map failed: {line}"
    assert img.preallocation is None and img.broken is None
    with pytest.raises(KvmtuneError) as exc:
        plan_image(path, Runner(), HostRoot("/"), "qcow2")
    assert str(exc.value) == f"{path}: qemu-img map failed: {line}"


def test_the_walk_has_one_deadline(disks: dict[str, tuple[Path, str]]) -> None:
    path, fmt = disks["fragmented"]
    runner = Runner()
    sums, err = image.qemu_img_map_sums(ImageSpec(str(path), fmt), FRAG_SIZE, runner, timeout=0)
    assert sums is None and runner.history == []
    assert err == f"qemu-img map of {path} did not finish in 0 s (0 calls, 0 of {FRAG_SIZE} bytes read)"


def test_info_over_its_bound_is_one_line_in_the_audit(disks: dict[str, tuple[Path, str]], tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """A header with thousands of bitmaps or snapshots makes ``qemu-img info`` long; here the bound is made small
    instead (a sane qcow2's info is ~600 bytes)."""
    img = tmp_path / "web01.qcow2"
    shutil.copyfile(disks["metadata"][0], img)
    xml = tmp_path / "web01.xml"
    xml.write_text(f"""<domain type='kvm'><name>web01</name><memory unit='GiB'>1</memory><vcpu>1</vcpu>
  <os><type arch='x86_64' machine='q35'>hvm</type></os>
  <devices><disk type='file' device='disk'><driver name='qemu' type='qcow2' cache='none'/>
    <source file='{img}'/><target dev='vda' bus='virtio'/></disk></devices></domain>
""")
    bound(monkeypatch, "info", 300)
    main(["audit", "--format", "json", str(xml), "--only", "KVM-IMG", "--assume-this-host"])
    out = capsys.readouterr()
    doc = json.loads(out.out)
    [finding] = [f for f in doc["findings"] if f["rule"] == "KVM-IMG-010"]
    assert finding["actual"] == f"qemu-img cannot open it: qemu-img info printed more than 300 bytes for {img}; not read"
    assert "Traceback" not in out.err


@pytest.mark.parametrize(("extents", "why"), [
    ({"start": 0}, "not a list of extents"),
    ([[0, 4096]], "an extent that is not an object"),
    ([{"start": 0, "length": 4096, "depth": True}], "an extent without integer start, length, depth and offset"),
    ([{"start": 0, "length": 4096, "depth": 0, "offset": "0"}], "an extent without integer start, length, depth"),
    ([{"start": 0, "length": 4096, "depth": 0, "offset": -1}], "extents do not tile bytes 0…8192"),
    ([{"start": 0, "length": 4096, "depth": 0}, {"start": 4097, "length": 4095, "depth": 0}], "do not tile"),
    ([{"start": 0, "length": 0, "depth": 0}, {"start": 0, "length": 8192, "depth": 0}], "do not tile"),
    ([{"start": 0, "length": 1 << 62, "depth": 0}], "do not tile"),
    ([{"start": 0, "length": 4096, "depth": 0}], "extents cover bytes 0…4096, not 0…8192"),
])
def test_a_window_answer_that_is_not_one_is_refused(extents: Any, why: str) -> None:
    result = image._window_sums(extents, 0, 8192)
    assert isinstance(result, str) and why in result


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_the_bounded_map_runs_as_the_image_owner(disks: dict[str, tuple[Path, str]], tmp_path: Path) -> None:
    path = tmp_path / "root-only.qcow2"
    shutil.copyfile(disks["fragmented"][0], path)
    os.chmod(path, 0o600)
    runner = Recording()
    sums, err = image.qemu_img_map_sums(ImageSpec(str(path), "qcow2"), FRAG_SIZE, runner, owner=(65534, 65534))
    assert sums is None and err is not None and "Permission denied" in err and "\n" not in err
    [(argv, limit, _, _)] = runner.seen
    assert argv[:3] == ("setpriv", "--reuid=65534", "--regid=65534") and limit == image.MAX_JSON_OUTPUT["map"]
