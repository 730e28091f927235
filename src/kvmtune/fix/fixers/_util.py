"""Small helpers shared by the fixers."""

from __future__ import annotations

from lxml import etree

from kvmtune.fix.registry import FixCall, NotFixable
from kvmtune.model.guest import Disk

# where libvirt writes top-level elements; a new one goes after the last of these present
_TOP_ORDER = ("name", "uuid", "genid", "title", "description", "metadata", "maxMemory", "memory",
              "currentMemory", "blkiotune", "memtune", "memoryBacking", "vcpu", "vcpus", "iothreads")


def new(tag: str, text: str | None = None, /, **attrs: str) -> etree._Element:
    el = etree.Element(tag)
    for k, v in attrs.items():
        el.set(k, v)
    if text is not None:
        el.text = text
    return el


def insert_top_level(call: FixCall, el: etree._Element, after: tuple[str, ...]) -> etree._Element:
    """Insert a new child of <domain> after the last present element named in ``after``."""
    root = call.root
    anchor = None
    for child in root:
        if isinstance(child.tag, str) and child.tag in after:
            anchor = child
    if anchor is None:
        for child in root:
            if isinstance(child.tag, str) and child.tag in _TOP_ORDER:
                anchor = child
    if anchor is None:
        return call.doc.append(root, el)
    return call.doc.insert_after(anchor, el)


def driver(call: FixCall, disk: Disk) -> etree._Element:
    el = call.child(disk.element, "driver")
    if el is None:
        raise NotFixable("the disk has no <driver> element")
    return el


def set_disk_driver(call: FixCall, disk: Disk, **attrs: str) -> str:
    """Set driver attributes (adding <driver> if absent); return 'a x → y, b → z'."""
    el = call.child(disk.element, "driver")
    before = {k: (el.get(k) if el is not None else None) for k in attrs}
    call.set_child_attrs(disk.element, "driver", **attrs)
    return ", ".join(f"{k} {before[k] or 'unset'} → {v}" for k, v in attrs.items() if before[k] != v)


def odirect_attrs(disk: Disk) -> dict[str, str]:
    """cache='none' and, unless an O_DIRECT-capable AIO mode is set already, io='native'."""
    attrs = {"cache": "none"}
    if (disk.io or "threads") in ("threads", "default", "native"):
        attrs["io"] = "native"
    return attrs
