"""The datapath tier's plumbing without a system: options refused by tier, tiers never mixed, the path's CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

import kvmtune.cli as cli
from kvmtune.bench.net.catalog import Tunings
from kvmtune.bench.net.datapath import (
    _SOCKET_DROPS,
    _socket_drop_pct,
    _unforwarded_pct,
    config_key,
    path_metrics,
    per_test_deadline_s,
    stall_timeout_s,
)
from kvmtune.lab.net.netns import NetError
from kvmtune.lab.net.topology import TopologySpec
from kvmtune.lab.store import Store


@pytest.mark.parametrize(
    ("argv", "flag", "words"),
    [
        (["--tier", "datapath", "--topology", "bridge", "--memory", "512"], "--memory", "no guest"),
        (["--tier", "datapath", "--topology", "ovs", "--accel", "tcg"], "--accel", "no guest"),
        (["--tier", "datapath", "--topology", "bridge,user"], "--topology", "slirp"),
        (["--topology", "user,bridge"], "--topology", "one topology per run"),  # auto: user needs guests
        (["--tier", "guest", "--topology", "bridge,ovs"], "--topology", "one topology per run"),
        (["--tier", "guest", "--topology", "bridge", "--no-pin"], "--no-pin", "datapath tier"),
        (["--tier", "datapath", "--topology", "bridge,bridge"], "--topology", "each topology once"),
        (["--topology", "bridge,ovs", "--vhost", "on"], "--topology", "one topology per run"),  # --vhost: guests
    ],
)
def test_options_of_the_other_tier_are_refused_in_one_line(argv: list[str], flag: str, words: str, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "net", *argv, "--db", str(tmp_path / "r.db")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"kvmtune: {flag}: ") and words in err[0], err
    assert not (tmp_path / "r.db").exists()  # refused before anything was written


def test_user_mode_has_no_namespace_twin() -> None:
    with pytest.raises(NetError, match="slirp"):
        TopologySpec("user", attach="netns").validate()
    with pytest.raises(NetError, match="attach"):
        TopologySpec("bridge", attach="veth").validate()


def test_config_key_names_the_tier_and_tunings() -> None:
    assert config_key(TopologySpec("ovs", pairs=2, mtu=9000), Tunings()) == "ovs-mtu9000-h1-p2-datapath"
    assert config_key(TopologySpec("bridge"), Tunings(txqueuelen=500)).endswith("-datapath-txqueuelen=500")


def test_path_cpu_adds_both_netloads_and_a_bytes_share_of_the_daemons() -> None:
    doc = {
        "summary": {"throughput_bytes_per_s": 2e6, "transactions_per_s": 1000.0, "bytes": 6e6, "transactions": 3000,
                    "errors": 0, "duration_s": 3.0, "txn_time_ns": {"count": 3000, "avg": 2500.0}},
        "cpu": {"client": {"process_cpu_s": 0.5}, "server": {"process_cpu_s": 0.25}},
    }
    m = path_metrics(doc, daemon_cpu_s=3.0, topology_mb=12.0)  # this pair moved half the topology's bytes
    assert m["daemon_cpu_s"] == 1.5
    assert m["path_cpu_s_per_mb"] == pytest.approx((0.5 + 0.25 + 1.5) / 6.0)
    assert m["path_cpu_us_per_txn"] == pytest.approx(2.25e6 / 3000)
    assert path_metrics(doc, 0.0, 0.0)["daemon_cpu_s"] == 0.0


def _net_run(st: Store, tier: str | None, topo: str, tps: float, accel: str = "none") -> int:
    env = {"accel": accel, **({"tier": tier} if tier else {})}
    rid = st.begin_run("net", env, {"topology": topo})
    cfg = {"topology": topo, "mtu": 1500, "hosts": 1, "pairs": 1, "pair": 0, "tunings": {}, **({"tier": tier} if tier else {})}
    for test in ("rr1c-1x1--1", "str-readx30k--1"):
        st.add_cell(rid, f"{topo}|{test}", cfg, test, "ok", {"tps": tps, "throughput_Bps": tps * 100, "lat_avg_us": 5},
                    accel=accel)
    st.finish_run(rid, "complete")
    return rid


def test_compare_never_mixes_guest_and_datapath_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "r.db"
    with Store(db) as st:
        guest = _net_run(st, None, "bridge", 100.0, accel="none")  # stored before tiers: a guest run
        datapath = _net_run(st, "datapath", "bridge", 900.0)
        other = _net_run(st, "datapath", "ovs", 300.0)
    for argv in ([str(guest), str(datapath)], [str(guest), str(datapath), "--across-accelerators"]):
        assert cli.main(["compare", *argv, "--db", str(db)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "network guest-tier run" in err[0] and "network datapath-tier run" in err[0], err
    assert cli.main(["compare", str(datapath), str(other), "--db", str(db)]) == 0
    assert "rr1c-1x1--1" in capsys.readouterr().out


def test_report_ranks_each_tier_on_its_own(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "r.db"
    with Store(db) as st:
        ids = [_net_run(st, None, "bridge", 100.0, accel="tcg"), _net_run(st, None, "ovs", 50.0, accel="tcg"),
               _net_run(st, "datapath", "bridge", 900.0), _net_run(st, "datapath", "ovs", 1800.0)]
    assert cli.main(["report", *map(str, ids), "--db", str(db)]) == 0
    out = capsys.readouterr().out.splitlines()
    lines = [ln for ln in out if "seed:002 [" in ln]  # the "which topology won" lines; claims follow as seed:002 p. N
    assert len(lines) == 2, lines
    claims = [ln for ln in out if "seed:002 p. 38" in ln]  # bridge vs ovs, judged once per tier, never across
    assert len(claims) == 2 and "[network datapath]" in claims[0] and "[network guest, tcg]" in claims[1], claims
    guest = next(ln for ln in lines if "[guest tier]" in ln)
    datapath = next(ln for ln in lines if "[datapath tier]" in ln)
    # each tier ranked on its own figures; one run a side names no winner (issue 31), only the lead
    assert "small transactions: no winner: bridge +100 % over ovs is not apart from a tie (one run a side" in guest
    assert "small transactions: no winner: ovs +100 % over bridge is not apart from a tie (one run a side" in datapath


def test_open_vswitch_losses_and_deadlines() -> None:
    assert _unforwarded_pct((100, 100, None), (1100, 1000, None)) == 10.0  # 1000 in, 900 out
    assert _unforwarded_pct((0, 0, None), (10, 12, None)) == 0.0  # a flood sends more than it received: no loss
    assert _unforwarded_pct(None, (1, 1, 0)) is None and _unforwarded_pct((5, 5, 0), (5, 5, 0)) is None
    # of 1000 packets the ports received, OVS's packet sockets dropped 150 (their sk_drops as ss -m shows them)
    assert _socket_drop_pct((100, 100, 50), (1100, 900, 200)) == 15.0
    assert _socket_drop_pct((100, 100, None), (1100, 900, None)) is None  # kernel datapath: no such sockets
    ss = ("p_raw UNCONN 0 0 *:kvtap-c0 * skmem:(r0,rb212992,t0,tb212992,f0,w0,o176,bl0,d11491)\n"
          "p_raw UNCONN 0 0 [0]:* * skmem:(r0,rb212992,t0,tb212992,f0,w0,o0,bl0,d7)\n")
    assert [int(d) for d in _SOCKET_DROPS.findall(ss)] == [11491, 7]
    # netload gives up on a stalled run (and says so) before kvmtune would stop it
    assert stall_timeout_s(1) == 10 and stall_timeout_s(30) == 60
    assert per_test_deadline_s(5) > 5 + stall_timeout_s(5) + 10
