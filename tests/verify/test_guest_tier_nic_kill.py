"""A NIC experiment killed while its probe guests run: SIGTERM unwinds everything (QEMU, netload, taps, the namespace,
the run directories). After SIGKILL no QEMU, netload, tap or namespace is left at once: the namespace is held by a keeper
process that dies with kvmtune, so the kernel removes it with its bridge and taps; no scratch disk is left either. The
run directories (sockets, serial logs, owner records) are removed by the next verify run."""

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

from kvmtune.errors import KvmtuneError
from kvmtune.lab.net.netload import find_netload
from kvmtune.lab.probe.kernel import FETCH_SCRIPT, cached_kernel
from kvmtune.runner import Runner
from proc_helpers import processes_mentioning

pytestmark = pytest.mark.integration
TEARDOWN_S = 3.0  # processes reaped, the kernel's namespace teardown done


@pytest.fixture
def work() -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("qemu-system-x86_64") is None or shutil.which("lsns") is None:
        pytest.skip("needs root, qemu-system-x86_64 and lsns")
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


def _root_taps() -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    return [ln for ln in out.splitlines() if "kvtap-" in ln or "kvbr0" in ln]


def _netns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def _holders(link: str) -> list[str]:
    """What still holds the network namespace ``link`` (``net:[inode]``): a process in it, ``lsns``'s entry for it, a
    name in /run/netns (a bind mount, which lsns does not list without a process)."""
    found = [f"pid {e}" for e in os.listdir("/proc") if e.isdigit() and _netns(int(e)) == link]
    inode = link.removeprefix("net:[").removesuffix("]")
    out = subprocess.run(["lsns", "-t", "net", "-n", "-o", "NS,PID,PATH"], capture_output=True, text=True, check=True).stdout
    found += [f"lsns: {ln.strip()}" for ln in out.splitlines() if ln.split() and ln.split()[0] == inode]
    for name in os.listdir("/run/netns") if os.path.isdir("/run/netns") else []:
        try:
            if str(os.stat(f"/run/netns/{name}").st_ino) == inode:
                found.append(f"/run/netns/{name}")
        except OSError:
            continue
    return found


def _taps_in(pid: int) -> str:
    return subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", "ip", "-o", "link", "show"], capture_output=True,
                          text=True, check=False).stdout


def _running(work: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    """``kvmtune verify --allow-tcg`` of the e1000 example, returned once both probe guests run on their taps in its
    namespace (not the root one): with its run id and the namespace's ``net:[inode]``."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvmtune", "verify", "--examples", "--only", "KVM-NET-001", "--allow-tcg", "--repeat", "50",
         "--finding-budget", "600", "--no-store", "--workdir", str(work)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        runs = [d.name for d in (work / "net").iterdir()] if (work / "net").is_dir() else []
        qemus = [int(p.split()[0]) for p in processes_mentioning(str(work)) if "qemu-system" in p]
        links = {_netns(pid) for pid in qemus}
        if runs and len(qemus) == 2 and len(links) == 1 and None not in links and links != {_netns(os.getpid())}:
            taps = _taps_in(qemus[0])
            if "kvtap-a" in taps and "kvtap-b" in taps:
                return proc, runs[0], links.pop() or ""
        if proc.poll() is not None:
            break
        time.sleep(0.5)
    proc.kill()
    pytest.fail(f"verify did not get its probe guests running: {proc.stderr.read().decode() if proc.stderr else ''}")


def _wait_gone(text: str, seconds: float) -> list[str]:
    deadline = time.monotonic() + seconds
    while (left := processes_mentioning(text)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _wait_unheld(link: str, seconds: float) -> list[str]:
    deadline = time.monotonic() + seconds
    while (left := _holders(link)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _assert_no_process_tap_or_namespace(work: Path, runid: str, link: str) -> None:
    assert _wait_gone(str(work), TEARDOWN_S) == []  # QEMU dies with kvmtune (PR_SET_PDEATHSIG), so does netload serve
    assert _wait_unheld(link, TEARDOWN_S) == []  # nor is its namespace held by any process (the keeper died too)
    assert not [n for n in _namespaces() if n.startswith(f"kvmtune-{runid}-")]  # nor named in /run/netns
    assert not processes_mentioning(f"kvmtune-{runid}-")
    assert _root_taps() == []
    assert [p for p in work.rglob("*") if p.name.startswith("disk-")] == []  # no scratch disk


def _assert_nothing_left(work: Path, runid: str, link: str) -> None:
    _assert_no_process_tap_or_namespace(work, runid, link)
    assert not (work / "net" / runid).exists()
    assert not list(work.glob(".kvmtune-verify-*")), "a probe guest's run directory is left"


def test_sigterm_leaves_nothing(work: Path) -> None:
    proc, runid, link = _running(work)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=90) == 130  # SIGTERM unwinds like Ctrl-C
    _assert_nothing_left(work, runid, link)


def test_sigkill_leaves_no_qemu_tap_or_namespace_and_the_next_run_sweeps_the_run_directories(work: Path) -> None:
    proc, runid, link = _running(work)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    _assert_no_process_tap_or_namespace(work, runid, link)  # right after the kill, nothing for a sweep to remove
    assert (work / "net" / runid).is_dir()  # what is left: small files, no process, no kernel object
    nxt = subprocess.run(
        [sys.executable, "-m", "kvmtune", "verify", "--examples", "--only", "KVM-NET-001", "--allow-tcg", "--repeat", "1",
         "--seconds", "0.2", "--finding-budget", "1", "--no-store", "--workdir", str(work)],
        capture_output=True, text=True, timeout=400, check=False,
    )
    assert nxt.returncode == 0, nxt.stderr
    assert f"removed leftovers of killed runs: net/{runid}/" in nxt.stdout
    assert "KVM-NET-001 web01-legacy" in nxt.stdout and "NOT COMPARABLE" in nxt.stdout
    _assert_nothing_left(work, runid, link)
    assert not (work / "net").is_dir() or list((work / "net").iterdir()) == []  # nor the next run's
