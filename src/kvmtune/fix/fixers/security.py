"""Fixes for the entropy rules (KVM-SEC-*)."""

from __future__ import annotations

from lxml import etree

from kvmtune.fix.fixers._util import new
from kvmtune.fix.registry import FixCall, NotFixable, xml_fixer


@xml_fixer("KVM-SEC-001", "add a virtio-rng device fed by the host's /dev/urandom")
def rng_add(call: FixCall) -> str:
    rng = new("rng", model="virtio")
    rng.append(new("backend", "/dev/urandom", model="random"))
    call.doc.append(call.devices(), rng)
    return "add <rng model='virtio'> with backend /dev/urandom"


@xml_fixer("KVM-SEC-002", "virtio-rng backend /dev/urandom instead of /dev/random")
def rng_urandom(call: FixCall) -> str:
    found = call.doc.tree.xpath(call.finding.evidence)
    backend = found[0] if isinstance(found, list) and found else None
    if not isinstance(backend, etree._Element) or backend.tag != "backend":
        raise NotFixable("cannot find the rng <backend>")
    if any(isinstance(c.tag, str) for c in backend):
        raise NotFixable("the rng backend has child elements")
    old = (backend.text or "").strip() or "unset (/dev/random)"
    call.doc.set_text(backend, "/dev/urandom")
    return f"backend {old} → /dev/urandom"
