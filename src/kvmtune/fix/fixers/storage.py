"""Fixes for the storage rules (KVM-STO-*)."""

from __future__ import annotations

import re

from lxml import etree

from kvmtune.fix.fixers._util import driver, insert_top_level, new, odirect_attrs, set_disk_driver
from kvmtune.fix.registry import FixCall, NotFixable, xml_fixer
from kvmtune.model.guest import Disk

_DEV = re.compile(r"^(hd|sd|vd|xvd|ub|fd|mmcblk)([a-z]+)$")


def _free_vd_name(call: FixCall, old: str) -> str:
    used = set()
    for target in call.root.iterfind("devices/disk/target"):
        dev = target.get("dev")
        if dev:
            used.add(dev)
    m = _DEV.match(old)
    if m and f"vd{m.group(2)}" not in used:
        return f"vd{m.group(2)}"
    for n in range(26 * 27):
        suffix = chr(97 + n) if n < 26 else chr(96 + n // 26) + chr(97 + n % 26)
        if f"vd{suffix}" not in used:
            return f"vd{suffix}"
    raise NotFixable("no free vdX name")


def _scsi_controller_of(call: FixCall, disk: Disk) -> tuple[str, etree._Element | None]:
    """The index of the SCSI controller ``disk`` is on (its ``<address controller>``, else 0), and that
    ``<controller type='scsi'>``, None where the definition does not write it."""
    address = call.child(disk.element, "address")
    index = address.get("controller", "0") if address is not None else "0"
    for ctrl in call.devices().iterfind("controller"):
        if (ctrl.get("type") or "") == "scsi" and (ctrl.get("index") or "0") == index:
            return index, ctrl
    return index, None


@xml_fixer("KVM-STO-001", "move the data disk to virtio-blk (bus='virtio', hdX/sdX → vdX)", bus_change=True)
def disk_bus_to_virtio(call: FixCall) -> str:
    disk = call.disk()
    el = disk.element
    target = call.child(el, "target")
    if target is None:
        raise NotFixable("the disk has no <target>")
    for tag in ("wwn", "vendor", "product"):
        if call.child(el, tag) is not None:
            raise NotFixable(f"the disk has <{tag}>, which a virtio disk cannot carry; move it by hand")
    old_bus, old_dev = target.get("bus") or disk.bus or "?", target.get("dev") or "?"
    new_dev = _free_vd_name(call, old_dev)
    call.doc.set_attr(target, "bus", "virtio")
    call.doc.set_attr(target, "dev", new_dev)
    for attr in ("removable", "rotation_rate", "tray"):
        if target.get(attr) is not None:
            call.doc.del_attr(target, attr)
    geometry = call.child(el, "geometry")
    if geometry is not None and geometry.get("trans") is not None:
        call.doc.del_attr(geometry, "trans")  # the CHS translation mode exists only on IDE
    address = call.child(el, "address")
    if address is not None and address.get("type") in ("drive", "usb", None):
        call.doc.remove(address)
    return (
        f"bus {old_bus} → virtio, {old_dev} → {new_dev}; the guest needs virtio-blk drivers and sees "
        f"/dev/{new_dev} instead of its old disk name"
    )


def _odirect(call: FixCall) -> str:
    disk = call.disk()
    return set_disk_driver(call, disk, **odirect_attrs(disk))


@xml_fixer("KVM-STO-002", "cache='none' io='native' instead of writethrough")
def cache_writethrough(call: FixCall) -> str:
    if call.finding.fix.kind == "manual":
        # the rule judged the device to refuse O_DIRECT: cache='none' would keep the guest from starting
        raise NotFixable("the block device likely refuses O_DIRECT (writethrough with io='threads'): cache='none' "
                         "would keep the guest from starting; test O_DIRECT first (see the finding)")
    return _odirect(call)


@xml_fixer("KVM-STO-003", "an explicit cache='none' io='native' instead of QEMU's default")
def cache_default(call: FixCall) -> str:
    disk = call.disk()
    if disk.shareable:
        # shared disks must not be cached on the host either; cache=none is the only safe explicit choice
        return set_disk_driver(call, disk, cache="none")
    return _odirect(call)


@xml_fixer("KVM-STO-004", "cache='none' io='native' instead of unsafe")
def cache_unsafe(call: FixCall) -> str:
    return _odirect(call)


@xml_fixer("KVM-STO-005", "cache='none' io='native' instead of writeback")
def cache_writeback(call: FixCall) -> str:
    return _odirect(call)


@xml_fixer("KVM-STO-006", "io='native' for an O_DIRECT disk")
def io_threads(call: FixCall) -> str:
    disk = call.disk()
    if (disk.cache or "default") == "default":
        # a shared disk is opened with O_DIRECT without a cache mode, but libvirt wants it written out for io=native
        return set_disk_driver(call, disk, cache="none", io="native")
    return set_disk_driver(call, disk, io="native")


@xml_fixer("KVM-STO-007", "cache='none' so that io='native' can open the disk")
def io_native_cached(call: FixCall) -> str:
    disk = call.disk()
    driver(call, disk)
    return set_disk_driver(call, disk, cache="none")


@xml_fixer("KVM-STO-009", "one IOThread per virtio disk that has none")
def disk_iothread(call: FixCall) -> str:
    disk = call.disk()
    root = call.root
    if call.child(root, "iothreadids") is not None:
        raise NotFixable("the domain lists <iothreadids>; assign driver iothread='N' by hand")
    drv = call.child(disk.element, "driver")
    if drv is not None and drv.get("iothread"):
        return f"driver iothread={drv.get('iothread')} (added with another disk)"
    # every virtio data disk without an IOThread gets one in this call: one <iothreads> edit per domain
    pending = []
    for d in call.guest.disks:
        if d.element is None or not d.is_data_disk or (d.bus or "") != "virtio" or d.iothread:
            continue
        if (d.source_type or "") in ("vhostuser", "vhostvdpa"):
            continue
        cur = call.child(d.element, "driver")
        if cur is not None and cur.get("iothread"):
            continue
        pending.append(d)
    if disk not in pending:
        pending.append(disk)
    el = call.child(root, "iothreads")
    have = 0
    if el is not None:
        try:
            have = int((el.text or "0").strip())
        except ValueError:
            raise NotFixable(f"<iothreads> holds {el.text!r}, not a number") from None
    cap = max(1, call.guest.vcpus or 1)
    add = min(len(pending), cap)
    total = have + add
    if el is not None:
        call.doc.set_text(el, str(total))
    else:
        insert_top_level(call, new("iothreads", str(total)), ("vcpu", "vcpus"))
    mine = ""
    for n, d in enumerate(pending):
        iothread = str(have + 1 + n % add)
        call.set_child_attrs(d.element, "driver", iothread=iothread)
        if d is disk:
            mine = iothread
    return f"<iothreads> {have} → {total}, driver iothread={mine}"


@xml_fixer("KVM-STO-010", "discard='unmap' so space the guest frees returns to the host")
def disk_discard(call: FixCall) -> str:
    disk = call.disk()
    return set_disk_driver(call, disk, discard="unmap")


@xml_fixer("KVM-STO-011", "queues=N (one per vCPU) on virtio disks of an old machine type")
def disk_queues(call: FixCall) -> str:
    vcpus = call.guest.vcpus or 1
    changed = []
    for d in call.guest.disks:
        if d.element is None or not d.is_data_disk:
            continue
        bus = (d.bus or "").lower()
        if bus == "scsi" and (d.scsi_controller_model or "").lower().startswith("virtio-scsi"):
            raise NotFixable(
                "virtio-scsi controller queues are not visible to the audit; set <driver queues='N'/> on the "
                "controller by hand, or move to a machine type >= 5.2"
            )
        if bus == "virtio" and (d.queues or 0) <= 1:
            call.set_child_attrs(d.element, "driver", queues=str(vcpus))
            changed.append(d.target)
    if not changed:
        raise NotFixable("no virtio disk to change")
    return f"driver queues={vcpus} on {', '.join(changed)}"


@xml_fixer("KVM-STO-012", "controller model='virtio-scsi' instead of an emulated HBA", bus_change=True)
def scsi_controller(call: FixCall) -> str:
    index, ctrl = _scsi_controller_of(call, call.disk())
    if ctrl is not None:
        old = ctrl.get("model") or "default (lsilogic)"
        if ctrl.get("model") != "virtio-scsi":
            call.doc.set_attr(ctrl, "model", "virtio-scsi")
        return f"SCSI controller {index}: {old} → virtio-scsi; the guest needs the virtio_scsi driver"
    call.doc.append(call.devices(), new("controller", type="scsi", index=index, model="virtio-scsi"))
    return f"add SCSI controller {index} model virtio-scsi (was libvirt's default, lsilogic)"


@xml_fixer("KVM-STO-014", "cache='none' instead of directsync (the guest's flushes decide durability)")
def cache_directsync(call: FixCall) -> str:
    return _odirect(call)


@xml_fixer("KVM-STO-015", "an IOThread for a virtio-scsi controller that has none")
def scsi_controller_iothread(call: FixCall) -> str:
    disk = call.disk()
    root = call.root
    if call.child(root, "iothreadids") is not None:
        raise NotFixable("the domain lists <iothreadids>; set the controller's driver iothread='N' by hand")
    index, ctrl = _scsi_controller_of(call, disk)
    if ctrl is None:
        raise NotFixable(f"SCSI controller {index} is not written in the definition")
    el = call.child(root, "iothreads")
    have = 0
    if el is not None:
        try:
            have = int((el.text or "0").strip())
        except ValueError:
            raise NotFixable(f"<iothreads> holds {el.text!r}, not a number") from None
    total = have + 1
    if el is not None:
        call.doc.set_text(el, str(total))
    else:
        insert_top_level(call, new("iothreads", str(total)), ("vcpu", "vcpus"))
    call.set_child_attrs(ctrl, "driver", iothread=str(total))
    return f"<iothreads> {have} → {total}, SCSI controller {index} driver iothread={total}"


@xml_fixer("KVM-STO-020", "detect_zeroes='unmap' on a disk that passes discards")
def detect_zeroes_unmap(call: FixCall) -> str:
    return set_disk_driver(call, call.disk(), detect_zeroes="unmap")


@xml_fixer("KVM-STO-021", "io='native' (or threads) instead of io_uring on an old host kernel")
def io_uring_to_native(call: FixCall) -> str:
    disk = call.disk()
    odirect = (disk.cache or "").lower() in ("none", "directsync") or (disk.shareable and not disk.cache)
    return set_disk_driver(call, disk, io="native" if odirect else "threads")


@xml_fixer("KVM-STO-022", "virtio-blk queues = vCPUs, queue_size >= 256")
def virtio_blk_queues(call: FixCall) -> str:
    disk = call.disk()
    attrs = {}
    vcpus = max(1, call.guest.vcpus or 1)
    if disk.queues is not None and disk.queues < vcpus:
        attrs["queues"] = str(vcpus)
    if disk.queue_size is not None and disk.queue_size < 256:
        attrs["queue_size"] = "256"
    if not attrs:
        raise NotFixable("queues and queue_size already suit the guest")
    return set_disk_driver(call, disk, **attrs)
