"""A NIC experiment killed while its probe guests run: SIGTERM unwinds everything (QEMU, netload, taps, the namespace,
the run directories); after SIGKILL no process is left, and the next verify run removes the namespace (with its taps)
and the run directories the killed one left."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvmtune.bench.net.guest import find_netload
from kvmtune.errors import KvmtuneError
from kvmtune.runner import Runner
from kvmtune.verify.guestkernel import FETCH_SCRIPT, cached_kernel

pytestmark = pytest.mark.integration


@pytest.fixture
def work() -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("qemu-system-x86_64") is None:
        pytest.skip("needs root and qemu-system-x86_64")
    try:
        find_netload(None, Runner())
    except KvmtuneError as exc:
        pytest.skip(str(exc))
    if cached_kernel() is None:
        pytest.skip(f"no generic guest kernel for the e1000 side: run {FETCH_SCRIPT}")
    d = Path(tempfile.mkdtemp(prefix="kvtk-"))
    yield d
    subprocess.run([sys.executable, "-m", "kvmtune", "net", "cleanup", "--workdir", str(d)], capture_output=True,
                   timeout=120, check=False)  # a failed assertion leaves nothing either
    shutil.rmtree(d, ignore_errors=True)


def _namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _processes(text: str) -> list[str]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            raw = Path(f"/proc/{entry}/cmdline").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if state != "Z" and text.encode() in raw:
            cmd = raw.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{entry} {cmd[:100]}")
    return found


def _root_taps() -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    return [ln for ln in out.splitlines() if "kvtap-" in ln or "kvbr0" in ln]


def _running(work: Path) -> tuple[subprocess.Popen[bytes], str]:
    """``kvmtune verify --allow-tcg`` of the e1000 example, returned once both probe guests run in its namespace."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvmtune", "verify", "--examples", "--only", "KVM-NET-001", "--allow-tcg", "--repeat", "50",
         "--finding-budget", "600", "--no-store", "--workdir", str(work)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        runs = [d.name for d in (work / "net").iterdir()] if (work / "net").is_dir() else []
        qemus = [p for p in _processes(str(work)) if "qemu-system" in p]
        if runs and len(qemus) == 2 and f"kvmtune-{runs[0]}-h0" in _namespaces():
            return proc, runs[0]
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    proc.kill()
    pytest.fail(f"verify did not get its probe guests running: {proc.stderr.read().decode() if proc.stderr else ''}")


def _wait_gone(text: str, seconds: float) -> list[str]:
    deadline = time.monotonic() + seconds
    while (left := _processes(text)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _assert_nothing_left(work: Path, runid: str) -> None:
    assert not [n for n in _namespaces() if n.startswith(f"kvmtune-{runid}-")]
    assert not _processes(str(work)) and not _processes(f"kvmtune-{runid}-")
    assert not (work / "net" / runid).exists()
    assert not list(work.glob(".kvmtune-verify-*")), "a probe guest's run directory is left"
    assert _root_taps() == []


def test_sigterm_leaves_nothing(work: Path) -> None:
    proc, runid = _running(work)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=90) == 130  # SIGTERM unwinds like Ctrl-C
    _assert_nothing_left(work, runid)


def test_sigkill_leaves_only_the_namespace_and_the_next_run_sweeps_it(work: Path) -> None:
    proc, runid = _running(work)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert _wait_gone(str(work), 3.0) == []  # QEMU dies with kvmtune (PR_SET_PDEATHSIG), so does netload serve
    assert f"kvmtune-{runid}-h0" in _namespaces()  # kernel objects do not die with it: the namespace and its taps
    nxt = subprocess.run(
        [sys.executable, "-m", "kvmtune", "verify", "--examples", "--only", "KVM-NET-001", "--allow-tcg", "--repeat", "1",
         "--seconds", "0.2", "--finding-budget", "1", "--no-store", "--workdir", str(work)],
        capture_output=True, text=True, timeout=400, check=False,
    )
    assert nxt.returncode == 0, nxt.stderr
    assert f"removed leftovers of killed runs: kvmtune-{runid}-h0" in nxt.stdout
    assert "KVM-NET-001 web01-legacy" in nxt.stdout and "NOT COMPARABLE" in nxt.stdout
    _assert_nothing_left(work, runid)
    assert not (work / "net").is_dir() or list((work / "net").iterdir()) == []  # nor the next run's
