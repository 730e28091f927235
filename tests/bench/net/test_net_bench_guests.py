"""bench net with real probe guests (TCG): every topology moves data both ways; killed runs leave nothing."""

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
from net_helpers import assert_nothing_left, namespaces, processes_mentioning, wait_processes_gone

from kvmtune.bench.net.catalog import select_tests
from kvmtune.bench.net.guest import NetBenchmark, NetContext, guest_files
from kvmtune.errors import KvmtuneError
from kvmtune.host.root import HostRoot
from kvmtune.lab.accel import AccelChoice
from kvmtune.lab.guest import GuestBuilder, ProbeGuest
from kvmtune.lab.net import TopologySpec
from kvmtune.lab.net.netload import find_netload
from kvmtune.lab.runner import BenchRunner
from kvmtune.lab.store import Store
from kvmtune.runner import Runner

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("netroot")]
TCG = AccelChoice("tcg", "tests run under TCG", 0.0)


@pytest.fixture(scope="module")
def guest_env() -> Iterator[tuple[Path, ProbeGuest, str]]:
    if os.geteuid() != 0 or shutil.which("qemu-system-x86_64") is None:
        pytest.skip("needs root and qemu-system-x86_64")
    runner = Runner()
    try:
        netload = find_netload(None, runner)
    except KvmtuneError as exc:
        pytest.skip(str(exc))
    work = Path(tempfile.mkdtemp(prefix="kvtg-"))
    try:
        guest = GuestBuilder(work, runner, extra=guest_files(netload)).build()
    except KvmtuneError as exc:
        shutil.rmtree(work, ignore_errors=True)
        pytest.skip(f"no probe guest here: {exc}")
    yield work, guest, netload
    shutil.rmtree(work, ignore_errors=True)


CASES = [("bridge", 2, 9000), ("ovs", 1, 1500), ("macvtap", 1, 9000), ("nat", 1, 1500), ("user", 1, 1500)]


@pytest.mark.parametrize("kind, hosts, mtu", CASES, ids=[f"{k}-h{h}-mtu{m}" for k, h, m in CASES])
def test_one_pair_both_directions(guest_env: tuple[Path, ProbeGuest, str], kind: str, hosts: int, mtu: int,
                                  tmp_path: Path) -> None:
    work, guest, netload = guest_env
    store = Store(tmp_path / "r.db")
    ctx = NetContext(
        runner=Runner(), host=HostRoot(), accel=TCG, workdir=work, guest=guest,
        spec=TopologySpec(kind, hosts=hosts, mtu=mtu),
        tests=select_tests(["str-readx30k--1", "str-writex30k--1"], None), duration_s=2,
    )
    outcome = BenchRunner(store, args={"topology": kind}).run(NetBenchmark(ctx, netload))
    run_id = outcome.run_id
    assert outcome.failed == 0, [(c.workload, c.error) for c in ctx.results]
    assert store.run(run_id).status == "complete"
    for cell in ctx.results:
        m = cell.metrics
        assert m["throughput_Bps"] > 0 and m["bytes"] > 0, cell.workload
        assert m["guest_mtu"] == mtu
        assert m["qemu_client_cpu_pct"] > 0 and m["qemu_server_cpu_pct"] > 0
    cells = store.cells(run_id)
    assert {c.workload for c in cells} == {"str-readx30k--1", "str-writex30k--1"}
    assert all(c.status == "ok" and c.config["topology"] == kind for c in cells)
    store.close()
    runid = ctx.topology_facts["runid"]
    assert_nothing_left(runid, work / "net" / runid)  # QEMU's command line names the run directory


def _bench_with_guests_running(work: Path, netload: str, db: Path) -> tuple[subprocess.Popen[bytes], str]:
    """Start ``kvmtune bench net`` over OVS; return once both QEMUs and both OVS daemons run."""
    before = set(namespaces())
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvmtune", "bench", "net", "--topology", "ovs", "--tests", "str-readx30k--1",
         "--duration", "60", "--accel", "tcg", "--workdir", str(work), "--netload", netload, "--db", str(db)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    ours: list[str] = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:  # wait until both QEMUs run in the run's namespaces
        ours = [n for n in namespaces() if n not in before and n.startswith("kvmtune-")
                and (work / "net" / n.split("-")[1]).is_dir()]
        if ours and len(processes_mentioning(str(work / "net"))) >= 4:  # 2 OVS daemons + 2 QEMU
            break
        time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail(f"bench net did not get its guests running: {proc.stderr.read() if proc.stderr else ''}")
    return proc, ours[0].split("-")[1]


def test_killed_bench_then_cleanup(guest_env: tuple[Path, ProbeGuest, str], tmp_path: Path) -> None:
    work, _, netload = guest_env
    proc, runid = _bench_with_guests_running(work, netload, tmp_path / "r.db")
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    # QEMU and OVS die with the killed run (PR_SET_PDEATHSIG); its namespaces stay until cleanup
    assert not wait_processes_gone(f"{work}/net/{runid}", 2.0)
    assert [n for n in namespaces() if n.startswith(f"kvmtune-{runid}-")]
    res = subprocess.run([sys.executable, "-m", "kvmtune", "net", "cleanup", "--workdir", str(work)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode == 0, res.stderr
    assert f"removed namespace kvmtune-{runid}-" in res.stdout
    assert_nothing_left(runid, work / "net" / runid)


def test_ctrl_c_bench_leaves_nothing(guest_env: tuple[Path, ProbeGuest, str], tmp_path: Path) -> None:
    work, _, netload = guest_env
    proc, runid = _bench_with_guests_running(work, netload, tmp_path / "r.db")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 130
    assert_nothing_left(runid, work / "net" / runid)
    with Store(tmp_path / "r.db") as st:
        assert st.runs()[-1].status == "partial"
