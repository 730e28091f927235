"""bench net without a system: test names, tunings, guest jobs and agent commands, cells from what netload returned,
netload metrics, the seed-002 chart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvmtune.bench.net.catalog import MATRICES, parse_test, parse_tunings, select_tests
from kvmtune.bench.net.chart import aggregate, pct_better, seed002_rows, text_table
from kvmtune.bench.net.guest import NetContext, guest_job, last_error, netload_env, run_argv, serve_argv, warm_argv
from kvmtune.bench.net.guest import _cell as net_cell
from kvmtune.host.root import HostRoot
from kvmtune.lab.accel import AccelChoice
from kvmtune.lab.guest import ProbeGuest
from kvmtune.lab.net import Endpoint, NetError
from kvmtune.lab.net.netload import netload_metrics
from kvmtune.lab.net.topology import TopologySpec
from kvmtune.lab.probe.side import ExecResult
from kvmtune.lab.store import CellRow, Store
from kvmtune.runner import Runner


def test_seed_002_matrix_is_twenty_tests_in_seed_order() -> None:
    tests = select_tests(None, "seed-002")
    assert len(tests) == 20 == len(MATRICES["seed-002"])
    assert tests[0].name == "rr1c-1x1--1" and tests[-1].name == "str-writex30k--250"
    assert {t.users for t in tests} == {1, 10, 50, 250}


def test_test_names() -> None:
    t = parse_test("rr1c-200x1000--10")
    assert (t.workload, t.users, t.kind) == ("rr1c-200x1000", 10, "rr")
    assert parse_test("str-readx64k--3").kind == "str"
    for bad in ("rr1c-1x1", "tcp_rr--1", "str-readx30k--0", "str-readx30k--5000", "rr2c-1x1--1"):
        with pytest.raises(NetError, match="test"):
            parse_test(bad)
    with pytest.raises(NetError, match="unknown matrix 'seed-003'"):
        select_tests(None, "seed-003")
    assert [t.name for t in select_tests(["rr1c-1x1--1", "rr1c-1x1--1"], None)] == ["rr1c-1x1--1"]


def test_tunings() -> None:
    t = parse_tunings("txqueuelen=2500, guest.net.ipv4.tcp_timestamps=0,guest.net.core.rmem_max=4194304")
    assert t.txqueuelen == 2500
    assert t.guest_sysctls == (("net.ipv4.tcp_timestamps", "0"), ("net.core.rmem_max", "4194304"))
    assert t.tag() == "txqueuelen=2500,guest.net.ipv4.tcp_timestamps=0,guest.net.core.rmem_max=4194304"
    for bad, msg in [
        ("halt_poll_ns=80000", "host-wide KVM parameter"),
        ("txqueuelen=lots", "a number"),
        ("guest.kernel.panic=1", "net.core"),
        ("guest.net.ipv4.tcp_rmem=1;reboot", "numeric"),
        ("mtu=9000", "unknown tuning"),
        ("txqueuelen", "KEY=VALUE"),
    ]:
        with pytest.raises(NetError, match=msg):
            parse_tunings(bad)


def _guest() -> ProbeGuest:
    return ProbeGuest(
        vmlinux=None, kernel=Path("/boot/vmlinuz"), initrd=Path("/x.cpio"), key="k", release="6.1", modules=("virtio_net",),
        missing_optional=(), tools=(), size=1, cached=True,
        module_paths=("kernel/net/core/failover.ko", "kernel/drivers/net/net_failover.ko", "kernel/drivers/net/virtio_net.ko",
                      "kernel/drivers/block/virtio_blk.ko"),
        module_deps={"virtio_net": ("net_failover",), "net_failover": ("failover",)},
    )


def _ep(name: str, backend: str = "tap", **kw: object) -> Endpoint:
    role = "client" if name.startswith("c") else "server"
    ip = "198.18.0.10" if role == "client" else "198.18.0.110"
    base: dict[str, object] = dict(name=name, role=role, pair=0, host=0, netns="kvmtune-ab12-h0", backend=backend,
                                   mac="52:54:00:4b:00:00", address=f"{ip}/24", gateway=None, mtu=9000, vhost=False,
                                   connect_address=ip)
    base.update(kw)
    return Endpoint(**base)  # type: ignore[arg-type]


def test_guest_jobs() -> None:
    g = _guest()
    tun = parse_tunings("guest.net.ipv4.tcp_timestamps=0")
    job = guest_job(g, _ep("s0"), tun)
    assert "insmod /lib/modules/kernel/drivers/net/virtio_net.ko" in job and "virtio_blk" not in job
    assert job.index("failover.ko") < job.index("net_failover.ko") < job.index("virtio_net.ko")
    assert "ip link set dev eth0 mtu 9000" in job and "echo 0 > /proc/sys/net/ipv4/tcp_timestamps" in job
    # the NIC is up before the agent starts; from then on the host drives the guest through the agent
    assert job.index("echo 0 > /proc/sys") < job.index("qemu-ga -m virtio-serial") < job.index("KVMTUNE-PROBE-READY")
    assert "netload" not in job and "ab" * 16 not in job  # no test and no token in what the console carries
    # loopback is netload's default; the server is told its own address, and this run's token comes through the
    # command's environment (guest-exec's env), never on a command line
    assert serve_argv(_ep("s0")) == ["/bin/sh", "-c", "exec netload serve -q --listen 198.18.0.110:20000"]
    assert netload_env("ab" * 16) == ["PATH=/bin:/sbin:/usr/bin:/usr/sbin", f"NETLOAD_TOKEN={'ab' * 16}"]
    (t,) = select_tests(["str-readx30k--10"], None)
    cmd = run_argv(_ep("c0"), _ep("s0"), t, 5)
    assert cmd[:2] == ["/bin/sh", "-c"] and "TOKEN" not in cmd[2]
    assert "netload run --workload str-readx30k --users 10 --duration 5s --remote 198.18.0.110:20000 -q --json" in cmd[2]
    warm = warm_argv(_ep("c0"), _ep("s0"))[2]
    assert "--workload rr1c-1x1 --users 1 --duration 1s" in warm and "--connect-timeout 2s" in warm
    user_srv = _ep("s0", "user", ports=(7200, 7201), connect_address="198.18.200.2", hostfwd_address="127.0.0.1")
    (t1,) = select_tests(["rr1c-1x1--1"], None)
    ucli = run_argv(_ep("c0", "user"), user_srv, t1, 5)[2]
    assert "sed 's/protocol=tcp/port=7201 protocol=tcp/'" in ucli and "--remote 198.18.200.2:7200" in ucli
    assert serve_argv(user_srv)[2].endswith("--listen 198.18.0.110:7200")


def _ctx() -> NetContext:
    return NetContext(runner=Runner(), host=HostRoot(), accel=AccelChoice("tcg", "test", 0.0), workdir=Path("/nonexistent"),
                      guest=_guest(), spec=TopologySpec("bridge", mtu=9000), tests=select_tests(["rr1c-1x1--1"], None))


DOC = {"summary": {"throughput_bytes_per_s": 2e6, "transactions_per_s": 1000.0, "bytes": 4e6, "transactions": 3000,
                   "errors": 0, "duration_s": 2.0}}


def test_a_cell_from_what_netload_returned() -> None:
    ctx = _ctx()
    (t,) = ctx.tests
    ok = net_cell(ctx, 1, t, ExecResult(0, json.dumps(DOC) + "\n", "", 2.5), {"wall_s": 2.5, "client": 0.5, "server": 1.0},
               9000)
    assert ok.ok and ok.rep == 1 and ok.workload == t.name and ok.raw == json.dumps(DOC)
    assert ok.metrics["guest_mtu"] == 9000 and ok.metrics["throughput_Bps"] == 2e6
    assert ok.metrics["qemu_client_cpu_pct"] == 20.0 and ok.metrics["qemu_server_cpu_s_per_mb"] == 0.25
    assert ok.config["pair"] == 1 and ok.config["mtu"] == 9000 and ok.duration_s == 2.5
    # netload's own error, its last two error lines, a hung command, a guest that never got there
    failed = net_cell(ctx, 0, t, ExecResult(1, json.dumps({"error": {"message": "peer reset"}}), "", 1.0), {}, None)
    assert not failed.ok and failed.error == "peer reset"
    errs = net_cell(ctx, 0, t, ExecResult(3, "", "dial\n\n  cannot reach\r\n the server\n", 1.0), {}, None)
    assert errs.error == "cannot reach the server"
    assert net_cell(ctx, 0, t, ExecResult(None, "", "", 47.2), {}, None).error == "netload did not finish within 47s"
    assert net_cell(ctx, 0, t, None, {}, None, "server guest: stopped early").error == "server guest: stopped early"
    assert net_cell(ctx, 0, t, None, {}, None).error == "the test did not run"


@pytest.mark.parametrize("stdout", ["not json", "[1, 2]", '"text"', "{", "\x00\ufffd", json.dumps(DOC)])
def test_what_the_guest_prints_never_makes_a_cell_ok_on_its_own(stdout: str) -> None:
    """Whatever the guest returns, a cell is ok only for a JSON object without an error and exit 0."""
    ctx = _ctx()
    (t,) = ctx.tests
    cell = net_cell(ctx, 0, t, ExecResult(2, stdout, "", 1.0), {}, None)
    assert not cell.ok and cell.error == "netload exited 2"
    assert net_cell(ctx, 0, t, ExecResult(0, stdout, "", 1.0), {}, None).ok is (stdout == json.dumps(DOC))


def test_last_error_is_one_line() -> None:
    assert last_error("") == ""
    assert last_error("a\n\nb\tc\r\nd\n") == "b c d"
    assert "\n" not in last_error("x\n" * 1000) and "\r" not in last_error("x\ry\r\n")


def test_netload_metrics() -> None:
    doc = {
        "summary": {"throughput_bytes_per_s": 2e6, "transactions_per_s": 1000.0, "bytes": 6e6, "transactions": 3000,
                    "errors": 0, "server_errors": 1, "duration_s": 3.0,
                    "txn_time_ns": {"count": 3000, "avg": 2500.0, "p50": 2000, "p90": 3000, "p99": 9000, "p99_9": 20000}},
        "cpu": {"client": {"system_cpu_s_per_mb": 0.5, "system_cpu_us_per_txn": 40.0, "system_busy_share": 0.25},
                "server": {"system_cpu_s_per_mb": 0.25, "system_cpu_us_per_txn": 20.0, "system_busy_share": 0.5}},
    }
    m = netload_metrics(doc)
    assert m["throughput_Bps"] == 2e6 and m["tps"] == 1000 and m["errors"] == 1
    assert m["lat_avg_us"] == 2.5 and m["lat_p99_us"] == 9.0 and m["lat_p99_9_us"] == 20.0
    assert m["client_cpu_s_per_mb"] == 0.5 and m["server_cpu_us_per_txn"] == 20.0 and m["server_cpu_busy_pct"] == 50.0
    assert "tcp_retransmits" not in m  # netload before 0.3.0 does not count them: absent, not 0
    doc["summary"] |= {"tcp_retransmits": 1234, "undelivered_messages": 5}
    m = netload_metrics(doc)
    assert m["tcp_retransmits"] == 1234 and m["undelivered_messages"] == 5


def _cell(test: str, pair: int, **metrics: float) -> CellRow:
    return CellRow(1, 1, f"x|{test}", {}, test, pair, "ok", None, "tcg", 1.0, dict(metrics))


def test_seed002_rows_sum_pairs_and_signs() -> None:
    a = [_cell("rr1c-1x1--1", 0, throughput_Bps=100, lat_avg_us=10, client_cpu_s_per_mb=2, server_cpu_s_per_mb=2),
         _cell("rr1c-1x1--1", 1, throughput_Bps=100, lat_avg_us=10, client_cpu_s_per_mb=2, server_cpu_s_per_mb=2),
         _cell("str-readx30k--10", 0, throughput_Bps=50, lat_avg_us=5, client_cpu_s_per_mb=1, server_cpu_s_per_mb=1)]
    b = [_cell("str-readx30k--10", 0, throughput_Bps=25, lat_avg_us=10, client_cpu_s_per_mb=2, server_cpu_s_per_mb=0.5),
         _cell("rr1c-1x1--1", 0, throughput_Bps=300, lat_avg_us=5, client_cpu_s_per_mb=1, server_cpu_s_per_mb=2)]
    assert aggregate(a)["rr1c-1x1--1"]["throughput_Bps"] == 200 and aggregate(a)["rr1c-1x1--1"]["lat_avg_us"] == 10
    rows = seed002_rows(a, b)
    assert [r.test for r in rows] == ["rr1c-1x1--1", "str-readx30k--10"]  # seed order
    assert rows[0].pct == {"throughput": 50.0, "transaction time": 100.0, "client CPU efficiency": 100.0,
                           "server CPU efficiency": 0.0}
    assert rows[1].pct["throughput"] == -50.0 and rows[1].pct["server CPU efficiency"] == 100.0
    assert pct_better(None, 1, "tps") is None and pct_better(0, 1, "tps") is None
    assert "+50.0%" in text_table(rows)


def test_compare_cli_draws_the_chart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from kvmtune.cli import main

    db = tmp_path / "r.db"
    with Store(db) as st:
        ids = []
        for topo, tput in (("bridge", 100.0), ("ovs", 150.0)):
            rid = st.begin_run("net", {"accel": "tcg"}, {"topology": topo, "mtu": 1500, "hosts": 1, "pairs": 1})
            st.add_cell(rid, f"{topo}-mtu1500-h1-p1|rr1c-1x1--1", {}, "rr1c-1x1--1", "ok",
                        {"throughput_Bps": tput, "lat_avg_us": 10, "client_cpu_s_per_mb": 1, "server_cpu_s_per_mb": 1})
            st.finish_run(rid, "complete")
            ids.append(rid)
    out = tmp_path / "c.html"
    assert main(["compare", str(ids[0]), str(ids[1]), "--db", str(db), "--html", str(out)]) == 0
    text = capsys.readouterr().out
    assert "rr1c-1x1--1" in text and "+50.0%" in text
    page = out.read_text()
    assert "<svg" in page and "data:image" not in page and "run 2: ovs, MTU 1500" in page  # inline SVG, no PNG
    assert "topology bridge → ovs" in page


def test_winners_table() -> None:
    from kvmtune.bench.net.claims import winners

    def cell(run: int, topo: str, test: str, pair: int, tps: float, bps: float, mtu: int = 1500) -> CellRow:
        cfg = {"topology": topo, "mtu": mtu, "hosts": 1, "pairs": 2, "pair": pair, "tunings": {}}
        return CellRow(run * 100 + pair, run, f"{topo}|{test}", cfg, test, pair, "ok", None, "tcg", 1.0,
                       {"tps": tps, "throughput_Bps": bps})

    cells = []
    for run, topo, tps, bps in ((1, "bridge", 100.0, 1e6), (5, "bridge", 101.0, 1.01e6), (2, "ovs", 150.0, 4e6),
                                (3, "ovs", 151.5, 4.04e6)):
        for pair in (0, 1):
            cells += [cell(run, topo, "rr1c-1x1--1", pair, tps, bps), cell(run, topo, "str-readx30k--1", pair, tps, bps)]
    cells.append(cell(4, "macvtap", "rr1c-1x1--1", 0, 1.0, 1.0, mtu=9000))
    lines = winners(cells)
    assert lines[0] == ("MTU 1500, 1 host, 2 pairs: small transactions: ovs (+50 % over bridge; 95 % interval +46 % to "
                        "+55 %; 1 test); large transactions: not measured; streaming: ovs (+300 % over bridge; 95 % "
                        "interval +288 % to +312 %; 1 test)")
    assert lines[1].startswith("MTU 9000, 1 host, 2 pairs: small transactions: only macvtap measured")
