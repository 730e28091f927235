"""Stand-in guests: check a topology end to end before (or without) booting QEMU guests.

A stand-in is a namespace with a tap ``eth0`` configured exactly as the guest
would configure its NIC (same MAC, address, gateway, MTU), wired to the
endpoint's host-side backend by a small relay process (``relay.py``): the
very tap, macvtap device or slirp stack a QEMU guest would use. For
user-mode networking the slirp stack is QEMU's own (``qemu-system-x86_64 -M
none`` with the endpoint's ``-netdev user`` joined to the relay through a
hub), so the check exercises the same path a guest would.

:func:`check_topology` attaches a stand-in to every endpoint, then pings with
the don't-fragment bit set (small and full-MTU payloads) in both directions,
and reports each check. Processes and namespaces belong to the topology and
go away with it.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvmtune.lab.net.netns import NetError, Netns
from kvmtune.lab.net.topology import SLIRP_HOST, Endpoint, NatTopology, Topology
from kvmtune.qemuopts import keyval

RELAY = Path(__file__).with_name("relay.py")
PROBE = Path(__file__).with_name("probe.py")
READY_TIMEOUT = 15.0


@dataclass
class Standin:
    endpoint: Endpoint
    ns: Netns
    relay: subprocess.Popen[bytes]


def _wait_line(proc: subprocess.Popen[bytes], token: bytes, what: str, timeout: float = READY_TIMEOUT) -> None:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    buf = b""
    while token not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise NetError(f"{what} did not start within {timeout:.0f}s")
        ready, _, _ = select.select([proc.stdout], [], [], left)
        if ready:
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                err = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
                proc.wait(timeout=5)
                raise NetError(f"{what} exited {proc.returncode}: {err.splitlines()[-1] if err else 'no error output'}")
            buf += chunk


def _slirp_qemu(topo: Topology, ep: Endpoint) -> str:
    """Start QEMU's slirp for a user-mode endpoint; return the relay's side-A spec."""
    qemu = topo.runner.which("qemu-system-x86_64")
    if qemu is None:
        raise NetError("checking user-mode networking needs qemu-system-x86_64 (Debian package qemu-system-x86)")
    qsock, wsock = topo.rundir / f"slirp-{ep.name}.q", topo.rundir / f"slirp-{ep.name}.w"
    argv = [
        *ep.exec_prefix, qemu, "-M", "none", "-nodefaults", "-display", "none", "-monitor", "none", "-serial", "none",
        "-pidfile", str(topo.rundir / f"qemu-{ep.name}.pid"),
        "-netdev", ep.netdev_arg("u0"),
        "-netdev", keyval(("id", "d0"), ("local.type", "unix"), ("local.path", qsock), ("remote.type", "unix"),
                          ("remote.path", wsock), first="dgram"),
        "-netdev", "hubport,id=p0,hubid=0,netdev=u0", "-netdev", "hubport,id=p1,hubid=0,netdev=d0",
    ]
    err = open(topo.rundir / f"qemu-{ep.name}.stderr", "wb")  # noqa: SIM115 - kept open by the child
    with err:
        proc = topo.runner.popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                 start_new_session=True)
    topo.add_process(proc, f"slirp qemu for {ep.name}")
    deadline = time.monotonic() + READY_TIMEOUT
    while not qsock.exists():
        if proc.poll() is not None:
            text = (topo.rundir / f"qemu-{ep.name}.stderr").read_text(errors="replace").strip()
            raise NetError(f"slirp QEMU for {ep.name} exited {proc.returncode}: {text.splitlines()[-1] if text else ''}")
        if time.monotonic() > deadline:
            raise NetError(f"slirp QEMU for {ep.name} did not start within {READY_TIMEOUT:.0f}s")
        time.sleep(0.02)
    return f"dgram:{wsock}:{qsock}"


def attach_standin(topo: Topology, ep: Endpoint) -> Standin:
    ns = topo.add_namespace(f"g{ep.name}")
    ns.ip("tuntap", "add", "dev", "eth0", "mode", "tap")
    ns.ip("link", "set", "dev", "eth0", "address", ep.mac)
    ns.set_mtu("eth0", ep.mtu)
    ns.add_address("eth0", ep.address)
    ns.up("eth0")
    if ep.gateway:
        ns.ip("route", "add", "default", "via", ep.gateway)
    side_a = ep.relay_side() or _slirp_qemu(topo, ep)
    argv = [*ep.exec_prefix, sys.executable, str(RELAY), "--rundir", str(topo.rundir), "--a", side_a,
            "--b-netns", ns.name, "--b-tap", "eth0"]
    relay = topo.runner.popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              start_new_session=True)
    topo.add_process(relay, f"stand-in relay for {ep.name}")
    _wait_line(relay, b"READY", f"stand-in relay for {ep.name}")
    return Standin(ep, ns, relay)


def ping(ns: Netns, address: str, size: int = 56, *, df: bool = True, count: int = 2, timeout: float = 2.0) -> dict[str, Any]:
    argv = [sys.executable, str(PROBE), "ping", address, "--size", str(size), "--count", str(count), "--timeout", str(timeout)]
    res = ns.exec(*argv, *([] if df else ["--no-df"]), check=False, timeout=count * timeout + 15)
    try:
        out: dict[str, Any] = json.loads(res.stdout)
        return out
    except ValueError:
        raise NetError(f"ping probe in {ns.name} failed: {res.describe_failure()}") from None


def tcp_serve(topo: Topology, ns: Netns, port: int) -> None:
    argv = [*ns.exec_prefix, sys.executable, str(PROBE), "tcp-serve", "--port", str(port)]
    proc = topo.runner.popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True)
    topo.add_process(proc, f"tcp echo server in {ns.name}")
    _wait_line(proc, b'"ready": true', f"tcp echo server in {ns.name}")


def tcp_check(ns: Netns, address: str, port: int, size: int = 65536) -> dict[str, Any]:
    res = ns.exec(sys.executable, str(PROBE), "tcp-check", address, str(port), "--size", str(size), check=False, timeout=30)
    try:
        out: dict[str, Any] = json.loads(res.stdout)
        return out
    except ValueError:
        raise NetError(f"tcp probe in {ns.name} failed: {res.describe_failure()}") from None


def check_topology(topo: Topology) -> dict[str, Any]:
    """Attach stand-ins to every endpoint and check reachability and MTU; the topology must be up."""
    start = time.monotonic()
    standins = {ep.name: attach_standin(topo, ep) for ep in topo.endpoints}
    attach_s = time.monotonic() - start
    checks: list[dict[str, Any]] = []

    def record(name: str, expect: bool, result: dict[str, Any]) -> None:
        ok = bool(result.get("received") or result.get("ok"))
        checks.append({"check": name, "expect_reachable": expect, "passed": ok == expect, "result": result})

    mtu = topo.spec.mtu
    for client, server in topo.pairs():
        c, s = standins[client.name], standins[server.name]
        tag = f"{client.name}->{server.name}"
        if topo.kind == "user":
            record(f"{client.name}->slirp host ping", True, ping(c.ns, SLIRP_HOST))
            tcp_serve(topo, s.ns, server.ports[0])
            record(f"{tag} tcp via hostfwd {server.connect_address}:{server.ports[0]}", True,
                   tcp_check(c.ns, server.connect_address, server.ports[0]))
            continue
        record(f"{tag} ping", True, ping(c.ns, server.connect_address))
        record(f"{tag} ping DF size {mtu - 28} (MTU {mtu})", True, ping(c.ns, server.connect_address, mtu - 28))
        if client.pair == 0:
            refused = ping(c.ns, server.connect_address, mtu - 27, count=1, timeout=0.5)
            record(f"{tag} ping DF size {mtu - 27} refused (DF really set)", False, refused)
        back = f"{server.name}->{client.name}"
        if isinstance(topo, NatTopology):
            record(f"{back} ping (NAT: outside cannot reach in)", False,
                   ping(s.ns, client.connect_address, count=1, timeout=0.5))
        else:
            record(f"{back} ping DF size {mtu - 28}", True, ping(s.ns, client.connect_address, mtu - 28))
    if isinstance(topo, NatTopology):
        n = topo.masquerade_packets()
        checks.append({"check": "masquerade counter > 0", "expect_reachable": True, "passed": n > 0,
                       "result": {"packets": n}})
    return {
        "topology": topo.kind, "runid": topo.runid, "hosts": topo.spec.hosts, "pairs": topo.spec.pairs, "mtu": mtu,
        "ok": all(c["passed"] for c in checks), "attach_s": round(attach_s, 3),
        "check_s": round(time.monotonic() - start - attach_s, 3), "checks": checks,
    }
