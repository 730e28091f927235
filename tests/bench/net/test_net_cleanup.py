"""Killed and interrupted runs: ``kvmtune net cleanup`` leaves nothing; a live run is not touched."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from net_helpers import assert_nothing_left, namespaces, wait_processes_gone

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("netroot")]


def _kvmtune(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvmtune", *args], capture_output=True, text=True, timeout=120, check=False)


def _net_up(workdir: Path, *args: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvmtune", "net", "up", "--workdir", str(workdir), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    if not ready:
        proc.kill()
        pytest.fail("kvmtune net up printed nothing within 60s")
    line = proc.stdout.readline()
    if not line:
        proc.wait(timeout=30)
        pytest.fail(f"kvmtune net up exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
    return proc, json.loads(line)


@pytest.mark.parametrize(
    "args",
    [
        ("--topology", "ovs", "--hosts", "2", "--mtu", "9000", "--standins"),
        ("--topology", "user", "--standins"),
        ("--topology", "macvtap", "--standins"),
        ("--topology", "nat", "--hosts", "2", "--standins"),
    ],
    ids=["ovs-2hosts", "user", "macvtap", "nat-2hosts"],
)
def test_sigkill_then_cleanup(workdir: Path, args: tuple[str, ...]) -> None:
    proc, desc = _net_up(workdir, *args)
    runid, rundir = desc["facts"]["runid"], Path(desc["rundir"])
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    # its daemons, relays and slirp QEMU die with it (PR_SET_PDEATHSIG); its namespaces stay until cleanup
    assert not wait_processes_gone(str(rundir), 2.0)
    assert [n for n in namespaces() if n.startswith(f"kvmtune-{runid}-")]
    listed = _kvmtune("net", "list", "--workdir", str(workdir))
    assert f"{runid}" in listed.stdout and "left over" in listed.stdout
    res = _kvmtune("net", "cleanup", "--workdir", str(workdir))
    assert res.returncode == 0, res.stderr
    assert f"removed namespace kvmtune-{runid}-h0" in res.stdout
    assert_nothing_left(runid, rundir)
    again = _kvmtune("net", "cleanup", "--workdir", str(workdir))
    assert again.returncode == 0 and runid not in again.stdout


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_tears_down(workdir: Path, sig: signal.Signals) -> None:
    proc, desc = _net_up(workdir, "--topology", "ovs", "--standins")
    proc.send_signal(sig)
    assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""
    assert_nothing_left(desc["facts"]["runid"], Path(desc["rundir"]))


def test_cleanup_skips_a_live_run(workdir: Path) -> None:
    proc, desc = _net_up(workdir, "--topology", "bridge", "--standins")
    runid = desc["facts"]["runid"]
    try:
        res = _kvmtune("net", "cleanup", "--workdir", str(workdir))
        assert res.returncode == 0
        assert f"skipped run {runid}" in res.stdout
        assert f"kvmtune-{runid}-h0" in namespaces()
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    assert_nothing_left(runid, Path(desc["rundir"]))


def test_up_for_a_while_then_down(workdir: Path) -> None:
    start = time.monotonic()
    res = _kvmtune("net", "up", "--topology", "macvtap", "--hosts", "2", "--seconds", "0.2", "--workdir", str(workdir))
    assert res.returncode == 0, res.stderr
    desc = json.loads(res.stdout)
    assert {e["backend"] for e in desc["endpoints"]} == {"macvtap"}
    assert all(os.path.basename(e["chardev"]).startswith("kvmtune-") for e in desc["endpoints"])
    assert time.monotonic() - start < 60
    assert_nothing_left(desc["facts"]["runid"], Path(desc["rundir"]))
