"""``bench net --tier datapath`` with real namespaces, Open vSwitch and netload (issue 22, network part).

Tests are 1 s each and few: they check behaviour, not speed (bench/net_datapath/run.py measures that).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from net_helpers import processes_mentioning, root_namespace_leftovers, run_seeing_own_namespaces

import kvmtune.cli as cli
from kvmtune.bench.net.datapath import DatapathRun
from kvmtune.errors import KvmtuneError
from kvmtune.lab.net import TopologySpec, make_topology
from kvmtune.lab.net.netload import NETLOAD_PORT, find_netload
from kvmtune.lab.net.netns import Netns
from kvmtune.lab.store import Store
from kvmtune.runner import Runner
from proc_helpers import descendants

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("netroot")]
KVMTUNE = [sys.executable, "-m", "kvmtune"]


@pytest.fixture
def netload() -> str:
    try:
        return find_netload(None, Runner())
    except KvmtuneError as exc:
        pytest.skip(str(exc))


def _nothing_left(workdir: Path) -> None:
    runs = workdir / "net"
    assert not runs.exists() or not list(runs.iterdir()), list(runs.iterdir())
    assert not processes_mentioning(str(workdir)), processes_mentioning(str(workdir))
    assert not root_namespace_leftovers()


@pytest.mark.parametrize("kind", ["bridge", "macvtap"])
def test_namespace_twins_are_configured_as_the_guests_would_be(kind: str, workdir: Path) -> None:
    spec = TopologySpec(kind, mtu=9000, txqueuelen=500, attach="netns")
    with make_topology(spec, workdir=workdir) as topo:
        client, server = topo.pairs()[0]
        for ep in (client, server):
            assert ep.guest_netns == f"kvmtune-{topo.runid}-g{ep.name}"
            eth0 = Netns(ep.guest_netns, Runner()).link_json("eth0")
            assert eth0["address"] == ep.mac and eth0["mtu"] == 9000 and eth0["txqlen"] == 500
            addrs = Runner().run(["ip", "-n", ep.guest_netns, "-4", "-o", "addr", "show", "dev", "eth0"]).stdout
            assert ep.address in addrs
            info = eth0["linkinfo"]
            if kind == "macvtap":  # the twin: a macvlan in bridge mode on the topology's lower device
                assert info["info_kind"] == "macvlan" and info["info_data"]["mode"] == "bridge"
            else:  # a veth whose host end is a bridge port where the guest's tap would be
                assert info["info_kind"] == "veth"
                host_end = topo.host_ns(0).link_json(ep.ifname or "")
                assert host_end["master"] == "kvbr0" and host_end["txqlen"] == 500
        rundir = topo.rundir
    _nothing_left(workdir)
    assert not rundir.exists()


def test_bridge_and_ovs_store_datapath_cells_and_report_the_winner(
    workdir: Path, netload: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "r.db"
    argv = ["bench", "net", "--tier", "datapath", "--topology", "bridge,ovs", "--tests", "rr1c-1x1--1,str-readx30k--10",
            "--duration", "1", "--pairs", "2", "--mtu", "9000", "--netload", netload, "--workdir", str(workdir),
            "--db", str(db)]
    assert cli.main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "[datapath tier]: 8 cells ok, 0 failed" in out
    with Store(db) as st:
        run = st.runs()[0]
        cells = st.cells(run.id)
    assert run.kind == "net" and run.env["tier"] == "datapath" and run.accel == "none"
    assert sorted({c.config["topology"] for c in cells}) == ["bridge", "ovs"] and len(cells) == 8
    for c in cells:
        assert c.status == "ok", c.error
        assert c.config["tier"] == "datapath" and c.config["mtu"] == 9000 and c.config["pair"] == c.rep
        assert c.metrics["transactions"] > 0 and c.metrics["path_cpu_us_per_txn"] > 0
    ovs = [c for c in cells if c.config["topology"] == "ovs"]
    if ovs[0].config["ovs_datapath"] == "netdev":  # the userspace datapath forwards in ovs-vswitchd: its CPU counts
        assert sum(c.metrics["daemon_cpu_s"] for c in ovs) > 0
    assert all(0 <= c.metrics["ovs_unforwarded_pct"] <= 100 for c in ovs)  # read from OVS's own port counters
    assert not any("ovs_unforwarded_pct" in c.metrics for c in cells if c.config["topology"] == "bridge")
    assert all(c.metrics["daemon_cpu_s"] == 0 for c in cells if c.config["topology"] == "bridge")
    # a 9000-byte MTU really ran end to end: streaming moved full 30 KiB messages without loss of the run
    assert all(c.metrics["bytes"] > 0 for c in cells if c.workload == "str-readx30k--10")
    _nothing_left(workdir)

    assert cli.main(["report", str(run.id), "--db", str(db)]) == 0
    report = capsys.readouterr().out
    line = next(ln for ln in report.splitlines() if "seed:002" in ln)
    assert "[datapath tier]" in line and "MTU 9000, 1 host, 2 pairs" in line
    assert "small transactions: " in line and "streaming: " in line and "over" in line

    # a run of two topologies is summarised by report, not compared cell by cell
    assert cli.main(["compare", str(run.id), str(run.id), "--db", str(db)]) == 2
    assert "kvmtune report" in capsys.readouterr().err


# what a lossy link does, inside the server's stand-in namespace (sch_netem is not always there; nftables is):
# a share of the TCP data segments that reach the server is dropped; never a SYN (connecting is not what is
# measured) and never the control connection's
LOSS_RULES = """table inet kvmtune_loss {{
  chain input {{ type filter hook input priority 0; meta l4proto tcp tcp sport != {port} tcp dport != {port}
                 tcp flags & syn == 0 meta length > 200 numgen random mod 100 < {pct} drop; }}
}}"""


def test_a_lossy_path_ends_a_timed_test_on_time_and_records_the_retransmits(
    workdir: Path, netload: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """TCP on a path that drops 20 % of the data segments backs off (netload 0.2.0 then held the test for 20 s
    and failed it: a write blocked behind a retransmission timeout, and the server waiting for what was still in
    flight); the test still ends about its duration after it started: the writes still blocked at the end are
    cut, the server waits netload's drain (1 s) for what is in flight, and the cell is ok, with the retransmits
    TCP made and the messages still undelivered then."""
    start_servers = DatapathRun.start_servers

    def lossy(self: DatapathRun, t: Any) -> None:
        for _client, server in t.topo.pairs():
            t.ns(server).exec("nft", "-f", "-", input_text=LOSS_RULES.format(port=NETLOAD_PORT, pct=20))
        start_servers(self, t)

    monkeypatch.setattr(DatapathRun, "start_servers", lossy)
    db = tmp_path / "r.db"
    duration = 2.0
    argv = ["bench", "net", "--tier", "datapath", "--topology", "bridge", "--tests", "str-writex30k--50",
            "--duration", f"{duration:g}", "--netload", netload, "--workdir", str(workdir), "--db", str(db)]
    assert cli.main(argv) == 0, capsys.readouterr().out
    with Store(db) as st:
        (cell,) = st.cells(st.runs()[0].id)
    assert cell.status == "ok", cell.error
    assert cell.metrics["tcp_retransmits"] > 100  # the loss is recorded, not hidden
    assert cell.metrics["measured_s"] <= duration + 0.5  # the measured phase is the duration
    # start, 50 connects, the drain (at most 1 s) and the report: seconds, not the tens of seconds of TCP backoff
    assert cell.duration_s is not None and cell.duration_s <= duration + 1.0 + 4.0, cell.duration_s
    assert cell.metrics["undelivered_messages"] >= 0 and cell.metrics["bytes"] > 0
    _nothing_left(workdir)


def test_macvtap_twin_and_nat_two_hosts(workdir: Path, netload: str, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "r.db"
    argv = ["bench", "net", "--tier", "datapath", "--topology", "macvtap,nat", "--hosts", "2", "--tests",
            "rr1c-200x1000--10", "--duration", "1", "--netload", netload, "--workdir", str(workdir), "--db", str(db)]
    code = cli.main(argv)
    out = capsys.readouterr().out
    assert code == 0, out
    assert "macvtap measured through its namespace twin: a macvlan" in out
    with Store(db) as st:
        cells = st.cells(st.runs()[0].id)
    assert {c.config["topology"]: c.config["attach"] for c in cells} == {"macvtap": "macvlan", "nat": "veth"}
    assert all(c.status == "ok" and c.config["hosts"] == 2 and c.metrics["tps"] > 0 for c in cells), cells
    _nothing_left(workdir)


def test_interrupt_mid_test_leaves_nothing_and_marks_the_run_partial(workdir: Path, netload: str, tmp_path: Path) -> None:
    db = tmp_path / "r.db"
    listing = tmp_path / "ns.txt"
    argv = [*KVMTUNE, "bench", "net", "--tier", "datapath", "--topology", "ovs", "--tests", "str-writex30k--10",
            "--duration", "30", "--netload", netload, "--workdir", str(workdir), "--db", str(db)]
    # interrupt from inside the private /run/netns once netload runs: SIGTERM, which kvmtune handles as Ctrl-C
    # (a background job of a non-interactive shell ignores SIGINT)
    script = (f'"$@" & pid=$!; for i in $(seq 1 300); do ls {workdir}/net/*/run-c0.json >/dev/null 2>&1 && break; '
              'sleep 0.05; done; sleep 0.5; kill -TERM $pid; wait $pid')
    res, left = run_seeing_own_namespaces(["sh", "-c", script, "sh", *argv], listing)
    assert res.returncode == 130, res.stderr[-600:]
    assert "marked partial" in res.stderr
    assert left == [], left
    _nothing_left(workdir)
    with Store(db) as st:
        assert st.runs()[0].status == "partial"


def _alive(procs: dict[int, str]) -> list[int]:
    out = []
    for pid, start in procs.items():
        try:
            rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if rest[19] == start and rest[0] not in ("Z", "X"):
            out.append(pid)
    return out


def test_sigkill_mid_test_leaves_no_process_and_cleanup_removes_the_rest(workdir: Path, netload: str,
                                                                         tmp_path: Path) -> None:
    argv = [*KVMTUNE, "bench", "net", "--tier", "datapath", "--topology", "ovs", "--tests", "str-readx30k--1",
            "--duration", "30", "--netload", netload, "--workdir", str(workdir), "--db", str(tmp_path / "r.db")]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen: dict[int, str] = {}
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        seen.update(descendants(proc.pid))
        if list((workdir / "net").glob("*/run-c0.json")):  # a client is measuring
            break
        time.sleep(0.05)
    time.sleep(0.3)
    seen.update(descendants(proc.pid))
    assert proc.poll() is None, "the run ended before netload ran"
    assert len(seen) >= 4, seen  # OVS daemons, netload server and client
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    gone = time.monotonic() + 3
    while _alive(seen) and time.monotonic() < gone:
        time.sleep(0.05)
    assert not _alive(seen), _alive(seen)
    # what the kernel keeps (namespaces, links) goes with the next run's sweep or `net cleanup`
    res = subprocess.run([*KVMTUNE, "net", "cleanup", "--workdir", str(workdir)], capture_output=True, text=True,
                         timeout=60, check=False)
    assert res.returncode == 0, res.stderr
    _nothing_left(workdir)
