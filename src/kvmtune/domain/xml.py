"""Safe parsing of libvirt domain XML and its :class:`Guest` view.

Domain XML is read as untrusted input: no DTD, no entities, no network, a
size cap. The lxml tree is kept whole so fixes can edit it in place and
everything kvmtune does not understand survives a round trip.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from types import MappingProxyType
from typing import Any

from lxml import etree

from kvmtune.errors import InputError
from kvmtune.inputs import read_regular
from kvmtune.model.guest import Disk, Guest, Nic, Rng

MAX_XML_BYTES = 16 * 1024 * 1024
# the virtio-serial port name QEMU's guest agent listens on (libvirt's <channel><target name=...>)
AGENT_CHANNEL = "org.qemu.guest_agent.0"
# XML keywords are case-sensitive and an ENTITY can only be declared inside a DOCTYPE, so
# one plain search finds every DTD; bytes.find is much cheaper than a regular expression here.
_DOCTYPE = b"<!DOCTYPE"

_UNIT_KIB = {
    "b": 1 / 1024, "bytes": 1 / 1024, "k": 1, "kib": 1, "kb": 1000 / 1024,
    "m": 1024, "mib": 1024, "mb": 1e6 / 1024, "g": 1024**2, "gib": 1024**2,
    "gb": 1e9 / 1024, "t": 1024**3, "tib": 1024**3, "tb": 1e12 / 1024,
}


_local = threading.local()


def _parser() -> etree.XMLParser:
    """One parser per thread: building a parser costs more than parsing a small domain."""
    parser: etree.XMLParser | None = getattr(_local, "parser", None)
    if parser is None:
        parser = _local.parser = _new_parser()
    return parser


def _new_parser() -> etree.XMLParser:
    return etree.XMLParser(
        resolve_entities=False,
        no_network=True,
        load_dtd=False,
        dtd_validation=False,
        huge_tree=False,
        remove_blank_text=False,
    )


def parse_xml_bytes(data: bytes, where: str) -> etree._ElementTree:
    """Parse untrusted XML; refuse DTDs and entities before lxml sees them."""
    if not data or data.isspace():
        raise InputError(where, "empty file")
    if len(data) > MAX_XML_BYTES:
        raise InputError(where, f"larger than {MAX_XML_BYTES // (1024 * 1024)} MiB, refused")
    at = data.find(_DOCTYPE)
    if at < 0:
        at = data.find(b"<!ENTITY")  # not well-formed without a DOCTYPE, but refuse it all the same
    if at >= 0:
        line = data.count(b"\n", 0, at) + 1
        raise InputError(where, "DOCTYPE/ENTITY declarations are refused (no entity expansion, no DTD fetch)", line)
    try:
        return etree.ElementTree(etree.fromstring(data, _parser()))
    except etree.XMLSyntaxError as exc:
        err_line: int | None = exc.lineno or None
        raise InputError(where, f"malformed XML: {_libxml_message(exc.msg)}", err_line) from None


def _libxml_message(raw: str | None) -> str:
    """libxml2's message as one line in kvmtune's words: its advice to pass parser options
    (``use XML_PARSE_HUGE option``) is for programmers, and its encoding error spans two lines."""
    msg = (raw or "not well-formed XML").split(", line ")[0]
    first, _, rest = msg.partition("\n")
    if first.startswith("Input is not proper UTF-8"):
        byte = re.search(r"Bytes: (0x[0-9A-Fa-f]{2})", rest)
        at = f" (byte {byte.group(1)})" if byte else ""
        return (f"not UTF-8 text{at} and no other encoding declared; declare it (<?xml version='1.0' "
                "encoding='ISO-8859-1'?>) or convert the file to UTF-8")
    first = re.sub(r"\s*,?\s*use XML_PARSE_HUGE option\s*$", "", first).strip()
    if first.startswith("Excessive depth in document"):
        limit = re.search(r"(\d+)", first)
        return f"elements nested deeper than {limit.group(1) if limit else 256} levels (refused)"
    if "huge" in first.lower() and "text" in first.lower():
        return "a text node larger than 10 MB (refused)"
    return first or "not well-formed XML"


def read_xml_file(path: str | Path) -> etree._ElementTree:
    """A domain XML file: regular files only (a FIFO is refused unopened), at most 16 MiB read."""
    data = read_regular(str(path), MAX_XML_BYTES)
    return parse_xml_bytes(data, str(path))


@lru_cache(maxsize=512)  # ~20,000 attribute values per corpus audit, most of them the same few dozen words
def _low(value: str | None) -> str | None:
    return value.strip().lower() if value is not None else None


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.strip(), 0)
    except ValueError:
        return None


def _numa_memory_kib(cpu: etree._Element | None) -> int | None:
    """With guest NUMA cells libvirt sizes the guest by their sum and ignores <memory>."""
    if cpu is None:
        return None
    total = 0
    for cell in _grandchildren(cpu, "numa", "cell"):
        size = _int(cell.get("memory"))
        if size is None:
            return None
        total += int(size * _UNIT_KIB.get((cell.get("unit") or "KiB").lower(), 1))
    return total or None


def memory_kib(el: etree._Element | None) -> int | None:
    if el is None or el.text is None:
        return None
    value = _int(el.text)
    if value is None:
        return None
    unit = (el.get("unit") or "KiB").lower()
    return int(value * _UNIT_KIB.get(unit, 1))


def _line(el: etree._Element) -> int | None:
    line = el.sourceline
    return line if isinstance(line, int) and line > 0 else None


def _first(el: etree._Element, tag: str) -> etree._Element | None:
    """``el.find(tag)`` for a plain tag, without ElementPath: lxml matches the tag in C."""
    return next(el.iterchildren(tag), None)


def _grandchildren(el: etree._Element, tag: str, sub: str) -> Iterator[etree._Element]:
    """``el.iterfind(f"{tag}/{sub}")`` without ElementPath, in the same (document) order."""
    for child in el.iterchildren(tag):
        yield from child.iterchildren(sub)


def top_elements(guest: Guest) -> dict[str, Any]:
    """The first child of each tag of a guest's <domain>, as read when the guest was built (several
    views of the guest read them: Windows hints, CPU layout); empty without an XML tree."""
    tree: Any = guest.tree
    if tree is None:
        return {}
    top: dict[str, Any] | None = guest.derived.get(_TOP)
    if top is None:
        top = guest.derived[_TOP] = _children(tree.getroot() if hasattr(tree, "getroot") else tree)
    return top


_TOP = "xml_top"


def _children(el: etree._Element) -> dict[str, etree._Element]:
    """First child per tag; one pass instead of many ElementPath look-ups."""
    out: dict[str, etree._Element] = {}
    for child in el:
        tag = child.tag
        if isinstance(tag, str) and tag not in out:
            out[tag] = child
    return out


# libvirt disk type -> the QEMU protocol driver it opens (network disks name theirs in source/@protocol)
_PROTOCOL_OF_TYPE = {"file": "file", "block": "host_device", "nvme": "nvme", "vhostuser": "virtio-blk-vhost-user",
                     "vhostvdpa": "virtio-blk-vhost-vdpa", "dir": "vvfat"}


def _disk(el: etree._Element, locator: str) -> Disk:
    kids = _children(el)
    driver = kids.get("driver")
    target = kids.get("target")
    source = kids.get("source")
    src_type = _low(el.get("type")) or "file"  # libvirt: a disk without type is a file
    src = None
    if source is not None:
        src = source.get("file") or source.get("dev") or source.get("name") or source.get("dir") or source.get("volume")
    protocol = _PROTOCOL_OF_TYPE.get(src_type)
    if src_type == "network" and source is not None:
        protocol = _low(source.get("protocol"))
    elif protocol == "host_device" and _low(el.get("device")) == "cdrom":
        protocol = "host_cdrom"
    bus = _low(target.get("bus")) if target is not None else None
    d = driver.get if driver is not None else (lambda _k, _d=None: None)
    disk = Disk(
        target=(target.get("dev") if target is not None else None) or "?",
        device=_low(el.get("device")) or "disk",
        bus=bus,
        cache=_low(d("cache")),
        io=_low(d("io")),
        format=_low(d("type")),
        discard=_low(d("discard")),
        detect_zeroes=_low(d("detect_zeroes")),
        iothread=d("iothread"),
        queues=_int(d("queues")),
        queue_size=_int(d("queue_size")),
        source_type=src_type,
        source=src,
        protocol=protocol,
        readonly="readonly" in kids,
        shareable="shareable" in kids,
        locator=locator,
        evidence_below=DISK_EVIDENCE,
        element=el,
    )
    if driver is not None and disk.iothread is None and _first(driver, "iothreads") is not None:
        disk.iothread = "mapped"
    return disk


# where each attribute of a <disk>/<interface> sits, below the element's own XPath (Disk.where adds it)
DISK_EVIDENCE = MappingProxyType({
    "bus": "/target/@bus",
    "cache": "/driver/@cache",
    "io": "/driver/@io",
    "format": "/driver/@type",
    "discard": "/driver/@discard",
    "iothread": "/driver/@iothread",
    "queues": "/driver/@queues",
    "queue_size": "/driver/@queue_size",
    "source": "/source",
    "controller": "/address/@controller",
})
NIC_EVIDENCE = MappingProxyType({
    "model": "/model/@type",
    "driver_name": "/driver/@name",
    "queues": "/driver/@queues",
    "rx_queue_size": "/driver/@rx_queue_size",
    "tx_queue_size": "/driver/@tx_queue_size",
    "mac": "/mac/@address",
    "mtu": "/mtu/@size",
    "type": "/@type",
    "source_mode": "/source/@mode",
})


def _nic(el: etree._Element, index: int, locator: str) -> Nic:
    kids = _children(el)
    model = kids.get("model")
    source = kids.get("source")
    driver = kids.get("driver")
    mac = kids.get("mac")
    mtu = kids.get("mtu")
    target = kids.get("target")
    vport = kids.get("virtualport")
    return Nic(
        index=index,
        type=_low(el.get("type")),
        model=_low(model.get("type")) if model is not None else None,
        source=(source.get("network") or source.get("bridge") or source.get("dev")) if source is not None else None,
        source_mode=_low(source.get("mode")) if source is not None else None,
        virtualport=_low(vport.get("type")) if vport is not None else None,
        driver_name=_low(driver.get("name")) if driver is not None else None,
        queues=_int(driver.get("queues")) if driver is not None else None,
        rx_queue_size=_int(driver.get("rx_queue_size")) if driver is not None else None,
        tx_queue_size=_int(driver.get("tx_queue_size")) if driver is not None else None,
        mac=_low(mac.get("address")) if mac is not None else None,
        mtu=_int(mtu.get("size")) if mtu is not None else None,
        target_dev=target.get("dev") if target is not None else None,
        backend=_low(kids["backend"].get("type")) if "backend" in kids else None,
        teaming=_low(kids["teaming"].get("type")) if "teaming" in kids else None,
        locator=locator,
        evidence_below=NIC_EVIDENCE,
        element=el,
    )


def guest_from_tree(tree: etree._ElementTree, origin: str, origin_kind: str = "xml") -> Guest:
    """Build the :class:`Guest` view; raise :class:`InputError` if this is no domain."""
    root = tree.getroot()
    tag = root.tag.rsplit("}", 1)[-1] if isinstance(root.tag, str) else ""
    if tag != "domain":
        what = {"network": "a libvirt network", "pool": "a storage pool", "volume": "a storage volume"}.get(
            tag, f"<{tag}>"
        )
        raise InputError(origin, f"not a libvirt domain: the root element is {what}", _line(root))
    top = _children(root)
    name_el = top.get("name")
    if name_el is None or not (name_el.text or "").strip():
        raise InputError(origin, "domain has no <name>", _line(root))
    os_el = top.get("os")
    os_type = _first(os_el, "type") if os_el is not None else None
    vcpu = top.get("vcpu")
    cpu = top.get("cpu")
    cpu_model = _first(cpu, "model") if cpu is not None else None
    cputune = top.get("cputune")
    backing = top.get("memoryBacking")
    backing_kids = _children(backing) if backing is not None else {}
    iothreadids = top.get("iothreadids")
    uuid_el = top.get("uuid")
    guest = Guest(
        name=(name_el.text or "").strip(),
        uuid=((uuid_el.text or "").strip() or None) if uuid_el is not None else None,
        origin=origin,
        origin_kind=origin_kind,
        virt_type=_low(root.get("type")),
        arch=_low(os_type.get("arch")) if os_type is not None else None,
        machine=_low(os_type.get("machine")) if os_type is not None else None,
        # vCPUs online at boot (current=), as on the command line's -smp; the maximum only matters for hot-plug
        vcpus=(_int(vcpu.get("current")) or _int(vcpu.text)) if vcpu is not None else 1,
        memory_kib=_numa_memory_kib(cpu) or memory_kib(top.get("memory")),
        cpu_mode=_low(cpu.get("mode")) if cpu is not None else None,
        cpu_model=((cpu_model.text or "").strip().lower() or None) if cpu_model is not None else None,
        vcpu_pinned=(cputune is not None and _first(cputune, "vcpupin") is not None)
        or (vcpu is not None and vcpu.get("cpuset") is not None),
        numatune="numatune" in top,
        nosharepages="nosharepages" in backing_kids,
        hugepages="hugepages" in backing_kids,
        memory_locked="locked" in backing_kids,
        iothreads=(_int(top["iothreads"].text) or 0) if "iothreads" in top else 0,
        tree=tree,
    )
    guest.derived[_TOP] = top
    if not guest.iothreads and iothreadids is not None:
        guest.iothreads = len(iothreadids)
    guest.evidence = {
        "virt_type": "/domain/@type",
        "vcpus": "/domain/vcpu",
        "memory": "/domain/memory",
        "cpu": "/domain/cpu/@mode" if cpu is not None else "/domain/cpu",
        "machine": "/domain/os/type/@machine",
        "vcpupin": "/domain/cputune/vcpupin",
        "memoryBacking": "/domain/memoryBacking",
        "iothreads": "/domain/iothreads",
    }
    devices = top.get("devices")
    if devices is None:
        return guest
    controllers: dict[str, tuple[str, str | None]] = {}
    hotplug_kib = 0
    counts: dict[str, int] = {}
    for el in devices:
        dtag = el.tag
        if not isinstance(dtag, str):
            continue
        n = counts[dtag] = counts.get(dtag, 0) + 1
        if dtag == "disk":
            guest.disks.append(_disk(el, f"/domain/devices/disk[{n}]"))
        elif dtag == "hostdev":
            if _low(el.get("type")) in ("pci", "mdev"):  # VFIO: pins all guest memory
                guest.hostdevs += 1
        elif dtag == "interface":
            if _low(el.get("type")) == "hostdev":
                guest.hostdevs += 1
            guest.nics.append(_nic(el, len(guest.nics), f"/domain/devices/interface[{n}]"))
        elif dtag == "controller" and _low(el.get("type")) == "scsi":
            drv = _first(el, "driver")
            controllers[el.get("index", "0")] = (
                _low(el.get("model")) or "default", drv.get("iothread") if drv is not None else None)
        elif dtag == "memory":
            hotplug_kib += _memory_device_kib(el)
        elif dtag == "memballoon":
            guest.memballoon = _low(el.get("model"))
            guest.balloon_autodeflate = _low(el.get("autodeflate")) == "on"
            guest.balloon_free_page_reporting = _low(el.get("freePageReporting")) == "on"
            guest.evidence["memballoon"] = f"/domain/devices/memballoon[{n}]"
        elif dtag == "channel":
            target = _first(el, "target")
            if target is not None and target.get("name") == AGENT_CHANNEL:
                guest.agent_channel = True
                guest.evidence["agent_channel"] = f"/domain/devices/channel[{n}]"
        elif dtag == "rng":
            backend = _first(el, "backend")
            guest.rngs.append(
                Rng(
                    model=_low(el.get("model")),
                    backend_model=_low(backend.get("model")) if backend is not None else None,
                    backend_source=((backend.text or "").strip() or None) if backend is not None else None,
                    locator=f"/domain/devices/rng[{n}]",
                )
            )
    # controllers may follow the disks that use them: resolve SCSI controller models at the end
    for disk in guest.disks:
        if disk.bus == "scsi" and disk.element is not None:
            address = _first(disk.element, "address")
            ctrl = address.get("controller", "0") if address is not None else "0"
            disk.scsi_controller = ctrl
            disk.scsi_controller_model, disk.scsi_controller_iothread = controllers.get(ctrl, ("default", None))
    if hotplug_kib and cpu is not None and next(_grandchildren(cpu, "numa", "cell"), None) is not None \
            and guest.memory_kib:
        # with NUMA cells libvirt sizes the guest as their sum plus the memory devices
        guest.memory_kib += hotplug_kib
    return guest


def _memory_device_kib(el: etree._Element) -> int:
    """A <memory model='dimm|nvdimm|virtio-mem|...'> device's size (virtio-mem: what is plugged now)."""
    target = _first(el, "target")
    if target is None:
        return 0
    size_el = _first(target, "requested") if _low(el.get("model")) == "virtio-mem" else None
    if size_el is None:
        size_el = _first(target, "size")
    return memory_kib(size_el) or 0


def load_guest_file(path: str | Path) -> Guest:
    return guest_from_tree(read_xml_file(path), str(path))
