"""Helpers for the network topology tests: what is left of a run, and is the root namespace untouched."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
from pathlib import Path

from kvmtune.lab.net.netns import ADDRESS_SPACE
from proc_helpers import processes_mentioning

OUR_LINK_PREFIXES = ("kvbr", "kvtap-", "kvsw", "kvmvt-", "kvlow", "kvnat", "kvlan")


def namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


_OWN_NETNS_DIR = (
    'mkdir -p /run/netns && mount -t tmpfs kvmtune-test /run/netns || exit 99; '
    '"$@"; rc=$?; ls -A /run/netns > "$KVT_NAMESPACES_SEEN"; exit $rc'
)


def run_seeing_own_namespaces(argv: list[str], listing: Path) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run ``argv`` with a private, empty /run/netns: the names returned are the namespaces it made and left.

    Other processes (other test runs on the machine) create kvmtune-* namespaces at the same time; in a
    private mount namespace ``ip netns add`` puts its name in this run's own /run/netns only, so the
    listing holds this command's namespaces and no one else's.
    """
    env = {**os.environ, "KVT_NAMESPACES_SEEN": str(listing)}
    res = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", _OWN_NETNS_DIR, "sh", *argv],
                         capture_output=True, text=True, timeout=120, check=False, env=env)
    assert res.returncode != 99, f"cannot give the command a private /run/netns: {res.stderr}"
    return res, listing.read_text().split()


def root_namespace_leftovers() -> list[str]:
    """Anything of ours in the root namespace: links by our names, 198.18/15 addresses or routes, our nft table."""
    bad = []
    links = json.loads(subprocess.run(["ip", "-j", "addr", "show"], capture_output=True, text=True, check=True).stdout)
    for link in links:
        if str(link["ifname"]).startswith(OUR_LINK_PREFIXES):
            bad.append(f"link {link['ifname']}")
        for a in link.get("addr_info", []):
            if a.get("family") == "inet" and ipaddress.ip_address(a["local"]) in ADDRESS_SPACE:
                bad.append(f"address {a['local']} on {link['ifname']}")
    routes = subprocess.run(["ip", "route", "show", "table", "all"], capture_output=True, text=True, check=False).stdout
    bad += [f"route {r}" for r in routes.splitlines() if r.startswith(("198.18.", "198.19."))]
    if shutil.which("nft"):
        rules = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=False).stdout
        bad += [f"nft {t}" for t in rules.splitlines() if "kvmtune" in t]
    return bad


def assert_nothing_left(runid: str, rundir: Path) -> None:
    left_ns = [n for n in namespaces() if n.startswith(f"kvmtune-{runid}-")]
    assert not left_ns, f"namespaces left: {left_ns}"
    procs = processes_mentioning(str(rundir)) + processes_mentioning(f"kvmtune-{runid}-")
    assert not procs, f"processes left: {procs}"
    assert not rundir.exists(), f"run directory left: {rundir}"
    root = root_namespace_leftovers()
    assert not root, f"root namespace touched: {root}"


def wait_processes_gone(text: str, seconds: float = 2.0) -> list[str]:
    """Processes whose command line mentions ``text`` still alive after ``seconds`` (children die with kvmtune)."""
    import time

    deadline = time.monotonic() + seconds
    left = processes_mentioning(text)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = processes_mentioning(text)
    return left
