"""Fixes for the network rules (KVM-NET-*)."""

from __future__ import annotations

from kvmtune.fix.registry import FixCall, NotFixable, xml_fixer

MAX_TAP_QUEUES = 256


@xml_fixer("KVM-NET-001", "virtio-net instead of an emulated NIC", bus_change=True)
def nic_model(call: FixCall) -> str:
    nic = call.nic()
    old = nic.model or "unset"
    call.set_child_attrs(nic.element, "model", type="virtio")
    return f"model {old} → virtio; the guest needs the virtio-net driver (Windows: netkvm)"


@xml_fixer("KVM-NET-002", "let libvirt use vhost-net (drop driver name='qemu')")
def vhost(call: FixCall) -> str:
    nic = call.nic()
    drv = call.child(nic.element, "driver")
    if drv is None or (drv.get("name") or "").lower() != "qemu":
        raise NotFixable("vhost is off on the QEMU command line, not in the domain XML")
    if len(drv.attrib) == 1 and not len(drv):
        call.doc.remove(drv)
    else:
        call.doc.del_attr(drv, "name")
    return "driver name qemu → unset (vhost-net when /dev/vhost-net is there)"


@xml_fixer("KVM-NET-005", "macvtap mode='bridge' instead of vepa")
def macvtap_bridge(call: FixCall) -> str:
    nic = call.nic()
    source = call.child(nic.element, "source")
    if source is None:
        raise NotFixable("the interface has no <source>")
    old = source.get("mode") or "unset (vepa)"
    call.doc.set_attr(source, "mode", "bridge")
    return f"source mode {old} → bridge"


@xml_fixer("KVM-NET-008", "virtio-net queues = vCPUs")
def nic_queues(call: FixCall) -> str:
    nic = call.nic()
    want = min(max(1, call.guest.vcpus or 1), MAX_TAP_QUEUES)
    old = nic.queues
    call.set_child_attrs(nic.element, "driver", queues=str(want))
    return f"driver queues {old or 'unset (1)'} → {want}"


@xml_fixer("KVM-NET-021", "virtio-net rx_queue_size='1024' (vhost-user: tx_queue_size too)")
def nic_ring_size(call: FixCall) -> str:
    nic = call.nic()
    attrs = {"rx_queue_size": "1024"}
    if nic.type == "vhostuser":
        attrs["tx_queue_size"] = "1024"
    call.set_child_attrs(nic.element, "driver", **attrs)
    return ", ".join(f"driver {k} → {v}" for k, v in attrs.items())
