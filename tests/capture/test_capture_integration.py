"""kvmtune capture against the probe guest under TCG with a planted fio pattern (the pattern is checked, not the speed).

The guest's disk is throttled over QMP (block_set_io_throttle) so that the requests fio keeps in flight wait in QEMU,
where the trace events see them: without it, under TCG QEMU completes each request before the emulated guest has
submitted the next, and the depth at the device is about 1 whatever fio's iodepth.
"""

from __future__ import annotations

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

from kvmtune.qemu.qmp import Qmp
from loaded_guest import throttled_probe

pytestmark = pytest.mark.integration



def kvmtune(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvmtune", *args], capture_output=True, text=True, env=os.environ,
                          timeout=timeout)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    work = tmp_path_factory.mktemp("capture")
    name = f"cap{os.getpid()}"
    with throttled_probe(work, name, seconds=150):
        yield name, work


def qmp_state(work: Path, name: str) -> tuple[dict[str, str], list[dict[str, Any]]]:
    (qmp_path,) = work.glob(f"run-{name}-*/{name}.qmp")
    q = Qmp(qmp_path, timeout=10)
    try:
        events = {e["name"]: e["state"] for e in q.execute("trace-event-get-state", name="virtio_blk_*")}
        return events, q.execute("query-blockstats")
    finally:
        q.close()


def sigkill_a_trace_capture(name: str, work: Path, out: Path) -> None:
    """A 30 s trace capture of the guest into ``out``, SIGKILLed 3 s after it wrote its marker (its events and
    histograms on): what it switched on is left on for the next command to undo."""
    proc = subprocess.Popen([sys.executable, "-m", "kvmtune", "capture", name, "--no-libvirt", "--workdir", str(work),
                             "--seconds", "30", "--source", "trace", "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ)
    deadline = time.monotonic() + 30
    while not list(work.glob("capture-active-*.json")) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert list(work.glob("capture-active-*.json")), "the capture never wrote its marker"
    time.sleep(3)  # its events and histograms are on
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_a_sigkilled_capture_is_undone_by_the_next_doctor_and_it_says_so(loaded: tuple[str, Path]) -> None:
    name, work = loaded
    sigkill_a_trace_capture(name, work, work / "killed.json")
    events, stats = qmp_state(work, name)
    assert events["virtio_blk_handle_read"] == "enabled"  # the kill left them on: what the next command must undo
    assert "rd_latency_histogram" in stats[0]["stats"]
    done = kvmtune("doctor", "--workdir", str(work), "--format", "json")
    restored = [c["detail"] for c in json.loads(done.stdout)["checks"] if c["what"] == "capture leftovers"]
    assert len(restored) == 1 and "trace event virtio_blk_handle_read off" in restored[0], done.stdout
    assert "latency histogram of /machine/" in restored[0]
    events, stats = qmp_state(work, name)
    assert set(events.values()) == {"disabled"}, events
    assert not any("rd_latency_histogram" in s["stats"] for s in stats)
    assert not list(work.glob("capture-active-*.json")) and not (work / "killed.json").exists()


def test_trace_and_blockstats_captures_find_the_planted_pattern(loaded: tuple[str, Path]) -> None:
    name, work = loaded
    out = work / "trace.json"
    done = kvmtune("capture", name, "--no-libvirt", "--workdir", str(work), "--seconds", "10", "--source", "trace",
                   "-o", str(out))
    assert done.returncode == 0, done.stderr
    (disk,) = json.loads(out.read_text())["disks"]
    assert 0.65 <= disk["read_fraction"] <= 0.75, disk
    assert disk["size_bytes"]["p50"] == 16384
    assert disk["sequential_fraction"] < 0.2
    assert 4 <= disk["queue_depth"]["mean"] <= 12, disk["queue_depth"]
    assert (work / "trace.json.iolog").read_text().startswith("fio version 3 iolog\n")
    events, _ = qmp_state(work, name)
    assert set(events.values()) == {"disabled"}  # switched off at the end
    stats = work / "stats.json"
    done = kvmtune("capture", name, "--no-libvirt", "--workdir", str(work), "--seconds", "10", "--source",
                   "blockstats", "-o", str(stats))
    assert done.returncode == 0, done.stderr
    (sdisk,) = json.loads(stats.read_text())["disks"]
    assert abs(sdisk["read_fraction"] - disk["read_fraction"]) <= 0.07
    assert abs(sdisk["size_bytes"]["mean"] - disk["size_bytes"]["mean"]) <= 0.1 * disk["size_bytes"]["mean"]
    assert not (work / "stats.json.iolog").exists()
    shown = kvmtune("capture", "--show", str(out))
    assert shown.returncode == 0 and "from trace" in shown.stdout


def test_sigterm_ends_a_capture_early_with_its_file_written_and_the_events_off(loaded: tuple[str, Path]) -> None:
    name, work = loaded
    out = work / "term.json"
    (qemu_err,) = work.glob(f"run-{name}-*/{name}.stderr")
    since = qemu_err.stat().st_size
    proc = subprocess.Popen([sys.executable, "-m", "kvmtune", "capture", name, "--no-libvirt", "--workdir", str(work),
                             "--seconds", "60", "--source", "trace", "-o", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=os.environ)
    # the marker is written before the events are switched on, and on a loaded host QMP answers a TCG guest's
    # monitor slowly: wait until QEMU writes trace lines (the capture records), then let it run
    deadline = time.monotonic() + 60
    while b"virtio_blk_" not in qemu_err.read_bytes()[since:] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()[1]
    time.sleep(6)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    (disk,) = json.loads(out.read_text())["disks"]
    assert disk["source"] == "trace" and 2 <= disk["seconds"] < 20
    events, stats = qmp_state(work, name)
    assert set(events.values()) == {"disabled"}
    assert not any("rd_latency_histogram" in s["stats"] for s in stats)
    assert not list(work.glob("capture-active-*.json"))


def test_the_next_capture_undoes_a_sigkilled_one_and_says_so(loaded: tuple[str, Path]) -> None:
    name, work = loaded
    sigkill_a_trace_capture(name, work, work / "killed2.json")
    done = kvmtune("capture", name, "--no-libvirt", "--workdir", str(work), "--seconds", "2", "--source", "blockstats",
                   "-o", str(work / "after.json"))
    assert done.returncode == 0, done.stderr
    assert "restored after a killed capture of pid" in done.stdout and "virtio_blk_rw_complete off" in done.stdout
    events, stats = qmp_state(work, name)
    assert set(events.values()) == {"disabled"}
    assert not any("rd_latency_histogram" in s["stats"] for s in stats)


def set_event(work: Path, name: str, event: str, enable: bool) -> None:
    (qmp_path,) = work.glob(f"run-{name}-*/{name}.qmp")
    q = Qmp(qmp_path, timeout=10)
    try:
        q.execute("trace-event-set-state", name=event, enable=enable)
    finally:
        q.close()


def test_auto_falls_back_to_blockstats_when_the_events_are_not_to_be_had_and_says_why(loaded: tuple[str, Path]) -> None:
    """Someone else (here the test, over the guest's QMP) has an event on: capture does not take it over. --source
    auto records statistics and says why, --source trace refuses and writes nothing, and the event stays as found."""
    name, work = loaded
    set_event(work, name, "virtio_blk_handle_read", True)
    try:
        out = work / "auto.json"
        done = kvmtune("capture", name, "--no-libvirt", "--workdir", str(work), "--seconds", "3", "-o", str(out))
        assert done.returncode == 0, done.stderr
        assert ("statistics only: virtio_blk_handle_read already enabled by someone else; not taken over"
                in done.stdout), done.stdout
        (disk,) = json.loads(out.read_text())["disks"]
        assert disk["source"] == "blockstats" and 0.6 <= disk["read_fraction"] <= 0.8, disk
        assert disk["size_bytes"]["p50"] is None and not (work / "auto.json.iolog").exists()
        refused = kvmtune("capture", name, "--no-libvirt", "--workdir", str(work), "--seconds", "3", "--source",
                          "trace", "-o", str(work / "refused.json"))
        assert refused.returncode != 0 and "per-request mode refused" in refused.stderr, refused.stderr
        assert not (work / "refused.json").exists()
        events, _ = qmp_state(work, name)
        assert events["virtio_blk_handle_read"] == "enabled"  # as found: not taken over, not switched off
        assert events["virtio_blk_handle_write"] == events["virtio_blk_rw_complete"] == "disabled"
        assert not list(work.glob("capture-active-*.json"))
    finally:
        set_event(work, name, "virtio_blk_handle_read", False)


def test_source_blktrace_on_a_file_backed_disk_is_refused_in_one_line_and_changes_nothing(
        loaded: tuple[str, Path]) -> None:
    name, work = loaded
    res = kvmtune("capture", name, "--no-libvirt", "--workdir", str(work), "--seconds", "2", "--source", "blktrace",
                  "-o", str(work / "bt.json"))
    assert res.returncode != 0 and "--source blktrace refused" in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not (work / "bt.json").exists()
    events, stats = qmp_state(work, name)
    assert set(events.values()) == {"disabled"}
    assert not any("rd_latency_histogram" in s["stats"] for s in stats)
