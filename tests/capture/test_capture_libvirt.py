"""kvmtune capture of a libvirt guest, against the real libvirtd the suite starts (scripts/services.sh), TCG.

The probe guest runs as a libvirt domain with two virtio disks (vda under a planted fio pattern, vdb idle). Its QMP is
reached through libvirt (virDomainQemuMonitorCommand), its trace events read from its log in /var/log/libvirt/qemu,
its disks named by target. vda is throttled to 600 IOPS through libvirt (blkdeviotune) for the reason
test_capture_integration.py gives: under TCG QEMU otherwise completes each request before the guest sends the next.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from probe_domain import running_probe_domain

pytestmark = pytest.mark.integration

JOB = "rw=randrw rwmixread=70 bs=16k iodepth=8"


VIRTIO = """
    <disk type='file' device='disk'><driver name='qemu' type='raw' cache='none' io='threads'/>
      <source file='{work}/vda.raw'/><target dev='vda' bus='virtio'/></disk>
    <disk type='file' device='disk'><driver name='qemu' type='raw' cache='none' io='threads'/>
      <source file='{work}/vdb.raw'/><target dev='vdb' bus='virtio'/></disk>"""
SCSI = """
    <controller type='scsi' index='0' model='virtio-scsi'/>
    <disk type='file' device='disk'><driver name='qemu' type='raw' cache='none' io='threads'/>
      <source file='{work}/sda.raw'/><target dev='sda' bus='scsi'/></disk>
    <disk type='file' device='disk'><driver name='qemu' type='raw' cache='none' io='threads'/>
      <source file='{work}/vdb.raw'/><target dev='vdb' bus='virtio'/></disk>"""


def kvmtune(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvmtune", *args], capture_output=True, text=True, env=os.environ,
                          timeout=timeout)


def running(work: Path, libvirt_uri: str, disks: str, busy: str, idle: str,
            iops: int = 600) -> contextlib.AbstractContextManager[tuple[str, Any, Path]]:
    """The probe guest as a libvirt domain under :data:`JOB` (see :func:`probe_domain.running_probe_domain`)."""
    return running_probe_domain(work, libvirt_uri, disks, busy, idle, JOB, iops=iops)


@pytest.fixture(scope="module")
def domain(tmp_path_factory: pytest.TempPathFactory, libvirt_uri: str) -> Iterator[tuple[str, Any, Path]]:
    with running(tmp_path_factory.mktemp("capture-libvirt"), libvirt_uri, VIRTIO, "vda", "vdb") as d:
        yield d


def trace_states(dom: Any) -> dict[str, str]:
    import libvirt_qemu

    reply = json.loads(libvirt_qemu.qemuMonitorCommand(
        dom, json.dumps({"execute": "trace-event-get-state", "arguments": {"name": "virtio_blk_*"}}), 0))
    return {e["name"]: e["state"] for e in reply["return"]}


def test_a_libvirt_guest_is_captured_by_target_through_libvirt_and_its_log(domain: tuple[str, Any, Path]) -> None:
    name, dom, work = domain
    out = work / "trace.json"
    done = kvmtune("capture", name, "--disk", "vda", "--workdir", str(work), "--seconds", "8", "--source", "trace",
                   "-o", str(out))
    assert done.returncode == 0, done.stderr
    (disk,) = json.loads(out.read_text())["disks"]
    assert disk["target"] == "vda" and disk["source"] == "trace"
    assert 0.65 <= disk["read_fraction"] <= 0.75, disk
    assert disk["size_bytes"]["p50"] == 16384
    assert disk["sequential_fraction"] < 0.2
    # requests queue behind the throttle (the 4-12 is held by test_capture_integration.py's probe guest; a
    # libvirt domain's TCG guest beside CI's other lane kept 2.0-3.6 in flight: queued, but not always 4)
    assert 1.5 <= disk["queue_depth"]["mean"] <= 12, disk["queue_depth"]
    assert "tainted custom-monitor" in done.stdout
    assert "custom-monitor" in Path(f"/var/log/libvirt/qemu/{name}.log").read_text(errors="replace")
    assert set(trace_states(dom).values()) == {"disabled"}  # switched off at the end
    stats = work / "stats.json"
    done = kvmtune("capture", name, "--workdir", str(work), "--seconds", "4", "--source", "blockstats", "-o", str(stats))
    assert done.returncode == 0, done.stderr
    (sdisk,) = json.loads(stats.read_text())["disks"]  # vdb did nothing, so only vda is written
    assert sdisk["target"] == "vda" and abs(sdisk["read_fraction"] - disk["read_fraction"]) <= 0.07
    bad = kvmtune("capture", name, "--disk", "d0", "--workdir", str(work), "--seconds", "1", "--source", "blockstats",
                  "-o", str(work / "no.json"))
    assert bad.returncode != 0 and "--disk d0: not one of this guest's disks (vda, vdb)" in bad.stderr
    assert not (work / "no.json").exists()


def test_a_sigkilled_libvirt_capture_is_undone_through_libvirt_by_the_next_doctor(domain: tuple[str, Any, Path]) -> None:
    name, dom, work = domain
    proc = subprocess.Popen([sys.executable, "-m", "kvmtune", "capture", name, "--workdir", str(work), "--seconds",
                             "30", "--source", "trace", "-o", str(work / "killed.json")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ)
    deadline = time.monotonic() + 30
    while not list(work.glob("capture-active-*.json")) and time.monotonic() < deadline:
        time.sleep(0.1)
    (marker,) = work.glob("capture-active-*.json")
    assert json.loads(marker.read_text())["libvirt"]["name"] == name
    time.sleep(3)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert trace_states(dom)["virtio_blk_rw_complete"] == "enabled"
    done = kvmtune("doctor", "--workdir", str(work), "--format", "json")
    restored = [c["detail"] for c in json.loads(done.stdout)["checks"] if c["what"] == "capture leftovers"]
    assert len(restored) == 1 and f"(libvirt domain {name})" in restored[0], done.stdout
    assert "trace event virtio_blk_rw_complete off" in restored[0]
    assert set(trace_states(dom).values()) == {"disabled"}
    assert not list(work.glob("capture-active-*.json"))


def test_a_scsi_disk_behind_virtio_scsi_is_traced_by_target_and_lun(tmp_path: Path, libvirt_uri: str) -> None:
    """scsi-hd has no event naming a device: its requests are paired by (scsi-id, lun, tag) from QEMU's generic SCSI
    events and put on sda by its blockstats, beside an idle virtio-blk vdb."""
    # 200 IOPS: the emulated SCSI path costs the TCG guest more per request than virtio-blk's, and on a loaded host
    # it could not keep 600 IOPS busy, so the throttle held no queue (depth mean 2.5-3.7 measured at load 4-5)
    with running(tmp_path / "scsi", libvirt_uri, SCSI, "sda", "vda", iops=200) as (name, dom, work):
        out = work / "scsi.json"
        done = kvmtune("capture", name, "--workdir", str(work), "--seconds", "8", "--source", "trace", "-o", str(out))
        assert done.returncode == 0, (done.stderr, (work / "serial.log").read_bytes()[-600:])
        disks = {d["target"]: d for d in json.loads(out.read_text())["disks"]}
        # the idle vdb gets none of fio's requests; the guest kernel's late partition probe of it may still fall
        # into the window (a full CI run: two disks where one was expected): a few reads, no write
        assert set(disks) <= {"sda", "vdb"}, disks
        if "vdb" in disks:
            idle = disks.pop("vdb")["ops"]
            assert idle["write"] == 0 and idle["read"] <= 32, idle
        disk = disks["sda"]
        assert disk["source"] == "trace", disk
        assert 0.65 <= disk["read_fraction"] <= 0.75, disk
        assert disk["size_bytes"]["p50"] == 16384 and disk["sequential_fraction"] < 0.2
        assert 1.5 <= disk["queue_depth"]["mean"] <= 12, disk["queue_depth"]  # as above
        assert (work / "scsi.json.iolog").read_text().startswith("fio version 3 iolog\n")
        import libvirt_qemu

        reply = json.loads(libvirt_qemu.qemuMonitorCommand(
            dom, json.dumps({"execute": "trace-event-get-state", "arguments": {"name": "scsi_req_*"}}), 0))
        assert {e["state"] for e in reply["return"]} == {"disabled"}


def test_a_domain_destroyed_during_a_capture_ends_it_with_one_line_and_nothing_written(tmp_path: Path,
                                                                                       libvirt_uri: str) -> None:
    with running(tmp_path / "gone", libvirt_uri, VIRTIO, "vda", "vdb") as (name, dom, work):
        out = work / "gone.json"
        proc = subprocess.Popen([sys.executable, "-m", "kvmtune", "capture", name, "--workdir", str(work), "--seconds",
                                 "30", "--source", "trace", "-o", str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ)
        deadline = time.monotonic() + 30
        while not list(work.glob("capture-active-*.json")) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(2)
        dom.destroy()
        _, err = proc.communicate(timeout=60)
        assert proc.returncode != 0 and len(err.strip().splitlines()) == 1, err
        assert err.startswith("kvmtune: ") and "Traceback" not in err and "the capture broke off" in err, err
        assert "nothing written" in err
        assert not out.exists() and not list(work.glob(".gone.json.part*"))
        assert not list(work.glob("capture-active-*.json"))  # that QEMU is gone: nothing left to restore
