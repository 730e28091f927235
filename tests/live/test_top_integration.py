"""``kvmtune top`` and ``sample`` against real TCG probe guests made slow on purpose."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvmtune import cli
from kvmtune.lab.guest import GuestBuilder, ProbeGuest
from kvmtune.lab.qemu import Disk, GuestRun, VmSpec
from kvmtune.runner import Runner
from probe_domain import probe_domain_xml, transient_domains

pytestmark = pytest.mark.integration

BUSY = "while :; do :; done\n"


@pytest.fixture(scope="module")
def guest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProbeGuest]:
    work = tmp_path_factory.mktemp("top-guest")
    yield GuestBuilder(work, Runner()).build()
    shutil.rmtree(work, ignore_errors=True)


def insmod_all(guest: ProbeGuest) -> str:
    return f"for m in {' '.join(guest.module_paths)}; do insmod /lib/modules/$m 2>/dev/null; done\n"


def wait_for(predicate: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.5)


def test_top_in_tmux_names_two_guests_sharing_one_cpu(guest: ProbeGuest, tmp_path: Path) -> None:
    """Two busy guests pinned to host CPU 0: each vCPU waits about half the time; the row names the rule."""
    runs = [GuestRun(VmSpec(guest=guest, accel="tcg", job=BUSY, wrapper=["taskset", "-c", "0"]),
                     tmp_path / f"run{i}", Runner(), name=f"vm{i}") for i in range(2)]
    session = f"kvmtune-top-{uuid.uuid4().hex[:8]}"
    tmux = ["tmux", "-S", str(tmp_path / "tmux.sock")]  # its own server and socket: nothing left in /tmp/tmux-0
    try:
        pids = [str(r.start().pid) for r in runs]
        time.sleep(3)  # past the boot
        kvmtune = shutil.which("kvmtune") or str(Path(cli.__file__).parents[3] / ".venv" / "bin" / "kvmtune")
        cmd = [kvmtune, "top", "--no-libvirt", "--interval", "1", "--pid", pids[0], "--pid", pids[1]]
        subprocess.run([*tmux, "new-session", "-d", "-s", session, "-x", "260", "-y", "30", *cmd], check=True)
        screen = ""

        def rows_diagnosed() -> bool:
            nonlocal screen
            screen = subprocess.run([*tmux, "capture-pane", "-p", "-t", session], capture_output=True,
                                    text=True).stdout
            return sum("vcpu-delay" in line and "KVM-HST-019" in line for line in screen.splitlines()) == 2

        wait_for(rows_diagnosed, 30)
        assert rows_diagnosed(), screen
        assert f"pid {pids[0]}" in screen and f"pid {pids[1]}" in screen and "[q] quit" in screen
        subprocess.run([*tmux, "send-keys", "-t", session, "q"], check=True)
        wait_for(lambda: subprocess.run([*tmux, "has-session", "-t", session], capture_output=True).returncode != 0, 10)
        assert subprocess.run([*tmux, "has-session", "-t", session], capture_output=True).returncode != 0
    finally:
        subprocess.run([*tmux, "kill-session", "-t", session], capture_output=True)
        for r in runs:
            r.close()


@pytest.fixture
def slow_fs(tmp_path: Path) -> Iterator[Path]:
    """ext4 with data=journal and sync on a loop device kvmtune's test makes: every synced write is slow.

    The loop device is marked non-rotational: its backing file lies on this machine's (flash) disk.
    """
    backing = tmp_path / "fs.img"
    subprocess.run(["truncate", "-s", "1G", str(backing)], check=True)
    subprocess.run(["mkfs.ext4", "-q", str(backing)], check=True)
    loop = subprocess.run(["losetup", "-f", "--show", str(backing)], capture_output=True, text=True,
                          check=True).stdout.strip()
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    try:
        Path(f"/sys/block/{Path(loop).name}/queue/rotational").write_text("0")
        subprocess.run(["mount", "-o", "data=journal,sync", loop, str(mnt)], check=True)
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
        subprocess.run(["losetup", "-d", loop], capture_output=True)


def test_sample_ties_write_latency_to_writethrough_and_missing_preallocation(
    guest: ProbeGuest, tmp_path: Path, slow_fs: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    image = slow_fs / "disk.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(image), "768M"], check=True)
    job = insmod_all(guest) + ("while [ ! -b /dev/vda ]; do sleep 0.1; done\necho TOP-TEST-FIO-STARTS\n"
                               "fio --name=w --filename=/dev/vda --rw=randwrite --bs=4k --direct=1 --ioengine=psync "
                               "--size=700M --time_based --runtime=300 >/dev/null\n")
    spec = VmSpec(guest=guest, accel="tcg", job=job, disks=[Disk(str(image), "qcow2", "virtio-blk", "writethrough",
                                                                  "threads")])
    with GuestRun(spec, tmp_path / "run", Runner()) as run:
        pid = run.start().pid
        wait_for(lambda: b"TOP-TEST-FIO-STARTS" in run.serial.read_bytes(), 90)
        time.sleep(2)
        out = tmp_path / "sample.json"
        assert cli.main(["sample", "--no-libvirt", "--pid", str(pid), "--duration", "4", "--interval", "2",
                         "--format", "json", "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    (g,) = doc["summary"]["guests"]
    disk = g["disks"]["d0"]
    assert disk["iops"] > 0 and disk["write_ms"] >= 2.0, disk
    (latency,) = [d for d in g["diagnoses"] if d["signal"] == "disk-latency d0"]
    assert "KVM-STO-002" in latency["rules"] and "KVM-IMG-002" in latency["rules"], latency
    assert "flash" in latency["threshold"]


PINNED = "\n  <cputune><vcpupin vcpu='0' cpuset='0'/></cputune>"


def test_sample_reads_libvirt_guests_pinned_to_one_cpu(guest: ProbeGuest, tmp_path: Path, libvirt_uri: str) -> None:
    """Two busy libvirt guests with <vcpupin cpuset='0'>: libvirt's vcpu.N.delay shows the wait, and the
    diagnosis names the vCPU overcommit rule from the live affinity."""

    job = tmp_path / "job.sh"
    job.write_text(BUSY)
    names = [f"kvmtune-top-test-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    with transient_domains(libvirt_uri) as create:
        for name in names:
            create(probe_domain_xml(name, guest, job, tmp_path / f"{name}.serial", cputune=PINNED))
        wait_for(lambda: all(b"KVMTUNE-JOB-START" in (tmp_path / f"{n}.serial").read_bytes() for n in names), 90)
        out = tmp_path / "sample.json"
        assert cli.main(["sample", "-c", libvirt_uri, "--no-processes", "--duration", "4", "--interval", "2",
                         "--format", "json", "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    ours = {g["name"]: g for g in doc["summary"]["guests"] if g["name"] in names}
    assert set(ours) == set(names)
    for g in ours.values():
        assert g["source"] == libvirt_uri and g["key"] == f"{libvirt_uri}#{g['name']}"
        assert g["vcpu_delay"]["0"] > 0.05, g
        (delay,) = [d for d in g["diagnoses"] if d["signal"] == "vcpu-delay"]
        assert delay["rules"][0] == "KVM-HST-019" and "confined to 1 host CPU(s) {0}" in delay["fix"], delay
