"""A KubeVirt VirtualMachine, VirtualMachineInstance or VirtualMachinePool -> :class:`Guest`, with KubeVirt's
defaults applied and each default said to be one.

Defaults (KubeVirt user guide and ``pkg/defaults``; /work/shared/reference/platforms_and_drift.md cites each):

- a disk (or CD-ROM, LUN) with no ``bus`` is SATA on amd64, unless the preference's ``preferredDiskBus`` says
  otherwise; an interface with no ``model`` is virtio-net unless ``preferredInterfaceModel`` says otherwise;
- no IOThreads unless ``ioThreadsPolicy`` (``shared``: one for every disk; ``auto``: a pool) or a disk's
  ``dedicatedIOThread`` asks for them;
- no block or network multiqueue unless ``blockMultiQueue`` / ``networkInterfaceMultiqueue``;
- disk ``cache`` ``none`` where the file system supports O_DIRECT; ``io`` ``native`` for block volumes and
  preallocated images, else ``threads`` (not known from a manifest: left unstated);
- CPU model ``host-model``; one socket, one core, one thread when no topology and no CPU limit is given;
  machine ``q35``; a virtio memory balloon unless ``autoattachMemBalloon: false``; a guest agent channel always.

Every value keeps its spec path as evidence (``spec.template.spec.domain.devices.disks[1].disk.bus``); a
default's evidence is the path where it would be written plus ``(not set: KubeVirt's default …)``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from kvmtune.kubevirt.load import KObject
from kvmtune.model.guest import Disk, Guest, Nic, Rng
from kvmtune.qemuopts import Cache

KUBEVIRT = "kubevirt"  # Guest.derived key: the Spec a guest was read from
DEFAULT_DISK_BUS = "sata"  # pkg/defaults/amd64.go
DEFAULT_NIC_MODEL = "virtio"
CONFIG_VOLUMES = frozenset({"cloudInitNoCloud", "cloudInitConfigDrive", "configMap", "secret", "serviceAccount",
                            "sysprep", "downwardAPI", "downwardMetrics"})
STORAGE_VOLUMES = frozenset({"persistentVolumeClaim", "dataVolume", "hostDisk"})
_QUANTITY = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)(?:[eE]([0-9]+))?\s*(Ki|Mi|Gi|Ti|Pi|Ei|k|K|M|G|T|P|E|m)?\s*")
MAX_EXPONENT = 30  # 10^30: more bytes or CPUs than any cluster has; beyond it Kubernetes refuses the quantity too
MAX_QUANTITY = 2.0**80  # a quantity kvmtune computes with (Kubernetes keeps at most 2^63 milli-units)
MAX_COUNT = 2**32 - 1  # KubeVirt's CPU topology fields and instancetype guest CPUs are uint32
_FACTOR = {None: 1, "m": 1e-3, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}


def quantity(value: Any) -> float | None:
    """A Kubernetes resource quantity (``2Gi``, ``500m``, ``1e3``, ``4``) as a finite number; ``None`` if it is none.

    A manifest is hostile: ``1e99999999999`` (10 to that power is a number Python would compute for ever), an integer
    of 400 digits or ``.inf`` (no float holds them) and ``.nan`` are no quantity (Kubernetes' own parser refuses
    them too: at most 2^63 of the smallest unit)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        try:
            number = float(value)
        except OverflowError:  # an int past float's range
            return None
        return number if math.isfinite(number) and abs(number) <= MAX_QUANTITY else None
    if not isinstance(value, str) or len(value) > 40:
        return None
    m = _QUANTITY.fullmatch(value)
    if not m:
        return None
    if m.group(2) and int(m.group(2)) > MAX_EXPONENT:
        return None
    number = float(m.group(1)) * (10 ** int(m.group(2)) if m.group(2) else 1) * _FACTOR[m.group(3)]
    return number if math.isfinite(number) and number <= MAX_QUANTITY else None


@dataclass
class Spec:
    """What the KubeVirt rules and the finding locator read besides the model: the object, the VMI spec's path
    in it, the instancetype and preference it resolved (or the names it could not), and effective settings."""

    obj: KObject
    base: str  # spec path of the VMI spec: spec.template.spec, spec, spec.virtualMachineTemplate.spec.template.spec
    vmi: dict[str, Any]
    instancetype: KObject | None = None
    preference: KObject | None = None
    unresolved: list[str] = field(default_factory=list)
    vcpus_stated: bool = False  # a topology, an instancetype or a CPU limit said how many vCPUs
    notes: list[str] = field(default_factory=list)

    def path(self, rel: str) -> str:
        return f"{self.base}.{rel}" if rel else self.base

    def get(self, rel: str) -> Any:
        cur: Any = self.vmi
        for part in rel.split("."):
            if not isinstance(cur, dict):
                return None
            cur = cur.get(part)
        return cur

    @property
    def domain(self) -> dict[str, Any]:
        d = self.vmi.get("domain")
        return d if isinstance(d, dict) else {}

    def pref(self, *keys: str) -> Any:
        """A value of the preference's spec (``devices``, ``preferredDiskBus``)."""
        cur: Any = self.preference.body.get("spec") if self.preference else None
        for k in keys:
            cur = cur.get(k) if isinstance(cur, dict) else None
        return cur

    def itype(self, *keys: str) -> Any:
        cur: Any = self.instancetype.body.get("spec") if self.instancetype else None
        for k in keys:
            cur = cur.get(k) if isinstance(cur, dict) else None
        return cur


def spec_of(guest: Guest) -> Spec | None:
    spec = guest.derived.get(KUBEVIRT)
    return spec if isinstance(spec, Spec) else None


def guest_name(obj: KObject) -> str:
    return f"kubevirt:{obj.namespace or 'default'}/{obj.name}"


def _vmi_spec(obj: KObject) -> tuple[str, dict[str, Any]]:
    spec = obj.body.get("spec")
    spec = spec if isinstance(spec, dict) else {}
    if obj.kind == "VirtualMachineInstance":
        return "spec", spec
    if obj.kind == "VirtualMachinePool":
        tpl = spec.get("virtualMachineTemplate")
        spec = tpl.get("spec") if isinstance(tpl, dict) else None
        spec = spec if isinstance(spec, dict) else {}
        base = "spec.virtualMachineTemplate.spec.template.spec"
    else:
        base = "spec.template.spec"
    tpl = spec.get("template")
    vmi = tpl.get("spec") if isinstance(tpl, dict) else None
    return base, vmi if isinstance(vmi, dict) else {}


def _matcher(obj: KObject, which: str) -> dict[str, Any] | None:
    """``spec.instancetype`` / ``spec.preference`` of a VM (a pool's VM template's)."""
    spec = obj.body.get("spec")
    if obj.kind == "VirtualMachinePool" and isinstance(spec, dict):
        tpl = spec.get("virtualMachineTemplate")
        spec = tpl.get("spec") if isinstance(tpl, dict) else None
    m = spec.get(which) if isinstance(spec, dict) else None
    return m if isinstance(m, dict) else None


def _resolve(obj: KObject, which: str, index: dict[tuple[str, str | None, str], KObject],
             spec: Spec) -> KObject | None:
    m = _matcher(obj, which)
    if m is None or not isinstance(m.get("name"), str):
        return None
    cluster = "VirtualMachineClusterInstancetype" if which == "instancetype" else "VirtualMachineClusterPreference"
    kind = m.get("kind") if isinstance(m.get("kind"), str) else cluster  # KubeVirt's default: the cluster-wide kind
    ns = None if kind == cluster else obj.namespace or "default"
    found = index.get((str(kind), ns, m["name"]))
    if found is None:
        spec.unresolved.append(f"{which} {kind} {(ns + '/') if ns else ''}{m['name']}")
    return found


def guest_from_object(obj: KObject, index: dict[tuple[str, str | None, str], KObject]) -> Guest:
    base, vmi = _vmi_spec(obj)
    spec = Spec(obj, base, vmi)
    spec.instancetype = _resolve(obj, "instancetype", index, spec)
    spec.preference = _resolve(obj, "preference", index, spec)
    guest = Guest(name=guest_name(obj), origin=obj.doc.path, origin_kind="kubevirt", virt_type="kvm",
                  arch="x86_64", machine="q35", agent_channel=True)
    guest.derived[KUBEVIRT] = spec
    uid = obj.body.get("metadata", {}).get("uid")
    guest.uuid = uid if isinstance(uid, str) else None
    _cpu(spec, guest)
    _memory(spec, guest)
    _disks(spec, guest)
    _nics(spec, guest)
    _devices(spec, guest)
    return guest


def _default(path: str, what: str) -> str:
    return f"{path} (not set: KubeVirt's default {what})"


def _cpu(spec: Spec, guest: Guest) -> None:
    cpu = spec.domain.get("cpu")
    cpu = cpu if isinstance(cpu, dict) else {}
    topo = [cpu.get(k) for k in ("sockets", "cores", "threads")]
    guest_cpus = spec.itype("cpu", "guest")
    limit = quantity(_resources(spec, "limits", "cpu"))
    if _count(guest_cpus):
        guest.vcpus, spec.vcpus_stated = guest_cpus, True
        guest.evidence["vcpus"] = f"instancetype {spec.instancetype.name if spec.instancetype else ''} spec.cpu.guest"
    elif any(_count(v) for v in topo):
        n = 1
        for v in topo:
            n *= v if _count(v) else 1
        guest.vcpus, spec.vcpus_stated = n, True
        guest.evidence["vcpus"] = spec.path("domain.cpu")
    elif limit is not None and limit > 0:
        guest.vcpus, spec.vcpus_stated = max(1, math.ceil(limit)), True
        guest.evidence["vcpus"] = spec.path("domain.resources.limits.cpu")
    elif (request := quantity(_resources(spec, "requests", "cpu"))) is not None and request > 0:
        guest.vcpus, spec.vcpus_stated = max(1, math.ceil(request)), True  # dedicated_cpu_resources.md: requests too
        guest.evidence["vcpus"] = spec.path("domain.resources.requests.cpu")
    elif any(ref.startswith("instancetype") for ref in spec.unresolved):
        guest.vcpus = None  # the instancetype says, and it was not given: never guessed
    else:
        guest.vcpus = 1
        guest.evidence["vcpus"] = _default(spec.path("domain.cpu"), "1 socket, 1 core, 1 thread")
    model = cpu.get("model")
    if model in (None, "host-model"):
        guest.cpu_mode = "host-model"
        guest.evidence["cpu_mode"] = (spec.path("domain.cpu.model") if model
                                      else _default(spec.path("domain.cpu.model"), "host-model"))
    elif model == "host-passthrough":
        guest.cpu_mode = "host-passthrough"
        guest.evidence["cpu_mode"] = spec.path("domain.cpu.model")
    elif isinstance(model, str):
        guest.cpu_mode, guest.cpu_model = "custom", model
        guest.evidence["cpu_mode"] = spec.path("domain.cpu.model")
    guest.vcpu_pinned = dedicated_cpus(spec)
    if guest.vcpu_pinned:
        guest.evidence["vcpu_pinned"] = spec.path("domain.cpu.dedicatedCpuPlacement")


def _count(value: Any) -> TypeGuard[int]:
    """A CPU count as KubeVirt's uint32 fields hold one (a 5,000-digit integer is none: it overflows every float
    a rule computes with, and Python will not print it)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_COUNT


def dedicated_cpus(spec: Spec) -> bool:
    return spec.get("domain.cpu.dedicatedCpuPlacement") is True or spec.itype("cpu", "dedicatedCPUPlacement") is True


def isolated_emulator(spec: Spec) -> bool:
    return spec.get("domain.cpu.isolateEmulatorThread") is True or spec.itype("cpu", "isolateEmulatorThread") is True


def windows_reason(spec: Spec) -> str | None:
    """Why this VM is taken for Windows: its preference's name, the OS label or annotation common templates write,
    or a sysprep volume (Windows only); ``None``: nothing says so."""
    if spec.preference is not None and spec.preference.name.lower().startswith("windows"):
        return f"preference {spec.preference.name}"
    m = spec.obj.body.get("spec")
    ref = m.get("preference") if isinstance(m, dict) else None
    if isinstance(ref, dict) and str(ref.get("name", "")).lower().startswith("windows"):
        return f"preference {ref['name']}"
    meta = spec.obj.body.get("metadata")
    for part in ("annotations", "labels"):
        values = meta.get(part) if isinstance(meta, dict) else None
        if not isinstance(values, dict):
            continue
        if str(values.get("vm.kubevirt.io/os", "")).lower().startswith("win"):
            return f"{part[:-1]} vm.kubevirt.io/os"
        for key in values:
            if str(key).startswith("os.template.kubevirt.io/win"):
                return f"{part[:-1]} {key}"
    vols = spec.vmi.get("volumes")
    if any(isinstance(v, dict) and "sysprep" in v for v in (vols if isinstance(vols, list) else [])):
        return "a sysprep volume"
    return None


def io_threads_policy(spec: Spec) -> str | None:
    value = spec.get("domain.ioThreadsPolicy")
    if value is None:
        value = spec.itype("ioThreadsPolicy")
    if value is None:
        value = spec.pref("preferredIoThreadsPolicy")  # not a documented preference field: read only if written
    return value if isinstance(value, str) else None


def resources(spec: Spec, which: str, what: str) -> Any:
    """``domain.resources.<which>.<what>`` as written (``requests``/``limits``, ``cpu``/``memory``)."""
    return _resources(spec, which, what)


def _resources(spec: Spec, which: str, what: str) -> Any:
    res = spec.domain.get("resources")
    part = res.get(which) if isinstance(res, dict) else None
    return part.get(what) if isinstance(part, dict) else None


def _memory(spec: Spec, guest: Guest) -> None:
    mem = spec.domain.get("memory")
    mem = mem if isinstance(mem, dict) else {}
    size = quantity(mem.get("guest"))
    where = spec.path("domain.memory.guest")
    if size is None:
        size = quantity(spec.itype("memory", "guest"))
        where = "instancetype spec.memory.guest"
    if size is None:
        size = quantity(_resources(spec, "requests", "memory"))
        where = spec.path("domain.resources.requests.memory")
    if size is not None:
        guest.memory_kib = int(size // 1024)
        guest.evidence["memory_kib"] = where
    pages = mem.get("hugepages")
    if not isinstance(pages, dict):
        pages = spec.itype("memory", "hugepages")
    if isinstance(pages, dict):
        guest.hugepages = True
        page = quantity(pages.get("pageSize"))
        guest.hugepage_sizes_kib = (int(page // 1024),) if page else ()
        guest.evidence["hugepages"] = spec.path("domain.memory.hugepages")
    devices = spec.domain.get("devices")
    balloon = devices.get("autoattachMemBalloon") if isinstance(devices, dict) else None
    guest.memballoon = "none" if balloon is False else "virtio"
    guest.evidence["memballoon"] = (spec.path("domain.devices.autoattachMemBalloon") if balloon is not None
                                    else _default(spec.path("domain.devices.autoattachMemBalloon"), "true"))


def _volumes(spec: Spec) -> dict[str, tuple[str, dict[str, Any]]]:
    out: dict[str, tuple[str, dict[str, Any]]] = {}
    vols = spec.vmi.get("volumes")
    for vol in vols if isinstance(vols, list) else []:
        if isinstance(vol, dict) and isinstance(vol.get("name"), str):
            kinds = [k for k in vol if k != "name"]
            kind = kinds[0] if kinds else "?"
            body = vol.get(kind)
            out[vol["name"]] = (kind, body if isinstance(body, dict) else {})
    return out


def _disks(spec: Spec, guest: Guest) -> None:
    devices = spec.domain.get("devices")
    devices = devices if isinstance(devices, dict) else {}
    disks = devices.get("disks")
    volumes = _volumes(spec)
    policy = io_threads_policy(spec)
    multiqueue = devices.get("blockMultiQueue") is True or spec.pref("devices", "preferredBlockMultiQueue") is True
    pref_bus = spec.pref("devices", "preferredDiskBus")
    shared_used = False
    dedicated = 0
    for i, d in enumerate(disks if isinstance(disks, list) else []):
        if not isinstance(d, dict):
            continue
        at = spec.path(f"domain.devices.disks[{i}]")
        kind = next((k for k in ("disk", "lun", "cdrom") if k in d), "disk")
        target = d.get(kind)
        target = target if isinstance(target, dict) else {}
        name = str(d.get("name", f"disk{i}"))
        disk = Disk(target=name, device=kind if kind != "cdrom" else "cdrom", locator=at)
        bus = target.get("bus")
        if isinstance(bus, str):
            disk.bus, disk.evidence["bus"] = bus, f"{at}.{kind}.bus"
        elif isinstance(pref_bus, str):
            disk.bus, disk.evidence["bus"] = pref_bus, f"{at}.{kind}.bus (not set: the preference's preferredDiskBus)"
        else:
            disk.bus, disk.evidence["bus"] = DEFAULT_DISK_BUS, _default(f"{at}.{kind}.bus", DEFAULT_DISK_BUS)
        vkind, vbody = volumes.get(name, ("?", {}))
        disk.readonly = vkind in CONFIG_VOLUMES or target.get("readonly") is True or kind == "cdrom"
        disk.source = (vbody.get("claimName") or vbody.get("name") or vbody.get("path") or vbody.get("image")
                       or (f"cloudinit:{name}" if vkind in CONFIG_VOLUMES else None))
        disk.source = str(disk.source) if disk.source is not None else None
        if vkind in ("persistentVolumeClaim", "dataVolume", "hostDisk"):
            disk.format = "raw"
            disk.evidence["format"] = f"{at} (a {vkind} volume: a raw disk.img or a block device)"
        if name not in volumes:
            spec.notes.append(f"{guest.name} disk:{name}: no volume of that name ({at})")
        cache = d.get("cache")
        if isinstance(cache, str):
            disk.cache = disk.take("cache", Cache, cache)
            disk.evidence["cache"] = f"{at}.cache"
        elif kind != "cdrom":
            disk.cache = Cache.NONE
            disk.evidence["cache"] = _default(f"{at}.cache", "none where the file system supports O_DIRECT")
        if disk.bus == "virtio" and kind != "cdrom":
            pref_dedicated = spec.pref("devices", "preferredDiskDedicatedIoThread") is True
            if d.get("dedicatedIOThread") is True or (pref_dedicated and "dedicatedIOThread" not in d):
                dedicated += 1
                disk.iothread = f"dedicated-{dedicated}"
                disk.evidence["iothread"] = (f"{at}.dedicatedIOThread" if "dedicatedIOThread" in d else
                                             f"{at}.dedicatedIOThread (not set: the preference's "
                                             "preferredDiskDedicatedIoThread)")
            elif policy in ("shared", "auto", "supplementalPool"):
                disk.iothread = "1" if policy == "shared" else "pool"
                shared_used = True
                disk.evidence["iothread"] = spec.path("domain.ioThreadsPolicy")
            else:
                disk.evidence["iothread"] = _default(spec.path("domain.ioThreadsPolicy"), "none: no IOThreads")
            if multiqueue:
                disk.queues = guest.vcpus
                disk.evidence["queues"] = spec.path("domain.devices.blockMultiQueue")
            else:
                disk.evidence["queues"] = _default(spec.path("domain.devices.blockMultiQueue"), "false: one queue")
        guest.disks.append(disk)
    guest.iothreads = dedicated + (1 if shared_used else 0)
    guest.evidence["iothreads"] = spec.path("domain.ioThreadsPolicy")


def _nics(spec: Spec, guest: Guest) -> None:
    devices = spec.domain.get("devices")
    devices = devices if isinstance(devices, dict) else {}
    nics = devices.get("interfaces")
    multiqueue = (devices.get("networkInterfaceMultiqueue") is True
                  or spec.pref("devices", "preferredNetworkInterfaceMultiQueue") is True)
    pref_model = spec.pref("devices", "preferredInterfaceModel")
    for i, n in enumerate(nics if isinstance(nics, list) else []):
        if not isinstance(n, dict):
            continue
        at = spec.path(f"domain.devices.interfaces[{i}]")
        nic = Nic(index=i, locator=at, target_dev=str(n.get("name", i)))
        model = n.get("model")
        if isinstance(model, str):
            nic.model, nic.evidence["model"] = model, f"{at}.model"
        elif isinstance(pref_model, str):
            nic.model, nic.evidence["model"] = pref_model, f"{at}.model (not set: the preference's preferredInterfaceModel)"
        else:
            nic.model, nic.evidence["model"] = DEFAULT_NIC_MODEL, _default(f"{at}.model", "virtio")
        if "sriov" in n:
            nic.type = "hostdev"
        elif not any(k in n for k in ("slirp", "passt", "vhostuser", "binding")):
            nic.type = "ethernet"  # bridge and masquerade: a tap in the pod that libvirt is given as type='ethernet'
            nic.evidence["type"] = at
        nic.vhost = True  # virt-launcher uses vhost-net where /dev/vhost-net is there (it is on every KubeVirt node)
        if nic.model in ("virtio", "virtio-net") and multiqueue and (guest.vcpus or 1) > 1:
            nic.queues = guest.vcpus
            nic.evidence["queues"] = spec.path("domain.devices.networkInterfaceMultiqueue")
        else:
            nic.evidence["queues"] = _default(spec.path("domain.devices.networkInterfaceMultiqueue"), "false: one queue")
        guest.nics.append(nic)


def _devices(spec: Spec, guest: Guest) -> None:
    devices = spec.domain.get("devices")
    if isinstance(devices, dict) and isinstance(devices.get("rng"), dict):
        guest.rngs.append(Rng(model="virtio", backend_model="random", backend_source="/dev/urandom",
                              locator=spec.path("domain.devices.rng")))


def vm_of(obj: KObject, index: dict[tuple[str, str | None, str], KObject]) -> KObject | None:
    """The VirtualMachine among ``index`` that controls the VMI ``obj`` (its controller ownerReference), or None."""
    if obj.kind != "VirtualMachineInstance":
        return None
    meta = obj.body.get("metadata")
    refs = meta.get("ownerReferences") if isinstance(meta, dict) else None
    for ref in refs if isinstance(refs, list) else []:
        # a VM's VMI bears the VM's name: an ownerReference naming another VM is not taken for it
        if (isinstance(ref, dict) and ref.get("kind") == "VirtualMachine" and ref.get("controller") is True
                and ref.get("name") == obj.name):
            return index.get(("VirtualMachine", obj.namespace or "default", obj.name))
    return None


def guests_from_objects(objects: list[KObject]) -> tuple[list[Guest], list[str]]:
    """Every VM, VMI and pool among ``objects`` as a guest, references resolved among ``objects``; notes name
    what could not be resolved."""
    index = {o.key: o for o in objects}
    guests: list[Guest] = []
    notes: list[str] = []
    for obj in objects:
        if obj.kind not in ("VirtualMachine", "VirtualMachineInstance", "VirtualMachinePool"):
            continue
        owner = vm_of(obj, index)
        if owner is not None:  # a VM's running instance: the VM's template is the spec its operator owns
            notes.append(f"{guest_name(obj)}: the VirtualMachineInstance of VirtualMachine {owner.name}; audited as "
                         "the VM's spec")
            continue
        guest = guest_from_object(obj, index)
        spec = spec_of(guest)
        assert spec is not None
        for ref in spec.unresolved:
            notes.append(f"{guest.name} ({obj.where('spec')}): {ref} is not among the given objects; what it sets "
                         "is not stated")
        if not obj.namespace:
            notes.append(f"{guest.name}: no metadata.namespace; named in 'default' (kubectl -n may place it elsewhere)")
        notes.extend(spec.notes)
        guests.append(guest)
    return guests, notes
