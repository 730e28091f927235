"""The guest tier's network: one kvmtune namespace with a bridge, a tap per probe guest and a netload server.

The probe guests of a NIC experiment (:mod:`kvmtune.verify.guest.nic`) reach nothing but this: a
namespace labelled ``kvmtune-<run>-h0``, built and torn down by :class:`kvmtune.lab.net.topology.Topology`
but held by a keeper process instead of a name in ``/run/netns``
(:class:`kvmtune.lab.net.netns.HeldNetns`), a Linux bridge with the server's address, and one tap per
side on it, multiqueue when the side has more than one queue pair. ``netload serve`` listens on the
bridge's address inside the namespace, for clients holding this run's token only. QEMU opens its tap
inside the namespace (``nsenter --net=/proc/<keeper>/ns/net``), so nothing is made or changed in the root
namespace; every address lies in 198.18.0.0/15. The keeper, netload and QEMU die with kvmtune (SIGKILL
included), and with them the namespace, its bridge and its taps: a killed run leaves none.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from kvmtune.host.root import HostRoot
from kvmtune.lab.net.netload import NETLOAD_PORT, new_token
from kvmtune.lab.net.netns import HeldNetns, NetError, Netns, check_address
from kvmtune.lab.net.topology import Topology, TopologySpec
from kvmtune.lab.probe.pair import NETDEV_ID
from kvmtune.lab.probe.side import GuestSide, Plumbing
from kvmtune.lab.qemu import tap_netdev
from kvmtune.runner import Runner

BRIDGE = "kvbr0"
SERVER_CIDR = "198.18.0.1/24"
SIDE_CIDR = {"A": "198.18.0.10/24", "B": "198.18.0.11/24"}
TAP = {"A": "kvtap-a", "B": "kvtap-b"}
VHOST_DEVICE = "/dev/vhost-net"
VHOST_MISSING = f"{VHOST_DEVICE} is missing on this host (modprobe vhost_net)"
MAX_TAP_QUEUES = 256
SERVER_START_S = 10.0  # netload serve listening in the namespace


def netdev_arg(side_name: str, side: GuestSide) -> str:
    """The side's ``-netdev``: its tap in the namespace, vhost on or off, its queue pairs."""
    queues = side.nic_queues or 1
    if not 1 <= queues <= MAX_TAP_QUEUES:
        raise NetError(f"side {side_name}: {queues} queues (a tap has 1..{MAX_TAP_QUEUES})")
    return tap_netdev(NETDEV_ID, TAP[side_name], side.vhost, queues)


class GuestNet(Topology):
    """The namespace, bridge, taps and netload server of one NIC experiment (a context manager).

    ``sides``: side name (``A``, ``B``) → its hardware (the NIC model does not matter here; vhost and
    queues do). ``netload``: the host's netload binary (the server runs it in the namespace).
    """

    kind = "guest-nic"
    held_namespaces = True  # the namespace dies with kvmtune (a keeper process), nothing for a sweep to find

    def __init__(self, sides: Mapping[str, GuestSide], netload: str, *, runner: Runner, host: HostRoot | None = None,
                 workdir: Path | None = None, runid: str | None = None) -> None:
        super().__init__(TopologySpec("bridge"), runner=runner, host=host, workdir=workdir, runid=runid)
        unknown = set(sides) - set(TAP)
        if unknown:
            raise NetError(f"sides {', '.join(sorted(unknown))}: only A and B")
        self.sides = dict(sides)
        self.netload = netload
        self.token = new_token()  # netload serves a bridge address: only this run's clients (in the environment, not argv)
        self.server: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> GuestNet:
        self.up()
        return self

    @property
    def netns(self) -> HeldNetns:
        """The namespace (held by its keeper process while the network is up)."""
        ns = self.host_ns(0)
        assert isinstance(ns, HeldNetns)
        return ns

    @property
    def server_ip(self) -> str:
        return SERVER_CIDR.split("/", 1)[0]

    @property
    def server_address(self) -> str:
        return f"{self.server_ip}:{NETLOAD_PORT}"

    def preflight(self) -> None:
        super().preflight()  # root, iproute2
        if any(s.vhost for s in self.sides.values()) and not self.host.exists(VHOST_DEVICE):
            raise NetError(VHOST_MISSING)

    def _build(self) -> None:
        ns = self.host_ns(0)
        self._linux_bridge(ns, BRIDGE)
        ns.add_address(BRIDGE, check_address(SERVER_CIDR))
        for name, side in self.sides.items():
            tap = TAP[name]
            mq = ["multi_queue"] if (side.nic_queues or 1) > 1 else []
            ns.ip("tuntap", "add", "dev", tap, "mode", "tap", *mq)
            ns.ip("link", "set", "dev", tap, "master", BRIDGE)
            ns.up(tap)
        self.server = self.runner.popen(
            [*ns.exec_prefix, self.netload, "serve", "-q", "--listen", self.server_address],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            env={**os.environ, "NETLOAD_TOKEN": self.token},
        )
        self.add_process(self.server, "netload serve")
        self._await_server(ns)
        self.facts.update(bridge=BRIDGE, server=self.server_address, taps={n: TAP[n] for n in self.sides})

    def _await_server(self, ns: Netns, timeout: float = SERVER_START_S) -> None:
        """Wait until netload serve listens inside the namespace: a guest's client, or a keeper that dies now, must not
        race its start (under load, nsenter may not have entered the namespace yet when _build returns)."""
        until = time.monotonic() + timeout
        while True:
            if (why := self.server_error()) is not None:
                raise NetError(why)
            res = ns.exec("ss", "-Hltn", f"sport = :{NETLOAD_PORT}", check=False, timeout=10)
            if res.ok and res.stdout.strip():
                return
            if time.monotonic() > until:
                raise NetError(f"netload serve did not listen on {self.server_address} within {timeout:g}s")
            time.sleep(0.05)

    def plumbing(self, side_name: str) -> Plumbing:
        """What the side's QEMU needs: its ``-netdev`` on the side's tap, and to run inside the namespace."""
        side = self.sides[side_name]
        return Plumbing(("-netdev", netdev_arg(side_name, side)), tuple(self.netns.exec_prefix))

    def guest_commands(self, side_name: str, dev: str = "eth0") -> list[list[str]]:
        """The argv lists (busybox ``ip``) that give the guest's NIC its address on the bridge."""
        cidr = check_address(SIDE_CIDR[side_name])
        return [["/bin/ip", "addr", "add", cidr, "dev", dev], ["/bin/ip", "link", "set", "dev", dev, "up"]]

    def server_error(self) -> str | None:
        """Why the server is not serving, or None while it runs."""
        if self.server is None:
            return "netload serve was not started"
        code = self.server.poll()
        return None if code is None else f"netload serve exited {code} in {self.host_ns(0).name}"
