"""Each topology, one pair, with stand-in guests: reachable both ways, MTU end to end, nothing left after."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from net_helpers import assert_nothing_left, namespaces, processes_mentioning

from kvmtune.lab.net import TOPOLOGIES, TopologySpec, make_topology
from kvmtune.lab.net.standin import check_topology
from kvmtune.runner import CommandResult, Runner

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("netroot")]


def _failed(result: dict[str, object]) -> list[object]:
    return [c for c in result["checks"] if not c["passed"]]  # type: ignore[attr-defined]


@pytest.mark.parametrize("hosts", [1, 2])
@pytest.mark.parametrize("kind", TOPOLOGIES)
def test_topology_up_check_down(kind: str, hosts: int, workdir: Path) -> None:
    mtu = 1500 if kind == "user" else 9000
    topo = make_topology(TopologySpec(kind, hosts=hosts, mtu=mtu), workdir=workdir)
    with topo:
        assert set(topo.namespaces) <= set(namespaces())
        assert all(n.startswith(f"kvmtune-{topo.runid}-") for n in topo.namespaces)
        assert len(topo.pairs()) == 1
        client, server = topo.pairs()[0]
        assert (client.host, server.host) == (0, hosts - 1)
        for ep in topo.endpoints:  # the host side of every guest NIC carries the MTU
            if ep.ifname:
                assert topo.namespaces[ep.netns].mtu(ep.ifname) == mtu, ep.name
        result = check_topology(topo)
        if kind == "ovs":
            assert processes_mentioning(str(topo.rundir / "ovs-h0"))  # our daemons, in our directory
    assert result["ok"], _failed(result)
    assert topo.facts["vhost_net"] == (os.path.exists("/dev/vhost-net") and kind != "user")
    if kind == "ovs":
        expected = "system" if os.path.exists("/sys/module/openvswitch") else "netdev"
        assert topo.facts["ovs_datapath"] == expected
    assert topo.facts["up_s"] < 20 and topo.facts["down_s"] < 20
    assert_nothing_left(topo.runid, topo.rundir)


def test_two_pairs_two_hosts_bridge(workdir: Path) -> None:
    with make_topology(TopologySpec("bridge", pairs=2, hosts=2, mtu=9000, txqueuelen=2500), workdir=workdir) as topo:
        result = check_topology(topo)
        h0 = topo.namespaces[topo.ns_name("h0")]
        assert h0.link_json("kvtap-c1")["txqlen"] == 2500
    assert result["ok"], _failed(result)
    assert [(c.name, s.name) for c, s in topo.pairs()] == [("c0", "s0"), ("c1", "s1")]
    assert_nothing_left(topo.runid, topo.rundir)


def test_exception_inside_tears_down(workdir: Path) -> None:
    topo = make_topology(TopologySpec("nat", mtu=9000), workdir=workdir)
    with pytest.raises(RuntimeError), topo:
        assert topo.namespaces
        raise RuntimeError("boom")
    assert_nothing_left(topo.runid, topo.rundir)


class _InterruptingRunner(Runner):
    """Ctrl-C arrives while the topology is half built (a tap is being enslaved)."""

    def run(self, argv: Sequence[str], **kw: Any) -> CommandResult:
        if "master" in argv:
            raise KeyboardInterrupt
        return super().run(argv, **kw)


@pytest.mark.parametrize("kind", ["bridge", "nat"])
def test_ctrl_c_during_bring_up(kind: str, workdir: Path) -> None:
    topo = make_topology(TopologySpec(kind, hosts=2), runner=_InterruptingRunner(), workdir=workdir)
    with pytest.raises(KeyboardInterrupt), topo:
        pytest.fail("the body must not run")
    assert topo.namespaces  # it got as far as creating them
    assert_nothing_left(topo.runid, topo.rundir)
