"""One guest as the auditor sees it, whichever way it was read.

A libvirt domain XML and a QEMU command line both become a :class:`Guest`,
so one rule checks both. Every value keeps where it came from
(``evidence``): an XPath into the domain XML or the command-line option.
``None`` means "not set", i.e. the hypervisor's default applies.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvmtune.model.inside import GuestInside
from kvmtune.model.values import placeholders
from kvmtune.qemuopts import Aio, Cache, DetectZeroes, Discard, E, enum_value, unknown_line


def _where(evidence: dict[str, str], below: Mapping[str, str], locator: str, attr: str) -> str:
    """What a device's ``attr`` was read from: its own evidence, else its locator (plus the path below it)."""
    found = evidence.get(attr)
    if found is not None:
        return found
    suffix = below.get(attr)
    return locator if suffix is None else locator + suffix


# the names cloud-init seeds and configuration drives go by (NoCloud's volume label cidata, OpenStack's
# disk.config and config-2, Proxmox VE's vm-N-cloudinit, an ISO): small read-only volumes, not data disks
_CONFIG_VOLUME = re.compile(r"cidata|cloud-?init|config-?drive|config-2|disk\.config|nocloud|seed|\.iso$", re.I)


@dataclass(slots=True)
class Disk:
    target: str  # vda, hdc, or the QEMU drive/node id
    device: str = "disk"  # disk | cdrom | floppy | lun | firmware (pflash code/variable store: not a data disk)
    bus: str | None = None  # virtio | scsi | ide | sata | fdc | usb | sd | nvme | xen
    scsi_controller_model: str | None = None  # for bus=scsi: virtio-scsi, lsilogic, …
    scsi_controller_iothread: str | None = None  # for bus=scsi: the IOThread of its controller, if any
    scsi_controller: str | None = None  # for bus=scsi: the controller's index (XML) or id (command line)
    # enumerations (kvmtune.qemuopts): a value QEMU does not know is None here, its note in ``refused``
    cache: Cache | None = None  # none | writethrough | writeback | directsync | unsafe | default
    io: Aio | None = None  # native | threads | io_uring | default
    format: str | None = None  # raw | qcow2 | …
    discard: Discard | None = None  # unmap | ignore | default
    detect_zeroes: DetectZeroes | None = None  # off | on | unmap | default
    iothread: str | None = None
    queues: int | None = None
    queue_size: int | None = None  # virtio-blk descriptors per queue (libvirt queue_size, QEMU queue-size)
    source_type: str | None = None  # file | block | network | volume | nvme | vhostuser | dir
    source: str | None = None  # path, device or URL
    protocol: str | None = None  # QEMU's protocol driver: file | host_device | rbd | iscsi | nbd | …
    filters: list[str] = field(default_factory=list)  # filter nodes between the device and the image
    readonly: bool = False
    shareable: bool = False
    locator: str = ""  # where this disk is described (XPath or command-line option)
    evidence: dict[str, str] = field(default_factory=dict)
    # attribute → why its value was not taken ("io mode 'x' is not one QEMU knows"): never judged, never passed on
    refused: dict[str, str] = field(default_factory=dict)
    # XML: where each attribute sits below ``locator`` (one mapping shared by every disk, joined on demand)
    evidence_below: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)
    element: Any = None  # the lxml <disk> element when read from XML

    def where(self, attr: str) -> str:
        return _where(self.evidence, self.evidence_below, self.locator, attr)

    def take(self, attr: str, kind: type[E], raw: str | None) -> E | None:
        """``raw`` as a member of the enumeration ``kind``; a value QEMU does not know is noted in
        :attr:`refused` and becomes ``None``."""
        if raw is None:
            return None
        value = enum_value(kind, raw)
        if value is None:
            self.refused[attr] = unknown_line(kind, raw)
        return value

    @property
    def label(self) -> str:
        return f"disk:{self.target}"

    @property
    def is_data_disk(self) -> bool:
        """A disk or LUN the guest keeps data on: not a CD-ROM, floppy or firmware, nor a read-only
        configuration volume (:attr:`is_config_volume`)."""
        return self.device in ("disk", "lun") and not self.is_config_volume

    @property
    def is_config_volume(self) -> bool:
        """A read-only ``device='disk'`` that carries configuration, not data: a cloud-init seed (``cidata``),
        a configuration drive, an ISO image, or a read-only disk with no medium (a CD-ROM in all but name)."""
        if not self.readonly or self.device != "disk":
            return False
        if not self.source:
            return True
        return _CONFIG_VOLUME.search(self.source.rsplit("/", 1)[-1]) is not None


@dataclass(slots=True)
class Nic:
    index: int
    type: str | None = None  # user | network | bridge | direct | ethernet | vhostuser | …
    model: str | None = None  # virtio | e1000 | e1000e | rtl8139 | …
    source: str | None = None  # network name, bridge name, or lower device
    source_mode: str | None = None  # macvtap: vepa | bridge | private | passthrough
    virtualport: str | None = None  # openvswitch | 802.1Qbh | …
    driver_name: str | None = None  # vhost | qemu (XML); None = default
    vhost: bool | None = None  # effective, when a command line tells it
    queues: int | None = None
    rx_queue_size: int | None = None  # virtio-net ring sizes; None: QEMU's default (256)
    tx_queue_size: int | None = None
    mac: str | None = None
    mtu: int | None = None
    target_dev: str | None = None
    backend: str | None = None  # user-mode backend: passt; None = QEMU's own (SLIRP for type user)
    teaming: str | None = None  # failover pair member (persistent | transient): shares its MAC by design
    locator: str = ""
    evidence: dict[str, str] = field(default_factory=dict)
    evidence_below: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)  # as Disk's
    element: Any = None

    def where(self, attr: str) -> str:
        return _where(self.evidence, self.evidence_below, self.locator, attr)

    @property
    def label(self) -> str:
        return f"net:{self.target_dev or self.mac or self.index}"


@dataclass(slots=True)
class Rng:
    model: str | None
    backend_model: str | None  # random | builtin | egd
    backend_source: str | None  # /dev/random, /dev/urandom
    locator: str = ""
    index: int = 0  # its position among the guest's RNG devices (0-based)


@dataclass(slots=True)
class Guest:
    name: str
    origin: str  # the file, URI or process this guest was read from
    origin_kind: str  # xml | libvirt | cmdline
    uuid: str | None = None
    # True only where the guest is known to run on the audited host (local libvirt, a running
    # process, --assume-this-host): host-relative checks and disk image probing need it
    on_audited_host: bool = False
    virt_type: str | None = None  # kvm | qemu (TCG) | …
    arch: str | None = None
    machine: str | None = None
    vcpus: int | None = None
    memory_kib: int | None = None
    # <currentMemory>: what the balloon leaves the guest at boot; None = not stated (all of memory_kib)
    current_memory_kib: int | None = None
    device_memory_kib: int = 0  # nvdimm / virtio-pmem: memory the guest sees as a device, not in memory_kib
    cpu_mode: str | None = None  # host-passthrough | host-model | custom | maximum
    cpu_model: str | None = None
    vcpu_pinned: bool = False
    numatune: bool = False
    nosharepages: bool = False
    hugepages: bool = False
    # <hugepages><page size=…>: the page sizes named (KiB); empty = the host's default size
    hugepage_sizes_kib: tuple[int, ...] = ()
    # <clock offset>: utc | localtime | timezone | variable (-rtc base=); None = not stated (UTC)
    clock_offset: str | None = None
    # <metadata><libosinfo:os id=…>: the OS the management tool installed (http://debian.org/debian/12)
    libosinfo_id: str | None = None
    memballoon: str | None = None  # virtio | none | … ; None = not stated
    balloon_autodeflate: bool = False
    balloon_free_page_reporting: bool = False
    # <memballoon><stats period='N'/>: seconds between the guest's memory statistics; None = not stated (QEMU polls
    # none), 0 = off
    balloon_stats_period: int | None = None
    iothreads: int = 0
    hostdevs: int = 0  # PCI/mdev devices passed through with VFIO (they pin guest memory), type='hostdev' NICs too
    memory_locked: bool = False  # <memoryBacking><locked/> or -overcommit mem-lock=on
    active: bool | None = None
    # uid, gid of the running QEMU process (its images are read with these privileges); None: not a process
    process_owner: tuple[int, int] | None = None
    images_here: bool = True  # False: read from a captured tree, its image paths name another machine's files
    disks: list[Disk] = field(default_factory=list)
    nics: list[Nic] = field(default_factory=list)
    rngs: list[Rng] = field(default_factory=list)
    # a virtio-serial channel named org.qemu.guest_agent.0 (libvirt <channel>, or a QEMU virtserialport)
    agent_channel: bool = False
    agent_socket: str | None = None  # the host side of that channel, when a command line names its socket
    inside: GuestInside | None = None  # what the guest agent answered; None: not asked or no answer
    # the placeholders of a template ({path}, %(name)s, {{ x }}, ${X}) found in its definition; () for a real guest
    template: tuple[str, ...] = ()
    # parts of the definition that could not be read (a -readconfig file): what they may hold is not stated,
    # so no rule judges an absence ("no RNG device") on this guest
    unread: tuple[str, ...] = ()
    evidence: dict[str, str] = field(default_factory=dict)
    # waivers the definition carries (<metadata><kvmtune:waiver rule= reason= …/>): attributes as written,
    # checked by audit/waivers.py
    waivers: tuple[dict[str, str], ...] = ()
    tree: Any = None  # the lxml document when read from XML
    # views derived from this guest once and shared by the rules that need them (e.g. its CPU layout);
    # a guest read again after an edit is a new object with an empty cache
    derived: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def where(self, attr: str) -> str:
        return self.evidence.get(attr, "")

    @property
    def notes(self) -> list[str]:
        """What the readers refused in this guest's definition, one line each (the audit shows them)."""
        return [f"{self.name}: {disk.label}: {line} ({disk.where(attr)}); not judged, never passed on"
                for disk in self.disks for attr, line in disk.refused.items()]

    def rng_label(self, rng: Rng) -> str:
        """``rng`` for a guest's only RNG device; ``rng:1``, ``rng:2``, … when it has several."""
        return "rng" if len(self.rngs) <= 1 else f"rng:{rng.index + 1}"

    def forget_placeholders(self) -> None:
        """A template's placeholder values are no path, address or name: they become "not stated"."""
        if placeholders(self.uuid):
            self.uuid = None
        for disk in self.disks:
            if placeholders(disk.source):
                disk.source = None
        for nic in self.nics:
            nic.source = None if placeholders(nic.source) else nic.source
            nic.mac = None if placeholders(nic.mac) else nic.mac
            nic.target_dev = None if placeholders(nic.target_dev) else nic.target_dev
        for rng in self.rngs:
            if placeholders(rng.backend_source):
                rng.backend_source = None

    def release_xml(self) -> None:
        """Drop the lxml document and elements: the audit reads only the model (fixes re-read the XML)."""
        self.tree = None
        self.derived.pop("xml_top", None)  # domain.xml.top_elements: elements of that document
        for disk in self.disks:
            disk.element = None
        for nic in self.nics:
            nic.element = None

    @property
    def identity(self) -> tuple[str, ...]:
        """Who this guest is: its UUID when known, else where it was read from plus its name.

        Two VMs called ``web`` from two files are two guests; one VM seen through its domain
        XML and its running process (libvirt passes ``-uuid``) is one.
        """
        if self.uuid:
            return ("uuid", self.uuid.strip().lower())
        source = self.origin.split("#", 1)[0] if self.origin_kind == "libvirt" else self.origin
        return ("source", self.origin_kind, source, self.name)

    @property
    def is_kvm_or_qemu(self) -> bool:
        """kvmtune audits KVM guests and QEMU's TCG guests; LXC, Xen, bhyve, ... are other hypervisors."""
        return (self.virt_type or "qemu").strip().lower() in ("kvm", "qemu")

    @property
    def is_x86(self) -> bool:
        return self.arch in (None, "x86_64", "i686")
