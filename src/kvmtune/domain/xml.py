"""Safe parsing of libvirt domain XML and its :class:`Guest` view.

Domain XML is read as untrusted input: no DTD, no entities, no network, a
size cap. The lxml tree is kept whole so fixes can edit it in place and
everything kvmtune does not understand survives a round trip.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from lxml import etree

from kvmtune.errors import InputError
from kvmtune.inputs import read_regular
from kvmtune.model.guest import Disk, Guest, Nic, Rng
from kvmtune.model.values import (
    VFIO_HOSTDEV_TYPES,
    bus_of_target,
    disk_protocol,
    low,
    placeholders,
    switch_on,
    unit_kib,
    xml_int,
)
from kvmtune.qemuopts import Aio, Cache, DetectZeroes, Discard

MAX_XML_BYTES = 16 * 1024 * 1024
# the virtio-serial port name QEMU's guest agent listens on (libvirt's <channel><target name=...>)
AGENT_CHANNEL = "org.qemu.guest_agent.0"
# XML keywords are case-sensitive and an ENTITY can only be declared inside a DOCTYPE, so
# one plain search finds every DTD; bytes.find is much cheaper than a regular expression here.
_DOCTYPE = b"<!DOCTYPE"

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
        # no ID table: libvirt's XML has no xml:id and nothing here looks elements up by ID; keeping the
        # table cost a tenth of parsing the corpus (22 M instructions a round)
        collect_ids=False,
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
        raise InputError(where, f"malformed XML: {_libxml_message(exc.msg, data)}", err_line) from None


def _first_bad_utf8(data: bytes) -> str | None:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"0x{data[exc.start]:02X}"
    return None


def _libxml_message(raw: str | None, data: bytes = b"") -> str:
    """libxml2's message as one line in kvmtune's words: its advice to pass parser options
    (``use XML_PARSE_HUGE option``) is for programmers, and its encoding error spans two lines
    (libxml2 2.14, which lxml 6 wheels carry, says only "Invalid bytes in character encoding")."""
    msg = (raw or "not well-formed XML").split(", line ")[0]
    first, _, rest = msg.partition("\n")
    bad = _first_bad_utf8(data) if first.startswith("Invalid bytes in character encoding") else None
    if first.startswith("Input is not proper UTF-8") or bad:
        byte = re.search(r"Bytes: (0x[0-9A-Fa-f]{2})", rest)
        at = f" (byte {byte.group(1) if byte else bad})" if byte or bad else ""
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


def _numa_memory_kib(cpu: etree._Element | None) -> int | None:
    """With guest NUMA cells libvirt sizes the guest by their sum and ignores <memory>."""
    if cpu is None:
        return None
    total = 0
    for cell in _grandchildren(cpu, "numa", "cell"):
        size = xml_int(cell.get("memory"))
        if size is None:
            return None
        total += unit_kib(size, cell.get("unit"))
    return total or None


def memory_kib(el: etree._Element | None) -> int | None:
    if el is None or el.text is None:
        return None
    value = xml_int(el.text)
    if value is None:
        return None
    return unit_kib(value, el.get("unit"))


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


def _text(el: etree._Element | None) -> str | None:
    """An element's text, stripped; ``None`` when the element is absent or its text empty."""
    return ((el.text or "").strip() or None) if el is not None else None


def _attr(el: etree._Element | None, name: str) -> str | None:
    """An attribute of an element that may be absent."""
    return el.get(name) if el is not None else None


_NO_ATTRS: dict[str, str] = {}  # read only: the attributes of an absent element


def _attrs(el: etree._Element | None) -> dict[str, str]:
    """All attributes of an element that may be absent, in one call into lxml: each ``get`` encodes
    and checks its name and decodes the value (~2,000 instructions), ``items()`` does all of them at
    once (a <driver> or <source> of which several attributes are read)."""
    return dict(el.items()) if el is not None else _NO_ATTRS  # type: ignore[arg-type]


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


# --- devices: one reader per element below <devices> ---------------------------------------------

def _disk_source(source: dict[str, str]) -> str | None:
    return source.get("file") or source.get("dev") or source.get("name") or source.get("dir") or source.get("volume")


def _disk(el: etree._Element, locator: str) -> Disk:
    kids = _children(el)
    driver_el = kids.get("driver")
    driver, target, source = _attrs(driver_el), _attrs(kids.get("target")), _attrs(kids.get("source"))
    src_type = low(el.get("type")) or "file"  # libvirt: a disk without type is a file
    device = low(el.get("device"))
    disk = Disk(
        target=target.get("dev") or "?",
        device=device or "disk",
        bus=low(target.get("bus")),
        format=low(driver.get("type")),
        iothread=driver.get("iothread"),
        queues=xml_int(driver.get("queues")),
        queue_size=xml_int(driver.get("queue_size")),
        source_type=src_type,
        source=_disk_source(source),
        protocol=disk_protocol(src_type, device, low(source.get("protocol"))),
        readonly="readonly" in kids,
        shareable="shareable" in kids,
        locator=locator,
        evidence_below=DISK_EVIDENCE,
        element=el,
    )
    disk.cache = disk.take("cache", Cache, driver.get("cache"))
    disk.io = disk.take("io", Aio, driver.get("io"))
    disk.discard = disk.take("discard", Discard, driver.get("discard"))
    disk.detect_zeroes = disk.take("detect_zeroes", DetectZeroes, driver.get("detect_zeroes"))
    if driver_el is not None and disk.iothread is None and _first(driver_el, "iothreads") is not None:
        disk.iothread = "mapped"
    if disk.bus is None:
        disk.bus = bus_of_target(disk.target, disk.device)
        if disk.bus is not None:  # libvirt's inference: the evidence is the name it came from
            disk.evidence["bus"] = f"{locator}/target/@dev" if device != "floppy" else f"{locator}/@device"
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
    source, driver = _attrs(kids.get("source")), _attrs(kids.get("driver"))
    return Nic(
        index=index,
        type=low(el.get("type")),
        model=low(_attr(kids.get("model"), "type")),
        source=source.get("network") or source.get("bridge") or source.get("dev"),
        source_mode=low(source.get("mode")),
        virtualport=low(_attr(kids.get("virtualport"), "type")),
        driver_name=low(driver.get("name")),
        queues=xml_int(driver.get("queues")),
        rx_queue_size=xml_int(driver.get("rx_queue_size")),
        tx_queue_size=xml_int(driver.get("tx_queue_size")),
        mac=low(_attr(kids.get("mac"), "address")),
        mtu=xml_int(_attr(kids.get("mtu"), "size")),
        target_dev=_attr(kids.get("target"), "dev"),
        backend=low(_attr(kids.get("backend"), "type")),
        teaming=low(_attr(kids.get("teaming"), "type")),
        locator=locator,
        evidence_below=NIC_EVIDENCE,
        element=el,
    )


@dataclass
class _Devices:
    """What reading <devices> gathers besides the guest: SCSI controllers (disks may come before them)
    and the memory devices' sizes."""

    guest: Guest
    controllers: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # index -> (model, iothread)
    hotplug_kib: int = 0  # RAM: dimm, virtio-mem
    device_kib: int = 0  # not RAM: nvdimm, virtio-pmem (persistent memory the guest sees as a device)


def _read_disk(seen: _Devices, el: etree._Element, n: int) -> None:
    seen.guest.disks.append(_disk(el, f"/domain/devices/disk[{n}]"))


def _read_hostdev(seen: _Devices, el: etree._Element, n: int) -> None:
    if low(el.get("type")) in VFIO_HOSTDEV_TYPES:  # VFIO: pins all guest memory
        seen.guest.hostdevs += 1


def _read_interface(seen: _Devices, el: etree._Element, n: int) -> None:
    guest = seen.guest
    if low(el.get("type")) == "hostdev":
        guest.hostdevs += 1
    guest.nics.append(_nic(el, len(guest.nics), f"/domain/devices/interface[{n}]"))


def _read_controller(seen: _Devices, el: etree._Element, n: int) -> None:
    if low(el.get("type")) == "scsi":
        seen.controllers[el.get("index", "0")] = (low(el.get("model")) or "default",
                                                  _attr(_first(el, "driver"), "iothread"))


def _read_memory_device(seen: _Devices, el: etree._Element, n: int) -> None:
    if low(el.get("model")) in DEVICE_MEMORY_MODELS:
        seen.device_kib += _memory_device_kib(el)
    else:
        seen.hotplug_kib += _memory_device_kib(el)


def _read_memballoon(seen: _Devices, el: etree._Element, n: int) -> None:
    guest = seen.guest
    guest.memballoon = low(el.get("model"))
    guest.balloon_autodeflate = switch_on(el.get("autodeflate"))
    guest.balloon_free_page_reporting = switch_on(el.get("freePageReporting"))
    guest.balloon_stats_period = None
    for child in el:
        if child.tag == "stats":
            guest.balloon_stats_period = stats_period(child.get("period"))
            break
    guest.evidence["memballoon"] = f"/domain/devices/memballoon[{n}]"


def stats_period(value: str | None) -> int:
    """``<stats period>`` in seconds; 0 (no statistics) where it is absent, negative, not a decimal number or longer
    than 10 digits (libvirt refuses such a definition; kvmtune reads it as one without a period)."""
    text = (value or "").strip()
    if not text.isascii() or not text.isdigit() or len(text) > 10:
        return 0
    return int(text)


def _read_channel(seen: _Devices, el: etree._Element, n: int) -> None:
    if _attr(_first(el, "target"), "name") == AGENT_CHANNEL:
        seen.guest.agent_channel = True
        seen.guest.evidence["agent_channel"] = f"/domain/devices/channel[{n}]"


def _read_rng(seen: _Devices, el: etree._Element, n: int) -> None:
    backend = _first(el, "backend")
    seen.guest.rngs.append(Rng(model=low(el.get("model")), backend_model=low(_attr(backend, "model")),
                               backend_source=_text(backend), locator=f"/domain/devices/rng[{n}]",
                               index=len(seen.guest.rngs)))


DeviceReader = Callable[[_Devices, etree._Element, int], None]
# <devices> child tag -> its reader, called with the element and its 1-based position among its kind
DEVICE_READERS: dict[str, DeviceReader] = {
    "disk": _read_disk,
    "hostdev": _read_hostdev,
    "interface": _read_interface,
    "controller": _read_controller,
    "memory": _read_memory_device,
    "memballoon": _read_memballoon,
    "channel": _read_channel,
    "rng": _read_rng,
}


def _read_devices(guest: Guest, devices: etree._Element, cpu: etree._Element | None) -> None:
    seen = _Devices(guest)
    counts: dict[str, int] = {}
    for el in devices:
        tag = el.tag
        if not isinstance(tag, str):
            continue
        n = counts[tag] = counts.get(tag, 0) + 1
        read = DEVICE_READERS.get(tag)
        if read is not None:
            read(seen, el, n)
    _resolve_scsi_controllers(guest, seen.controllers)
    _add_memory_devices(guest, cpu, seen.hotplug_kib, seen.device_kib)


def _resolve_scsi_controllers(guest: Guest, controllers: dict[str, tuple[str, str | None]]) -> None:
    """Controllers may follow the disks that use them: SCSI controller models are resolved at the end."""
    for disk in guest.disks:
        if disk.bus == "scsi" and disk.element is not None:
            address = _first(disk.element, "address")
            disk.scsi_controller = ctrl = address.get("controller", "0") if address is not None else "0"
            disk.scsi_controller_model, disk.scsi_controller_iothread = controllers.get(ctrl, ("default", None))


# memory devices that are no RAM: persistent memory the guest sees as a device (never boot or hotplugged RAM)
DEVICE_MEMORY_MODELS = ("nvdimm", "virtio-pmem")


def _add_memory_devices(guest: Guest, cpu: etree._Element | None, hotplug_kib: int, device_kib: int) -> None:
    """With NUMA cells libvirt sizes the guest as their sum plus the memory devices; without, <memory> holds
    them. Hotplugged RAM (dimm, virtio-mem) counts as the guest's memory, device memory (nvdimm) never does."""
    guest.device_memory_kib = device_kib
    if not guest.memory_kib:
        return
    if cpu is not None and next(_grandchildren(cpu, "numa", "cell"), None) is not None:
        guest.memory_kib += hotplug_kib
    elif device_kib and guest.memory_kib > device_kib:
        guest.memory_kib -= device_kib
        guest.evidence["memory"] = "/domain/memory less the nvdimm devices"


def _memory_device_kib(el: etree._Element) -> int:
    """A <memory model='dimm|nvdimm|virtio-mem|...'> device's size (virtio-mem: what is plugged now)."""
    target = _first(el, "target")
    if target is None:
        return 0
    size_el = _first(target, "requested") if low(el.get("model")) == "virtio-mem" else None
    if size_el is None:
        size_el = _first(target, "size")
    return memory_kib(size_el) or 0


# --- the domain: one reader per top-level element -------------------------------------------------

def _read_os(guest: Guest, top: dict[str, etree._Element]) -> None:
    os_el = top.get("os")
    os_type = _first(os_el, "type") if os_el is not None else None
    guest.arch = low(_attr(os_type, "arch"))
    guest.machine = low(_attr(os_type, "machine"))


def _read_vcpu(guest: Guest, top: dict[str, etree._Element]) -> None:
    # vCPUs online at boot (current=), as on the command line's -smp; the maximum only matters for hot-plug
    vcpu = top.get("vcpu")
    guest.vcpus = (xml_int(vcpu.get("current")) or xml_int(vcpu.text)) if vcpu is not None else 1


def _read_memory(guest: Guest, top: dict[str, etree._Element]) -> None:
    guest.memory_kib = _numa_memory_kib(top.get("cpu")) or memory_kib(top.get("memory"))


def _read_cpu(guest: Guest, top: dict[str, etree._Element]) -> None:
    cpu = top.get("cpu")
    guest.cpu_mode = low(_attr(cpu, "mode"))
    model = _text(_first(cpu, "model") if cpu is not None else None)
    guest.cpu_model = model.lower() if model is not None else None


def _read_cputune(guest: Guest, top: dict[str, etree._Element]) -> None:
    cputune, vcpu = top.get("cputune"), top.get("vcpu")
    guest.vcpu_pinned = (cputune is not None and _first(cputune, "vcpupin") is not None) or \
        _attr(vcpu, "cpuset") is not None


def _read_numatune(guest: Guest, top: dict[str, etree._Element]) -> None:
    guest.numatune = "numatune" in top


def _read_memory_backing(guest: Guest, top: dict[str, etree._Element]) -> None:
    backing = top.get("memoryBacking")
    kids = _children(backing) if backing is not None else {}
    guest.nosharepages = "nosharepages" in kids
    guest.hugepages = "hugepages" in kids
    guest.memory_locked = "locked" in kids
    if guest.hugepages:
        pages = kids["hugepages"].iterchildren("page")
        sizes = {unit_kib(n, page.get("unit")) for page in pages if (n := xml_int(page.get("size")))}
        guest.hugepage_sizes_kib = tuple(sorted(sizes))


def _read_iothreads(guest: Guest, top: dict[str, etree._Element]) -> None:
    guest.iothreads = (xml_int(top["iothreads"].text) or 0) if "iothreads" in top else 0
    if not guest.iothreads and "iothreadids" in top:
        guest.iothreads = len(top["iothreadids"])


# kvmtune's own namespace in libvirt's <metadata> (libvirt keeps foreign namespaces there)
KVMTUNE_NS = "urn:kvmtune:1"
LIBOSINFO_OS = "{http://libosinfo.org/xmlns/libvirt/domain/1.0}os"


def _read_current_memory(guest: Guest, top: dict[str, etree._Element]) -> None:
    guest.current_memory_kib = memory_kib(top.get("currentMemory"))


def _read_clock(guest: Guest, top: dict[str, etree._Element]) -> None:
    guest.clock_offset = low(_attr(top.get("clock"), "offset"))


def _read_metadata(guest: Guest, top: dict[str, etree._Element]) -> None:
    """kvmtune's waivers and libosinfo's OS id, from <metadata>."""
    meta = top.get("metadata")
    if meta is None:
        return
    guest.waivers = tuple(
        {str(k): str(v) for k, v in el.attrib.items()}
        for el in meta.iter(f"{{{KVMTUNE_NS}}}waiver")
    )
    os_el = next(meta.iter(LIBOSINFO_OS), None)
    guest.libosinfo_id = (_attr(os_el, "id") or "").strip() or None


DomainReader = Callable[[Guest, dict[str, etree._Element]], None]
# top-level element -> its reader; every reader runs for every domain (an absent element sets the default)
# and gets all top-level elements, for values libvirt derives from two (memory from <cpu><numa>)
DOMAIN_READERS: dict[str, DomainReader] = {
    "os": _read_os,
    "vcpu": _read_vcpu,
    "memory": _read_memory,
    "cpu": _read_cpu,
    "cputune": _read_cputune,
    "numatune": _read_numatune,
    "memoryBacking": _read_memory_backing,
    "iothreads": _read_iothreads,
    "currentMemory": _read_current_memory,
    "clock": _read_clock,
    "metadata": _read_metadata,
}

_EVIDENCE = {
    "virt_type": "/domain/@type",
    "vcpus": "/domain/vcpu",
    "memory": "/domain/memory",
    "cpu": "/domain/cpu",
    "machine": "/domain/os/type/@machine",
    "vcpupin": "/domain/cputune/vcpupin",
    "memoryBacking": "/domain/memoryBacking",
    "iothreads": "/domain/iothreads",
    "current_memory": "/domain/currentMemory",
    "clock": "/domain/clock/@offset",
}


def _domain_root(tree: etree._ElementTree, origin: str) -> etree._Element:
    """The <domain> element; :class:`InputError` if the document is something else."""
    root = tree.getroot()
    tag = root.tag.rsplit("}", 1)[-1] if isinstance(root.tag, str) else ""
    if tag != "domain":
        what = {"network": "a libvirt network", "pool": "a storage pool", "volume": "a storage volume"}.get(
            tag, f"<{tag}>"
        )
        raise InputError(origin, f"not a libvirt domain: the root element is {what}", _line(root))
    return root


def guest_from_tree(tree: etree._ElementTree, origin: str, origin_kind: str = "xml", raw: bytes | None = None) -> Guest:
    """Build the :class:`Guest` view; raise :class:`InputError` if this is no domain.

    ``raw``, the bytes ``tree`` was parsed from, lets a definition without any brace be passed as no
    template without walking its tree (see :func:`_may_hold_placeholders`)."""
    root = _domain_root(tree, origin)
    top = _children(root)
    name = _text(top.get("name"))
    if name is None:
        raise InputError(origin, "domain has no <name>", _line(root))
    guest = Guest(name=name, uuid=_text(top.get("uuid")), origin=origin, origin_kind=origin_kind,
                  virt_type=low(root.get("type")), tree=tree)
    guest.derived[_TOP] = top
    for read in DOMAIN_READERS.values():
        read(guest, top)
    guest.evidence = dict(_EVIDENCE)
    if "cpu" in top:
        guest.evidence["cpu"] = "/domain/cpu/@mode"
    devices = top.get("devices")
    if devices is not None:
        _read_devices(guest, devices, top.get("cpu"))
    guest.template = _placeholders_in(root) if _may_hold_placeholders(tree, root, raw) else ()
    if guest.template:
        judged = _judged_placeholder(root)
        if judged is not None:
            guest.derived["template_judged"] = judged
        guest.forget_placeholders()
    return guest


# free text that may hold braces of its own: not part of what libvirt runs
_FREE_TEXT = frozenset({"metadata", "description", "title"})


# encodings in which every ASCII character is its own single byte, as in UTF-8 (UTF-16 and UTF-32 give
# ASCII text NUL bytes, which the check below also looks for: a byte-order mark needs no declaration)
_ASCII_BYTES_ENCODINGS = ("utf-8", "utf8", "us-ascii", "ascii", "iso-8859-")


def _ascii_bytes(tree: etree._ElementTree, raw: bytes) -> bool:
    """Whether every ASCII character of the document is its own byte in ``raw`` (or shows as NUL bytes).

    A document that begins with "<" but not "<?xml" declares no encoding: UTF-8, or UTF-16/32 behind a
    byte-order mark, whose NUL bytes the search finds. Asking lxml (its DocInfo) costs more than that search."""
    if raw[:1] == b"<" and not raw.startswith(b"<?xml"):
        return True
    return (tree.docinfo.encoding or "").lower().startswith(_ASCII_BYTES_ENCODINGS)


def _may_hold_placeholders(tree: etree._ElementTree, root: etree._Element, raw: bytes | None) -> bool:
    """False when no text or attribute of the document can hold a placeholder: each holds "{" or "%(".

    Walking every element and attribute in Python cost more than the rest of reading a domain; most
    definitions hold no brace at all, which a byte search of their source (or, without it, of the
    tree serialised in C) tells. Only with a brace or percent sign does :func:`_placeholders_in` look.
    """
    # bytes.find, not ``in``: ``needle in data`` first tries the needle as an integer (a byte value) and
    # builds a TypeError to discard, for each needle of each definition that holds none of them
    # what every placeholder (model.values.PLACEHOLDER) holds, "{" or "%", how XML could spell either without
    # it ("&#"), and NUL: "&#" only where "&" is (one-byte needles are a memchr, a two-byte one scans it all)
    if raw is not None and _ascii_bytes(tree, raw):
        return (raw.find(b"{") >= 0 or raw.find(b"%") >= 0 or raw.find(b"@") >= 0 or raw.find(b"\x00") >= 0
                or (raw.find(b"&") >= 0 and raw.find(b"&#") >= 0))
    text = etree.tostring(root, encoding="utf-8")
    return text.find(b"{") >= 0 or text.find(b"%") >= 0 or text.find(b"@") >= 0


def _placeholders_in(root: etree._Element) -> tuple[str, ...]:
    """The distinct template placeholders in the definition's attributes and text, in document order."""
    found: dict[str, None] = {}
    elements = [root, *(el for child in root if isinstance(child.tag, str) and child.tag not in _FREE_TEXT
                        for el in child.iter() if isinstance(el.tag, str))]
    for el in elements:
        for value in (*el.attrib.values(), el.text if el is not root else None):
            found.update(dict.fromkeys(placeholders(str(value)) if value is not None else ()))
    return tuple(found)


# where a placeholder changes no finding: names, paths, addresses and free text (each rule reads what the guest
# runs, never what it is called or where its files are); anywhere else it stands for a value a rule judges
_NAMING_TEXT = frozenset({"name", "uuid", "title", "description", "emulator", "loader", "nvram", "kernel", "initrd",
                          "cmdline", "dtb", "backend", "label", "imagelabel", "baselabel", "genid", "serial",
                          "wwn", "vendor", "product", "alias"})
_NAMING_ATTRS = frozenset({"file", "dev", "network", "bridge", "path", "dir", "name", "pool", "volume", "socket",
                           "passwd", "listen", "host", "port", "tlsPort", "websocket", "portgroup", "keymap",
                           "uuid", "id", "alias", "serial", "wwn", "target"})
_NAMING_ELEMENTS = frozenset({"address", "mac", "alias", "seclabel", "graphics", "serial", "console", "channel",
                              "source", "listen", "boot"})


def _judged_placeholder(root: etree._Element) -> tuple[str, str, int | None] | None:
    """The first placeholder in a value a rule judges (memory, vCPUs, a cache mode, a model): (placeholder,
    where, line); ``None`` when every placeholder names something (a path, a MAC, a bridge)."""
    for child in root:
        if not isinstance(child.tag, str) or child.tag in _FREE_TEXT:
            continue
        for el in child.iter():
            tag = el.tag
            if not isinstance(tag, str):
                continue
            naming_el = tag in _NAMING_ELEMENTS
            for attr, value in el.attrib.items():
                found = placeholders(str(value))
                if found and not naming_el and str(attr) not in _NAMING_ATTRS:
                    return found[0], f"<{tag} {attr!s}=>", _line(el)
            found = placeholders(el.text) if el.text else []
            if found and tag not in _NAMING_TEXT and not naming_el:
                return found[0], f"<{tag}>", _line(el)
    return None


def load_guest_file(path: str | Path) -> Guest:
    where = str(path)
    data = read_regular(where, MAX_XML_BYTES)  # as read_xml_file, keeping the bytes for guest_from_tree
    return guest_from_tree(parse_xml_bytes(data, where), where, raw=data)
