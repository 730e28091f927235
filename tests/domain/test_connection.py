"""Reading a libvirt's domains: one listing, one XML call per domain, nothing else asked per domain.

Against libvirt's test driver (``test:///FILE``): the real libvirt API and domain XML, no daemon. A node
file's ``<test:runstate>5</test:runstate>`` defines a domain shut off.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from kvmtune.domain.connection import read_domains

libvirt = pytest.importorskip("libvirt")

REPO = Path(__file__).resolve().parents[2]
TEST_NS = "http://libvirt.org/schemas/domain/test/1.0"


def _domain(name: str, *, running: bool, cache: str = "none") -> str:
    state = "" if running else "<test:runstate>5</test:runstate>"
    return (f"<domain type='kvm' xmlns:test='{TEST_NS}'><name>{name}</name><memory unit='MiB'>512</memory>"
            "<vcpu>1</vcpu><os><type arch='x86_64'>hvm</type></os><devices>"
            f"<disk type='file' device='disk'><driver name='qemu' type='raw' cache='{cache}'/>"
            f"<source file='/nonexistent/{name}.raw'/><target dev='vda' bus='virtio'/></disk>"
            f"</devices>{state}</domain>")


@pytest.fixture
def node(tmp_path: Path) -> str:
    """Shut off, running, shut off, running: listed by libvirt in this order."""
    path = tmp_path / "node.xml"
    path.write_text("<node>" + _domain("off-a", running=False, cache="unsafe") + _domain("on-b", running=True)
                    + _domain("off-c", running=False) + _domain("on-d", running=True, cache="unsafe") + "</node>")
    return f"test://{path}"


class _Calls:
    """Counts the libvirt calls kvmtune makes (the binding's methods, wrapped), by name and flags."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: Counter[tuple[str, int | None]] = Counter()
        self.listed: list[tuple[str, bool]] = []  # what listAllDomains returned: name, running
        self._own = False  # the spy asking libvirt itself: not counted
        for cls, names in ((libvirt.virConnect, ("listAllDomains", "listDomainsID", "listDefinedDomains",
                                                 "getAllDomainStats", "domainListGetStats")),
                           (libvirt.virDomain, ("XMLDesc", "isActive", "state", "info", "ID", "name", "UUIDString"))):
            for name in names:
                monkeypatch.setattr(cls, name, self._wrap(name, getattr(cls, name)))

    def _wrap(self, name: str, real: Any) -> Any:
        def call(obj: object, *args: Any, **kwargs: Any) -> Any:
            if self._own:
                return real(obj, *args, **kwargs)
            self.seen[(name, args[0] if args and isinstance(args[0], int) else None)] += 1
            out = real(obj, *args, **kwargs)
            if name == "listAllDomains":
                self._own = True
                self.listed += [(d.name(), bool(d.isActive())) for d in out]
                self._own = False
            return out
        return call


def test_one_listing_tells_running_from_shut_off(node: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _Calls(monkeypatch)
    guests, errors = read_domains(node)
    assert errors == []
    # whether each runs is what libvirt says; running first, each group in libvirt's order
    assert sorted(calls.listed) == [("off-a", False), ("off-c", False), ("on-b", True), ("on-d", True)]
    assert [(g.name, g.active) for g in guests] == [d for d in calls.listed if d[1]] + [d for d in calls.listed if not d[1]]
    inactive = libvirt.VIR_DOMAIN_XML_INACTIVE
    assert calls.seen == Counter({("listAllDomains", 0): 1, ("ID", None): 4, ("name", None): 4,
                                  ("XMLDesc", 0): 2, ("XMLDesc", inactive): 2})


def test_a_domain_libvirt_cannot_describe_costs_one_line(node: str, monkeypatch: pytest.MonkeyPatch) -> None:
    real = libvirt.virDomain.XMLDesc

    def xml_desc(dom: Any, flags: int = 0) -> str:
        if dom.name() == "off-c":
            raise libvirt.libvirtError("Domain not found: no domain with matching name 'off-c'")
        return str(real(dom, flags))

    monkeypatch.setattr(libvirt.virDomain, "XMLDesc", xml_desc)
    guests, errors = read_domains(node)
    assert sorted(g.name for g in guests) == ["off-a", "on-b", "on-d"]
    assert errors == [f"{node}#off-c: Domain not found: no domain with matching name 'off-c'"]


def test_audit_of_a_libvirt_uri_reports_its_running_and_shut_off_domains(node: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.run([sys.executable, "-m", "kvmtune", "audit", "-c", node, "--format", "json", "--no-agent"],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert f"libvirt {node}: 4 domain(s), 2 active" in doc["looked_at"]
    unsafe = sorted(f["target"]["domain"] for f in doc["findings"] if f["rule"] == "KVM-STO-004")
    assert unsafe == ["off-a", "on-d"]
