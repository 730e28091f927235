"""The read-write libvirt calls fix and undo need: the persistent definition (with secrets,
so redefining it loses nothing), ``defineXML``, a running domain's live XML (``fix --status``, ``fix --live``), and
the one live change ``fix --live`` makes (:mod:`kvmtune.fix.live`): a running domain's balloon statistics period,
``virDomainSetMemoryStatsPeriod`` with ``VIR_DOMAIN_AFFECT_LIVE`` only (the definition is changed by ``defineXML``)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from kvmtune.domain.connection import _first_line, _libvirt, open_connection
from kvmtune.errors import InputError, KvmtuneError


class LibvirtError(KvmtuneError):
    """libvirt refused an operation; one line."""


def open_rw(uri: str) -> Any:
    return open_connection(uri, read_only=False)


def inactive_xml(dom: Any) -> str:
    """The persistent definition (what the next start uses), secrets included."""
    libvirt = _libvirt()
    flags = libvirt.VIR_DOMAIN_XML_INACTIVE | libvirt.VIR_DOMAIN_XML_SECURE
    try:
        return str(dom.XMLDesc(flags))
    except libvirt.libvirtError as exc:
        raise LibvirtError(f"{dom.name()}: cannot read its definition: {_first_line(exc)}") from None


def live_xml(dom: Any) -> str:
    """A running domain's live definition (what it runs with now)."""
    libvirt = _libvirt()
    try:
        return str(dom.XMLDesc(0))
    except libvirt.libvirtError as exc:
        raise LibvirtError(f"{dom.name()}: cannot read its live definition: {_first_line(exc)}") from None


def set_memory_stats_period(dom: Any, period: int) -> None:
    """The running domain's balloon statistics period (``virsh dommemstat --period N --live``); its persistent
    definition is left as it is."""
    libvirt = _libvirt()
    try:
        dom.setMemoryStatsPeriod(period, libvirt.VIR_DOMAIN_AFFECT_LIVE)
    except libvirt.libvirtError as exc:
        raise LibvirtError(f"{dom.name()}: cannot set its balloon statistics period live: {_first_line(exc)}") from None


def run_id(dom: Any) -> int:
    """Which run of a running domain this is (``virDomainGetID``: a new id at each start); -1 when it is stopped."""
    libvirt = _libvirt()
    try:
        return int(dom.ID())
    except libvirt.libvirtError as exc:
        raise LibvirtError(f"{dom.name()}: cannot read its id: {_first_line(exc)}") from None


def lookup_name(conn: Any, name: str, uri: str) -> Any:
    libvirt = _libvirt()
    try:
        return conn.lookupByName(name)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            raise InputError(uri, f"no domain named {name!r}") from None
        raise InputError(uri, f"{name}: {_first_line(exc)}") from None


def lookup_uuid(conn: Any, uuid: str, uri: str) -> Any:
    libvirt = _libvirt()
    try:
        return conn.lookupByUUIDString(uuid)
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            raise LibvirtError(f"{uri}: no domain with UUID {uuid} any more") from None
        raise LibvirtError(f"{uri}: {uuid}: {_first_line(exc)}") from None


def all_domains(conn: Any, uri: str) -> list[Any]:
    libvirt = _libvirt()
    try:
        return list(conn.listAllDomains(0))
    except libvirt.libvirtError as exc:
        raise InputError(uri, f"cannot list domains: {_first_line(exc)}") from None


def define(conn: Any, xml: str, what: str) -> Any:
    """``defineXML`` with schema validation; only the persistent definition changes."""
    libvirt = _libvirt()
    try:
        flags = getattr(libvirt, "VIR_DOMAIN_DEFINE_VALIDATE", 0)
        return conn.defineXMLFlags(xml, flags)
    except libvirt.libvirtError as exc:
        raise LibvirtError(f"{what}: libvirt rejected the new definition: {_first_line(exc)}") from None


@dataclass
class Connections:
    """Read-write libvirt connections opened on first use, one per URI, closed together."""

    _conns: dict[str, Any] = field(default_factory=dict, kw_only=True, repr=False)

    def libvirt(self, uri: str) -> Any:
        if uri not in self._conns:
            self._conns[uri] = open_rw(uri)
        return self._conns[uri]

    def close(self) -> None:
        for conn in self._conns.values():
            with contextlib.suppress(Exception):
                conn.close()
        self._conns.clear()
