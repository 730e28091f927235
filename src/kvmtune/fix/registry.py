"""Fixers, attached to rules by id; rules stay pure checks.

A fixer is a function decorated with :func:`xml_fixer`. It gets the finding, the
guest it was found on and the :class:`~kvmtune.fix.xmldoc.XmlDoc` of the guest's
definition, edits the document through the ``XmlDoc`` (never the file) and
returns one line saying what it changed. It raises :class:`NotFixable` when this
instance cannot be fixed automatically (the plan then says why).

The finding says where to edit: its ``evidence`` is an XPath into the domain XML
(``/domain/devices/disk[2]/driver/@cache``) whose device part matches the
``locator`` of a :class:`~kvmtune.model.guest.Disk` or ``Nic``.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache

from lxml import etree

from kvmtune.audit.finding import Finding, Waiver
from kvmtune.fix.effect import TakesEffect
from kvmtune.fix.effect import libvirt as libvirt_effect
from kvmtune.fix.live import LivePath
from kvmtune.fix.xmldoc import XmlDoc
from kvmtune.host.root import HostRoot
from kvmtune.model.guest import Disk, Guest, Nic


class NotFixable(Exception):
    """This finding cannot be fixed automatically here; ``str()`` says why (one line)."""


@dataclass
class FixOptions:
    allow_bus_change: bool = False  # guest-visible device changes (bus, NIC model, controller)
    allow_cpu_change: bool = False  # changes to the guest's CPUs (model, count, accelerator)
    # guests read from files run on the host --root describes (audit's --assume-this-host): without it the
    # host-relative rules (vCPUs against this host's CPUs) stay silent, in fix as in audit
    assume_this_host: bool = False
    # rule ids the user named (fix --only): a finding from a guessed guest identity (extra['guessed'],
    # e.g. Windows only by the name) is fixed only for these
    named_rules: frozenset[str] = frozenset()
    host: HostRoot = field(default_factory=HostRoot)
    # the settings file's waivers (a guest's <metadata> ones are read with it): a waived finding is left
    # alone unless its rule is named; use_waivers False (fix --no-waivers) applies none
    waivers: tuple[Waiver, ...] = ()
    use_waivers: bool = True
    # Proxmox VE drive volumes on a host path or device (/dev/sdb) the operator named (fix --pve-volume): only
    # these such drives are changed
    pve_volumes: frozenset[str] = frozenset()
    # fix --live: a running libvirt domain also gets the changes libvirt makes live (fix/live.py), as one more change
    live: bool = False


_LOCATOR_CACHE: list[tuple[list[Disk] | list[Nic], dict[str, Disk | Nic]]] = []


def _locator_index(items: list[Disk] | list[Nic]) -> dict[str, Disk | Nic]:
    """Locator → device, built once per device list (a scan per finding made fix quadratic in disks)."""
    for cached, known in _LOCATOR_CACHE:
        if cached is items:
            return known
    index: dict[str, Disk | Nic] = {}
    for item in items:
        if item.locator:
            index.setdefault(item.locator, item)
    _LOCATOR_CACHE.insert(0, (items, index))
    del _LOCATOR_CACHE[4:]
    return index


@dataclass
class FixCall:
    finding: Finding
    guest: Guest
    doc: XmlDoc
    options: FixOptions

    @property
    def root(self) -> etree._Element:
        return self.doc.tree.getroot()

    def _device(self, items: list[Disk] | list[Nic]) -> Disk | Nic:
        ev = self.finding.evidence
        by_locator = _locator_index(items)
        # the evidence is the device's locator or a path below it: try the locator and each parent path
        parts = ev.split("/")
        for n in range(1, len(parts) + 1):
            item = by_locator.get("/".join(parts[:n]))
            if item is not None:
                return item
        for item in items:
            if item.label == self.finding.target.device:
                return item
        raise NotFixable(f"cannot find {self.finding.target.device or 'the device'} in the definition")

    def disk(self) -> Disk:
        d = self._device(self.guest.disks)
        assert isinstance(d, Disk)
        if d.element is None:
            raise NotFixable("the disk was not read from domain XML")
        return d

    def nic(self) -> Nic:
        n = self._device(self.guest.nics)
        assert isinstance(n, Nic)
        if n.element is None:
            raise NotFixable("the interface was not read from domain XML")
        return n

    def child(self, parent: etree._Element, tag: str) -> etree._Element | None:
        for c in parent:
            if c.tag == tag:
                return c
        return None

    def set_child_attrs(self, parent: etree._Element, tag: str, **attrs: str) -> etree._Element:
        """Set attributes on ``parent``'s first ``<tag>``, adding the child if it is absent."""
        el = self.child(parent, tag)
        if el is None:
            new = etree.Element(tag)
            for k, v in attrs.items():
                new.set(k, v)
            return self.doc.append(parent, new)
        for k, v in attrs.items():
            if el.get(k) != v:
                self.doc.set_attr(el, k, v)
        return el

    def devices(self) -> etree._Element:
        el = self.child(self.root, "devices")
        if el is None:
            raise NotFixable("the domain has no <devices>")
        return el


FixFunc = Callable[[FixCall], str]


@dataclass(frozen=True)
class XmlFixer:
    rule: str
    func: FixFunc
    summary: str
    bus_change: bool = False  # guest-visible device change: needs --allow-bus-change
    cpu_change: bool = False  # a change to the guest's CPUs: needs --allow-cpu-change
    live: LivePath | None = None  # how libvirt makes this change on a running domain too (fix --live), if it can

    def takes_effect(self, *, origin: str, active: bool, live: bool = False) -> TakesEffect:
        """When this fixer's change applies: a domain file's to domains defined from it, a stopped domain's at
        once, a running domain's at its next start, unless ``live`` (``fix --live`` set it on the running domain
        through the fixer's :class:`~kvmtune.fix.live.LivePath`). Only a fixer with a live path can be live: the
        others' attributes are not ones libvirt changes on a running domain (fix/live.py says which and why)."""
        return libvirt_effect(origin=origin, active=active, live=live and self.live is not None)


FIXERS: dict[str, XmlFixer] = {}


def xml_fixer(rule: str, summary: str, *, bus_change: bool = False, cpu_change: bool = False,
              live: LivePath | None = None) -> Callable[[FixFunc], FixFunc]:
    def register(func: FixFunc) -> FixFunc:
        if rule in FIXERS:
            raise RuntimeError(f"two fixers for {rule}")
        FIXERS[rule] = XmlFixer(rule, func, summary, bus_change, cpu_change, live)
        return func

    return register


@cache
def all_fixers() -> dict[str, XmlFixer]:
    """Import every module under ``kvmtune.fix.fixers`` and return the registry."""
    import kvmtune.fix.fixers as pkg

    for info in pkgutil.walk_packages(pkg.__path__, prefix="kvmtune.fix.fixers."):
        importlib.import_module(info.name)
    return dict(FIXERS)
