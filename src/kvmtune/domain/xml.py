"""Safe parsing of libvirt domain XML and its :class:`Guest` view.

Domain XML is read as untrusted input: no DTD, no entities, no network, a
size cap. The lxml tree is kept whole so fixes can edit it in place and
everything kvmtune does not understand survives a round trip.
"""

from __future__ import annotations

import re
from pathlib import Path

from lxml import etree

from kvmtune.errors import InputError
from kvmtune.model.guest import Disk, Guest, Nic, Rng

MAX_XML_BYTES = 16 * 1024 * 1024
_DOCTYPE = re.compile(rb"<!DOCTYPE|<!ENTITY", re.IGNORECASE)

_UNIT_KIB = {
    "b": 1 / 1024, "bytes": 1 / 1024, "k": 1, "kib": 1, "kb": 1000 / 1024,
    "m": 1024, "mib": 1024, "mb": 1e6 / 1024, "g": 1024**2, "gib": 1024**2,
    "gb": 1e9 / 1024, "t": 1024**3, "tib": 1024**3, "tb": 1e12 / 1024,
}


def _parser() -> etree.XMLParser:
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
    if not data.strip():
        raise InputError(where, "empty file")
    if len(data) > MAX_XML_BYTES:
        raise InputError(where, f"larger than {MAX_XML_BYTES // (1024 * 1024)} MiB, refused")
    m = _DOCTYPE.search(data)
    if m:
        line = data.count(b"\n", 0, m.start()) + 1
        raise InputError(where, "DOCTYPE/ENTITY declarations are refused (no entity expansion, no DTD fetch)", line)
    try:
        return etree.ElementTree(etree.fromstring(data, _parser()))
    except etree.XMLSyntaxError as exc:
        line = exc.lineno if exc.lineno else None
        msg = (exc.msg or "not well-formed XML").split(", line ")[0]
        raise InputError(where, f"malformed XML: {msg}", line) from None


def read_xml_file(path: str | Path) -> etree._ElementTree:
    p = Path(path)
    try:
        if p.is_dir():
            raise InputError(str(p), "is a directory")
        with open(p, "rb") as fh:
            data = fh.read(MAX_XML_BYTES + 1)
    except FileNotFoundError:
        raise InputError(str(p), "no such file") from None
    except PermissionError:
        raise InputError(str(p), "not readable (permission denied)") from None
    except OSError as exc:
        raise InputError(str(p), exc.strerror or str(exc)) from None
    return parse_xml_bytes(data, str(p))


def _low(value: str | None) -> str | None:
    return value.strip().lower() if value is not None else None


def _path(el: etree._Element) -> str:
    return str(el.getroottree().getpath(el))


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.strip(), 0)
    except ValueError:
        return None


def memory_kib(el: etree._Element | None) -> int | None:
    if el is None or el.text is None:
        return None
    value = _int(el.text)
    if value is None:
        return None
    unit = (el.get("unit") or "KiB").lower()
    return int(value * _UNIT_KIB.get(unit, 1))


def _attr_ev(el: etree._Element | None, attr: str) -> str:
    return f"{_path(el)}/@{attr}" if el is not None else ""


def _disk(el: etree._Element, controllers: dict[str, str]) -> Disk:
    driver = el.find("driver")
    target = el.find("target")
    source = el.find("source")
    src_type = _low(el.get("type"))
    src = None
    if source is not None:
        src = source.get("file") or source.get("dev") or source.get("name") or source.get("dir") or source.get("volume")
        if src_type == "network" and source.get("protocol"):
            src = f"{source.get('protocol')}:{src or ''}"
    bus = _low(target.get("bus")) if target is not None else None
    disk = Disk(
        target=(target.get("dev") if target is not None else None) or "?",
        device=_low(el.get("device")) or "disk",
        bus=bus,
        cache=_low(driver.get("cache")) if driver is not None else None,
        io=_low(driver.get("io")) if driver is not None else None,
        format=_low(driver.get("type")) if driver is not None else None,
        discard=_low(driver.get("discard")) if driver is not None else None,
        detect_zeroes=_low(driver.get("detect_zeroes")) if driver is not None else None,
        iothread=driver.get("iothread") if driver is not None else None,
        queues=_int(driver.get("queues")) if driver is not None else None,
        source_type=src_type,
        source=src,
        readonly=el.find("readonly") is not None,
        shareable=el.find("shareable") is not None,
        locator=_path(el),
        element=el,
    )
    if driver is not None and driver.find("iothreads") is not None and disk.iothread is None:
        disk.iothread = "mapped"
    if bus == "scsi":
        address = el.find("address")
        ctrl = address.get("controller", "0") if address is not None else "0"
        disk.scsi_controller_model = controllers.get(ctrl, "default")
    disk.evidence = {
        "bus": _attr_ev(target, "bus"),
        "cache": _attr_ev(driver, "cache") if driver is not None else f"{disk.locator}/driver/@cache",
        "io": _attr_ev(driver, "io") if driver is not None else f"{disk.locator}/driver/@io",
        "format": _attr_ev(driver, "type") if driver is not None else f"{disk.locator}/driver/@type",
        "discard": f"{disk.locator}/driver/@discard",
        "iothread": f"{disk.locator}/driver/@iothread",
    }
    return disk


def _nic(el: etree._Element, index: int) -> Nic:
    model = el.find("model")
    source = el.find("source")
    driver = el.find("driver")
    mac = el.find("mac")
    mtu = el.find("mtu")
    target = el.find("target")
    vport = el.find("virtualport")
    nic = Nic(
        index=index,
        type=_low(el.get("type")),
        model=_low(model.get("type")) if model is not None else None,
        source=(source.get("network") or source.get("bridge") or source.get("dev")) if source is not None else None,
        source_mode=_low(source.get("mode")) if source is not None else None,
        virtualport=_low(vport.get("type")) if vport is not None else None,
        driver_name=_low(driver.get("name")) if driver is not None else None,
        queues=_int(driver.get("queues")) if driver is not None else None,
        mac=_low(mac.get("address")) if mac is not None else None,
        mtu=_int(mtu.get("size")) if mtu is not None else None,
        target_dev=target.get("dev") if target is not None else None,
        locator=_path(el),
        element=el,
    )
    nic.evidence = {
        "model": _attr_ev(model, "type") if model is not None else f"{nic.locator}/model/@type",
        "driver_name": _attr_ev(driver, "name") if driver is not None else f"{nic.locator}/driver/@name",
        "queues": f"{nic.locator}/driver/@queues",
        "mac": _attr_ev(mac, "address") if mac is not None else f"{nic.locator}/mac",
        "mtu": _attr_ev(mtu, "size") if mtu is not None else f"{nic.locator}/mtu",
        "type": f"{nic.locator}/@type",
        "source_mode": f"{nic.locator}/source/@mode",
    }
    return nic


def guest_from_tree(tree: etree._ElementTree, origin: str, origin_kind: str = "xml") -> Guest:
    """Build the :class:`Guest` view; raise :class:`InputError` if this is no domain."""
    root = tree.getroot()
    tag = etree.QName(root).localname if isinstance(root.tag, str) else ""
    if tag != "domain":
        what = {"network": "a libvirt network", "pool": "a storage pool", "volume": "a storage volume"}.get(
            tag, f"<{tag}>"
        )
        raise InputError(origin, f"not a libvirt domain: the root element is {what}", root.sourceline)
    name_el = root.find("name")
    if name_el is None or not (name_el.text or "").strip():
        raise InputError(origin, "domain has no <name>", root.sourceline)
    os_type = root.find("os/type")
    vcpu = root.find("vcpu")
    cpu = root.find("cpu")
    cpu_model = root.find("cpu/model")
    mem = root.find("memory")
    guest = Guest(
        name=name_el.text.strip(),
        origin=origin,
        origin_kind=origin_kind,
        virt_type=_low(root.get("type")),
        arch=_low(os_type.get("arch")) if os_type is not None else None,
        machine=_low(os_type.get("machine")) if os_type is not None else None,
        vcpus=_int(vcpu.text) if vcpu is not None else None,
        memory_kib=memory_kib(mem),
        cpu_mode=_low(cpu.get("mode")) if cpu is not None else None,
        cpu_model=(cpu_model.text or "").strip().lower() or None if cpu_model is not None else None,
        vcpu_pinned=root.find("cputune/vcpupin") is not None or (vcpu is not None and vcpu.get("cpuset") is not None),
        numatune=root.find("numatune") is not None,
        nosharepages=root.find("memoryBacking/nosharepages") is not None,
        hugepages=root.find("memoryBacking/hugepages") is not None,
        iothreads=_int(root.findtext("iothreads")) or len(root.findall("iothreadids/iothread")),
        tree=tree,
    )
    if guest.vcpus is None and root.find("vcpu") is None:
        guest.vcpus = 1
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
    controllers: dict[str, str] = {}
    for c in root.findall("devices/controller"):
        if _low(c.get("type")) == "scsi":
            controllers[c.get("index", "0")] = _low(c.get("model")) or "default"
    for el in root.findall("devices/disk"):
        guest.disks.append(_disk(el, controllers))
    for i, el in enumerate(root.findall("devices/interface")):
        guest.nics.append(_nic(el, i))
    balloon = root.find("devices/memballoon")
    if balloon is not None:
        guest.memballoon = _low(balloon.get("model"))
        guest.balloon_autodeflate = _low(balloon.get("autodeflate")) == "on"
        guest.balloon_free_page_reporting = _low(balloon.get("freePageReporting")) == "on"
        guest.evidence["memballoon"] = _path(balloon)
    for el in root.findall("devices/rng"):
        backend = el.find("backend")
        guest.rngs.append(
            Rng(
                model=_low(el.get("model")),
                backend_model=_low(backend.get("model")) if backend is not None else None,
                backend_source=(backend.text or "").strip() or None if backend is not None else None,
                locator=_path(el),
            )
        )
    return guest


def load_guest_file(path: str | Path) -> Guest:
    return guest_from_tree(read_xml_file(path), str(path))
