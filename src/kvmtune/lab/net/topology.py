"""Guest network topologies for ``kvmtune bench net``, built inside namespaces.

A topology connects ``pairs`` client/server guest pairs the ways seed 002
compares (seed:002, chapter 6): a Linux bridge with tap devices, Open vSwitch,
macvtap in bridge mode, the libvirt-style NAT network (bridge + nftables
masquerade), and QEMU user-mode networking as the baseline. Each "host" is a
network namespace; with ``hosts=2`` the two are joined by a veth pair that
plays the physical switch, clients on host 0 and servers on host 1 (the
seed's figure 8 mapping). Nothing is created in the root namespace and every
address comes from 198.18.0.0/15.

A topology only builds the host side. It describes each guest attachment as
an :class:`Endpoint`: where QEMU must run (``ip netns exec``), its ``-netdev``
and ``-device`` arguments (vhost-net when ``/dev/vhost-net`` exists), and the
address, gateway and MTU the guest should configure.

Use it as a context manager; teardown runs on any exit, Ctrl-C included::

    with make_topology(TopologySpec("bridge", mtu=9000)) as topo:
        for client, server in topo.pairs(): ...

Address plan (all inside one run's namespaces, so runs never collide):

=============  =====================================================
bridge/ovs/    guests on one L2 segment 198.18.0.0/24: clients .10+p,
macvtap        servers .110+p
nat            clients 198.18.100.10+p behind host 0's NAT bridge
               (gateway .1); the "outside" LAN is 198.19.0.0/24 (host 0
               uplink .1, outside bridge .254, servers .110+p). With one
               host the outside is its own namespace (``…-out``); with
               two it is host 1.
user           each guest has its own slirp network 198.18.200.0/24
               (guest .15, slirp host .2); a server's ports are forwarded
               (``hostfwd``) on host 1's switch address 198.19.1.2, or on
               127.0.0.1 of host 0 when single-host.
=============  =====================================================
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar

from kvmtune.host.process import read_pid_stat
from kvmtune.host.root import HostRoot
from kvmtune.lab.net.endpoint import (
    GUEST_DEV,
    MAX_PAIRS,
    SLIRP_GUEST,
    SLIRP_HOST,
    SLIRP_NET,
    SWITCH,
    TOPOLOGIES,
    USER_PORT_BASE,
    Backend,
    Endpoint,
    TopologySpec,
)
from kvmtune.lab.net.netns import (
    PREFIX,
    HeldNetns,
    NetError,
    Netns,
    check_address,
    list_namespaces,
    require_net_admin,
)
from kvmtune.lab.net.ovs import OvsInstance, ovs_available, pick_datapath
from kvmtune.lab.workdir import default_workdir, stop_process
from kvmtune.runner import Runner, default_runner

# the spec and the endpoints live in endpoint.py; importers keep naming them here
__all__ = ["GUEST_DEV", "MAX_PAIRS", "SLIRP_GUEST", "SLIRP_HOST", "SLIRP_NET", "SWITCH", "TOPOLOGIES", "USER_PORT_BASE",
           "Backend", "BridgeTopology", "Endpoint", "MacvtapTopology", "NatTopology", "OvsTopology", "Topology",
           "TopologySpec", "UserTopology", "make_topology"]


def _mac(role: str, pair: int) -> str:
    return f"52:54:00:4b:{0 if role == 'client' else 1:02x}:{pair:02x}"


class Topology:
    """Base class: namespaces, bookkeeping, teardown. Subclasses implement :meth:`_build`."""

    kind: ClassVar[str] = ""
    # False (bench net): named namespaces (/run/netns), locked while the run lives, swept after a killed run.
    # True (the guest tier): namespaces held by a keeper process that dies with kvmtune (HeldNetns), gone with it.
    held_namespaces: ClassVar[bool] = False

    def __init__(
        self,
        spec: TopologySpec,
        *,
        runner: Runner | None = None,
        host: HostRoot | None = None,
        workdir: Path | None = None,
        runid: str | None = None,
    ) -> None:
        spec.validate()
        self.spec = spec
        self.runner = runner or default_runner()
        self.host = host or HostRoot()
        self.runid = runid or secrets.token_hex(3)
        if not re.fullmatch(r"[a-z0-9]{2,12}", self.runid):
            raise NetError(f"run id {self.runid!r}: 2-12 lowercase letters or digits")
        self.workdir = Path(workdir) if workdir else default_workdir()
        self.rundir = self.workdir / "net" / self.runid
        self.namespaces: dict[str, Netns] = {}
        self.endpoints: list[Endpoint] = []
        self.facts: dict[str, Any] = {"topology": self.kind, "runid": self.runid}
        self._procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._ovs: list[OvsInstance] = []
        self._up = False
        self._down = False

    # -- naming ------------------------------------------------------------------

    def ns_name(self, role: str) -> str:
        return f"{PREFIX}{self.runid}-{role}"

    def host_ns(self, index: int) -> Netns:
        return self.namespaces[self.ns_name(f"h{index}")]

    def add_namespace(self, role: str) -> Netns:
        name = self.ns_name(role)
        ns = HeldNetns(name, self.runner, host=self.host) if self.held_namespaces else Netns(name, self.runner)
        if ns.name in self.namespaces:
            raise NetError(f"namespace {ns.name} exists already in this run")
        self.namespaces[ns.name] = ns  # registered first: a half-made namespace is still torn down
        self._write_owner()
        ns.create()
        return ns

    def add_process(self, proc: subprocess.Popen[bytes], what: str) -> None:
        """A process (QEMU, a stand-in) to stop at teardown, before the namespaces go."""
        self._procs.append((what, proc))

    def ovs_instances(self) -> list[OvsInstance]:
        return list(self._ovs)

    def daemon_pids(self) -> list[int]:
        """The topology's own forwarding daemons (Open vSwitch), whose CPU time is part of the datapath's cost."""
        return [p.pid for ovs in self._ovs for p in ovs.procs]

    # -- endpoints ---------------------------------------------------------------

    def pairs(self) -> list[tuple[Endpoint, Endpoint]]:
        clients = {e.pair: e for e in self.endpoints if e.role == "client"}
        servers = {e.pair: e for e in self.endpoints if e.role == "server"}
        return [(clients[p], servers[p]) for p in sorted(clients)]

    def endpoint(self, name: str) -> Endpoint:
        for e in self.endpoints:
            if e.name == name:
                return e
        raise NetError(f"no endpoint {name!r} in this topology")

    def _roles(self) -> Iterator[tuple[str, int, int]]:
        """(role, pair, host) for every guest: clients on host 0, servers on the last host."""
        for p in range(self.spec.pairs):
            yield "client", p, 0
            yield "server", p, self.spec.hosts - 1

    # -- lifecycle ---------------------------------------------------------------

    def preflight(self) -> None:
        require_net_admin(self.host)
        if self.runner.which("ip") is None:
            raise NetError("ip (iproute2) is not installed")
        has_vhost = self.host.exists("/dev/vhost-net")
        if self.spec.vhost == "on" and not has_vhost:
            raise NetError("vhost-net requested but /dev/vhost-net is absent (modprobe vhost_net)")
        self.vhost = has_vhost and self.spec.vhost != "off" and self.kind != "user"
        self.facts["vhost_net"] = self.vhost
        self.facts["vhost_net_device"] = has_vhost

    def up(self) -> Topology:
        if self._up:
            return self
        self.preflight()
        start = time.monotonic()
        try:
            self.rundir.mkdir(parents=True, exist_ok=False)
        except FileExistsError:
            raise NetError(f"{self.rundir}: run directory exists (run id reused?)") from None
        except OSError as exc:
            raise NetError(f"{self.rundir}: cannot create the run directory ({exc.strerror})") from None
        self._up = True
        try:
            for h in range(self.spec.hosts):
                self.add_namespace(f"h{h}")
            if self.spec.hosts == 2:
                self._switch()
            self._build()
            self.configure_guests()
        except BaseException:
            self.down()
            raise
        self.facts.update(
            pairs=self.spec.pairs,
            hosts=self.spec.hosts,
            mtu=self.spec.mtu,
            txqueuelen=self.spec.txqueuelen,
            attach=self.spec.attach,
            namespaces=list(self.namespaces),
            up_s=round(time.monotonic() - start, 4),
        )
        return self

    def _build(self) -> None:
        raise NotImplementedError

    def down(self) -> list[str]:
        """Stop everything and remove every namespace; idempotent. Returns problems (empty = clean)."""
        if self._down or not self._up:
            return []
        self._down = True
        start = time.monotonic()
        problems: list[str] = []
        with _signals_deferred():
            for what, proc in reversed(self._procs):
                try:
                    stop_process(proc, grace=3.0)
                except Exception as exc:  # teardown goes on
                    problems.append(f"{what}: {exc}")
            self._procs.clear()
            for ovs in reversed(self._ovs):
                problems += ovs.stop()
            for ns in reversed(list(self.namespaces.values())):
                problems += _empty_namespace(self.host, ns)
                problems += ns.remove()
            left = [n for n in _safe_list(self.runner) if n in self.namespaces]
            problems += [f"namespace {n} still present after teardown" for n in left]
            shutil.rmtree(self.rundir, ignore_errors=True)
        self.facts["down_s"] = round(time.monotonic() - start, 4)
        return problems

    def __enter__(self) -> Topology:
        return self.up()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        problems = self.down()
        if problems and et is None:
            raise NetError(f"teardown of {self.kind} topology {self.runid} left problems: {'; '.join(problems)}")

    def describe(self) -> dict[str, Any]:
        return {"facts": dict(self.facts), "rundir": str(self.rundir), "endpoints": [e.to_dict() for e in self.endpoints]}

    def _write_owner(self) -> None:
        me = read_pid_stat(self.host, "self")
        owner = {
            "runid": self.runid,
            "kind": self.kind,
            "pid": os.getpid(),
            "starttime": str(me.starttime) if me else None,
            "namespaces": list(self.namespaces),
        }
        tmp = self.rundir / "owner.json.tmp"
        tmp.write_text(json.dumps(owner))
        tmp.replace(self.rundir / "owner.json")

    # -- building blocks -----------------------------------------------------------

    def _switch(self) -> None:
        """The veth pair between host 0 and host 1: the "physical" link through a switch."""
        h0, h1 = self.host_ns(0), self.host_ns(1)
        h0.ip("link", "add", SWITCH, "type", "veth", "peer", "name", SWITCH, "netns", h1.name)
        for ns in (h0, h1):
            ns.set_mtu(SWITCH, self.spec.mtu)
            ns.up(SWITCH)
        self.facts["switch"] = f"veth {SWITCH} {h0.name} <-> {h1.name}"

    def _tap(self, ns: Netns, name: str, master: str | None = None) -> str | None:
        """The host side of one guest NIC: a tap for QEMU, or with ``attach=netns`` a veth whose peer is eth0
        of a new namespace (returned) that stands in for the guest."""
        guest: Netns | None = None
        if self.spec.attach == "netns":
            guest = self.add_namespace("g" + name.rsplit("-", 1)[-1])
            ns.ip("link", "add", name, "type", "veth", "peer", "name", GUEST_DEV, "netns", guest.name)
        else:
            ns.ip("tuntap", "add", "dev", name, "mode", "tap")
        ns.set_mtu(name, self.spec.mtu)
        if self.spec.txqueuelen is not None:
            ns.ip("link", "set", "dev", name, "txqueuelen", str(self.spec.txqueuelen))
        if master:
            ns.ip("link", "set", "dev", name, "master", master)
        ns.up(name)
        return guest.name if guest else None

    def configure_guests(self) -> None:
        """attach=netns: give each stand-in namespace's eth0 what the guest would configure (MAC, MTU, address,
        gateway, txqueuelen)."""
        for ep in self.endpoints:
            if ep.guest_netns is None:
                continue
            g = self.namespaces[ep.guest_netns]
            g.ip("link", "set", "dev", GUEST_DEV, "address", ep.mac)
            g.set_mtu(GUEST_DEV, ep.mtu)
            if self.spec.txqueuelen is not None:
                g.ip("link", "set", "dev", GUEST_DEV, "txqueuelen", str(self.spec.txqueuelen))
            g.add_address(GUEST_DEV, ep.address)
            g.up(GUEST_DEV)
            if ep.gateway:
                g.ip("route", "add", "default", "via", ep.gateway)

    def _linux_bridge(self, ns: Netns, name: str) -> None:
        ns.ip("link", "add", name, "type", "bridge", "stp_state", "0", "forward_delay", "0")
        ns.set_mtu(name, self.spec.mtu)
        ns.up(name)

    def _lan_endpoint(self, role: str, pair: int, host: int, backend: Backend, **kw: Any) -> Endpoint:
        octet = (10 if role == "client" else 110) + pair
        addr = f"198.18.0.{octet}/24"
        return Endpoint(
            name=f"{role[0]}{pair}",
            role=role,
            pair=pair,
            host=host,
            netns=self.host_ns(host).name,
            backend=backend,
            mac=_mac(role, pair),
            address=check_address(addr),
            gateway=None,
            mtu=self.spec.mtu,
            vhost=self.vhost,
            connect_address=addr.split("/")[0],
            **kw,
        )


class BridgeTopology(Topology):
    """A Linux bridge per host with one tap per guest; the switch veth is a bridge port with two hosts."""

    kind = "bridge"

    def _build(self) -> None:
        for h in range(self.spec.hosts):
            ns = self.host_ns(h)
            self._linux_bridge(ns, "kvbr0")
            if self.spec.hosts == 2:
                ns.ip("link", "set", "dev", SWITCH, "master", "kvbr0")
        for role, pair, h in self._roles():
            tap = f"kvtap-{role[0]}{pair}"
            guest = self._tap(self.host_ns(h), tap, master="kvbr0")
            self.endpoints.append(self._lan_endpoint(role, pair, h, Backend.TAP, ifname=tap, guest_netns=guest))
        for h in range(self.spec.hosts):
            self.host_ns(h).set_mtu("kvbr0", self.spec.mtu)  # a bridge takes its ports' minimum otherwise
        self.facts["bridge"] = "linux"


class OvsTopology(Topology):
    """One private Open vSwitch instance per host; taps (and the switch veth) are OVS ports."""

    kind = "ovs"

    def preflight(self) -> None:
        super().preflight()
        why = ovs_available(self.runner, self.host)
        if why:
            raise NetError(why)
        self.datapath = pick_datapath(self.host, self.spec.ovs_datapath)
        self.facts["ovs_datapath"] = self.datapath
        self.facts["ovs_userspace_tso"] = self.datapath == "netdev"
        self.facts["ovs_kernel_module"] = self.host.exists("/sys/module/openvswitch")

    def _build(self) -> None:
        for h in range(self.spec.hosts):
            ns = self.host_ns(h)
            ovs = OvsInstance(ns, self.rundir / f"ovs-h{h}", self.runner, self.host, self.datapath)
            self._ovs.append(ovs)
            ovs.start()
            ovs.add_bridge("kvbr0", self.spec.mtu)
            if self.spec.hosts == 2:
                ovs.add_port("kvbr0", SWITCH, self.spec.mtu)
        for role, pair, h in self._roles():
            tap = f"kvtap-{role[0]}{pair}"
            guest = self._tap(self.host_ns(h), tap)
            self._ovs[h].add_port("kvbr0", tap, self.spec.mtu)
            self.endpoints.append(self._lan_endpoint(role, pair, h, Backend.TAP, ifname=tap, guest_netns=guest))
        for h, ovs in enumerate(self._ovs):
            ns = self.host_ns(h)
            ns.up("kvbr0")
            for dev in ["kvbr0", *(e.ifname for e in self.endpoints if e.host == h and e.ifname)]:
                ovs.wait_mtu(dev, self.spec.mtu)
        self.facts["bridge"] = "openvswitch"
        self.facts["ovs_version"] = _ovs_version(self.runner)


class MacvtapTopology(Topology):
    """macvtap devices in bridge mode on a lower device kvmtune made.

    One host: the lower device is a veth pair inside host 0 (its peer up, so
    it has carrier). Two hosts: the switch veth is each host's lower device,
    the way seed 002 put macvtap on the OSA adapter.
    """

    kind = "macvtap"

    def _build(self) -> None:
        lower = SWITCH
        if self.spec.hosts == 1:
            ns = self.host_ns(0)
            ns.ip("link", "add", "kvlow0", "type", "veth", "peer", "name", "kvlow0p")
            for dev in ("kvlow0", "kvlow0p"):
                ns.set_mtu(dev, self.spec.mtu)
                ns.up(dev)
            lower = "kvlow0"
        if self.spec.attach == "netns":
            self._macvlan_twins(lower)
            return
        devdir = self.rundir / "dev"
        devdir.mkdir(exist_ok=True)
        for role, pair, h in self._roles():
            ns = self.host_ns(h)
            name = f"kvmvt-{role[0]}{pair}"
            mac = _mac(role, pair)
            res = ns.ip(
                "link", "add", "link", lower, "name", name, "address", mac, "type", "macvtap", "mode", "bridge", check=False
            )
            if not res.ok:
                if "Unknown device type" in res.stderr or "not supported" in res.stderr.lower():
                    raise NetError("macvtap unavailable: this kernel has no macvtap support (CONFIG_MACVTAP / modprobe macvtap)")
                raise NetError(f"{ns.name}: cannot create macvtap {name}: {res.describe_failure()}")
            ns.set_mtu(name, self.spec.mtu)
            if self.spec.txqueuelen is not None:
                ns.ip("link", "set", "dev", name, "txqueuelen", str(self.spec.txqueuelen))
            ns.up(name)
            chardev = self._chardev(ns, name, devdir)
            self.endpoints.append(self._lan_endpoint(role, pair, h, Backend.MACVTAP, ifname=name, chardev=chardev))
        self.facts["macvtap_mode"] = "bridge"
        self.facts["macvtap_lower"] = lower

    def _macvlan_twins(self, lower: str) -> None:
        """attach=netns: macvtap's namespace twin. A macvlan in bridge mode on the same lower device is the
        same kernel driver (drivers/net/macvlan.c) without the character device QEMU reads; it is created
        straight into the stand-in guest's namespace as its eth0."""
        for role, pair, h in self._roles():
            ns = self.host_ns(h)
            guest = self.add_namespace(f"g{role[0]}{pair}")
            res = ns.ip("link", "add", "link", lower, "name", GUEST_DEV, "address", _mac(role, pair), "netns", guest.name,
                        "type", "macvlan", "mode", "bridge", check=False)
            if not res.ok:
                if "Unknown device type" in res.stderr or "not supported" in res.stderr.lower():
                    raise NetError("macvlan unavailable: this kernel has no macvlan support (CONFIG_MACVLAN / modprobe macvlan)")
                raise NetError(f"{ns.name}: cannot create the macvlan for {role[0]}{pair}: {res.describe_failure()}")
            self.endpoints.append(self._lan_endpoint(role, pair, h, Backend.MACVTAP, guest_netns=guest.name))
        self.facts["macvtap_mode"] = "bridge"
        self.facts["macvtap_lower"] = lower
        self.facts["macvtap_twin"] = "macvlan (bridge mode): macvtap's namespace twin, same driver without QEMU's chardev"

    def _chardev(self, ns: Netns, name: str, devdir: Path) -> str:
        """Make the macvtap's /dev/tapN node in the run directory (no udev inside our namespaces)."""
        index = int(ns.link_json(name)["ifindex"])
        res = ns.exec("cat", f"/sys/class/net/{name}/macvtap/tap{index}/dev")
        try:
            major, minor = (int(x) for x in res.stdout.strip().split(":"))
        except ValueError:
            raise NetError(f"{ns.name}: cannot read the device number of macvtap {name}") from None
        node = devdir / f"{ns.name}-{name}"  # ifindexes repeat across namespaces; names do not
        try:
            os.mknod(node, 0o600 | 0o020000, os.makedev(major, minor))
        except OSError as exc:
            raise NetError(
                f"{node}: cannot create the macvtap device node ({exc.strerror}); is the work dir mounted nodev?"
            ) from None
        return str(node)


class NatTopology(Topology):
    """libvirt's default network: a bridge with a private subnet, forwarding and nftables masquerade.

    Clients sit behind the NAT on host 0; servers on the outside LAN, which is
    host 1 with two hosts or a separate ``…-out`` namespace with one. Like
    libvirt's rules: masquerade what leaves the subnet, let replies back in,
    allow traffic between guests on the bridge, reject anything else in.
    """

    kind = "nat"
    GUEST_NET, GATEWAY = "198.18.100.0/24", "198.18.100.1"
    OUTSIDE_NET, UPLINK, OUTSIDE_GW = "198.19.0.0/24", "198.19.0.1", "198.19.0.254"

    def preflight(self) -> None:
        super().preflight()
        if self.runner.which("nft") is None:
            raise NetError("the NAT topology needs nft (Debian package nftables)")
        if self.runner.which("sysctl") is None:
            raise NetError("the NAT topology needs sysctl (Debian package procps)")

    def _build(self) -> None:
        nat = self.host_ns(0)
        if self.spec.hosts == 2:
            outside = self.host_ns(1)
        else:
            outside = self.add_namespace("out")
            nat.ip("link", "add", SWITCH, "type", "veth", "peer", "name", SWITCH, "netns", outside.name)
            for ns in (nat, outside):
                ns.set_mtu(SWITCH, self.spec.mtu)
                ns.up(SWITCH)
        self.facts["outside_netns"] = outside.name
        # NAT host: bridge with the gateway address, uplink with the outside address
        self._linux_bridge(nat, "kvnat0")
        nat.add_address("kvnat0", f"{self.GATEWAY}/24")
        nat.add_address(SWITCH, f"{self.UPLINK}/24")
        nat.ip("route", "add", "default", "via", self.OUTSIDE_GW)
        nat.sysctl("net.ipv4.ip_forward", "1")
        nat.exec("nft", "-f", "-", input_text=self.ruleset())
        # outside LAN: a plain bridge with the uplink's peer and the servers
        self._linux_bridge(outside, "kvlan0")
        outside.ip("link", "set", "dev", SWITCH, "master", "kvlan0")
        outside.add_address("kvlan0", f"{self.OUTSIDE_GW}/24")
        for role, pair, _h in self._roles():
            ns = nat if role == "client" else outside
            tap = f"kvtap-{role[0]}{pair}"
            guest = self._tap(ns, tap, master="kvnat0" if role == "client" else "kvlan0")
            if role == "client":
                addr, gw = f"198.18.100.{10 + pair}/24", self.GATEWAY
            else:
                addr, gw = f"198.19.0.{110 + pair}/24", self.OUTSIDE_GW
            self.endpoints.append(
                Endpoint(
                    name=f"{role[0]}{pair}",
                    role=role,
                    pair=pair,
                    host=0 if role == "client" else self.spec.hosts - 1,
                    netns=ns.name,
                    backend=Backend.TAP,
                    mac=_mac(role, pair),
                    address=check_address(addr),
                    gateway=gw,
                    mtu=self.spec.mtu,
                    vhost=self.vhost,
                    connect_address=addr.split("/")[0],
                    ifname=tap,
                    guest_netns=guest,
                )
            )
        for ns, br in ((nat, "kvnat0"), (outside, "kvlan0")):
            ns.set_mtu(br, self.spec.mtu)
        self.facts["nat"] = "nftables masquerade (libvirt default network rules)"

    def ruleset(self) -> str:
        net, br = self.GUEST_NET, "kvnat0"
        return f"""table ip kvmtune_nat {{
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr {net} ip daddr 224.0.0.0/24 return
    ip saddr {net} ip daddr 255.255.255.255 return
    ip saddr {net} ip daddr != {net} meta l4proto tcp counter masquerade to :1024-65535
    ip saddr {net} ip daddr != {net} meta l4proto udp counter masquerade to :1024-65535
    ip saddr {net} ip daddr != {net} counter masquerade
  }}
  chain forward {{
    type filter hook forward priority filter; policy accept;
    oifname "{br}" ip daddr {net} ct state related,established counter accept
    iifname "{br}" ip saddr {net} counter accept
    iifname "{br}" oifname "{br}" accept
    oifname "{br}" counter reject
    iifname "{br}" counter reject
  }}
}}
"""

    def masquerade_packets(self) -> int:
        """Packets the masquerade rules have translated so far (the NAT really in the path)."""
        res = self.host_ns(0).exec("nft", "-j", "list", "chain", "ip", "kvmtune_nat", "postrouting")
        total = 0
        try:
            for item in json.loads(res.stdout)["nftables"]:
                rule = item.get("rule")
                if rule and any("masquerade" in e for e in rule["expr"]):
                    total += sum(e["counter"]["packets"] for e in rule["expr"] if "counter" in e)
        except (ValueError, KeyError, TypeError):
            raise NetError("cannot read the NAT counters") from None
        return total


class UserTopology(Topology):
    """QEMU user-mode networking (slirp): the baseline to avoid.

    There is no host-side device: every guest has a private slirp network.
    A server's ports are forwarded (``hostfwd``) to its QEMU process's
    namespace; a client reaches them through slirp's host address (one host)
    or the other host's switch address (two hosts).
    """

    kind = "user"
    H0_ADDR, H1_ADDR = "198.19.1.1", "198.19.1.2"

    def _build(self) -> None:
        if self.spec.hosts == 2:
            self.host_ns(0).add_address(SWITCH, f"{self.H0_ADDR}/24")
            self.host_ns(1).add_address(SWITCH, f"{self.H1_ADDR}/24")
            fwd, dial = self.H1_ADDR, self.H1_ADDR
        else:
            fwd, dial = "127.0.0.1", SLIRP_HOST
        for role, pair, h in self._roles():
            server = role == "server"
            ports = tuple(USER_PORT_BASE + 10 * pair + i for i in range(self.spec.user_ports)) if server else ()
            self.endpoints.append(
                Endpoint(
                    name=f"{role[0]}{pair}",
                    role=role,
                    pair=pair,
                    host=h,
                    netns=self.host_ns(h).name,
                    backend=Backend.USER,
                    mac=_mac(role, pair),
                    address=check_address(SLIRP_GUEST),
                    gateway=SLIRP_HOST,
                    mtu=1500,
                    vhost=False,
                    connect_address=dial if server else SLIRP_GUEST.split("/")[0],
                    ports=ports,
                    hostfwd_address=fwd if server else None,
                )
            )
        self.facts["slirp_net"] = SLIRP_NET


_CLASSES: dict[str, type[Topology]] = {
    c.kind: c for c in (BridgeTopology, OvsTopology, MacvtapTopology, NatTopology, UserTopology)
}


def make_topology(
    spec: TopologySpec,
    *,
    runner: Runner | None = None,
    host: HostRoot | None = None,
    workdir: Path | None = None,
    runid: str | None = None,
) -> Topology:
    """The topology ``spec.kind`` asks for (not yet up: use it as a context manager or call ``up()``)."""
    spec.validate()
    return _CLASSES[spec.kind](spec, runner=runner, host=host, workdir=workdir, runid=runid)


# --------------------------------------------------------------------------- helpers


def _ovs_version(runner: Runner) -> str | None:
    res = runner.run(["ovs-vswitchd", "--version"], timeout=10)
    m = re.search(r"(\d+\.\d+(\.\d+)?)", res.stdout)
    return m.group(1) if m else None


def _safe_list(runner: Runner) -> list[str]:
    try:
        return list_namespaces(runner)
    except NetError:
        return []


def _empty_namespace(host: HostRoot, ns: Netns) -> list[str]:
    """Stop every process still inside namespace ``ns`` (they are all kvmtune's)."""
    from kvmtune.lab.net.cleanup import kill_pids

    pids = ns.pids()
    if not pids:
        return []
    survivors = kill_pids(host, pids)
    return [f"pid {p} in {ns.name} survived SIGKILL" for p in survivors]


@contextmanager
def _signals_deferred() -> Iterator[None]:
    """Hold SIGINT/SIGTERM while tearing down; they are delivered right after."""
    sigs = {signal.SIGINT, signal.SIGTERM}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
