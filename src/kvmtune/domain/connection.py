"""Reading domains from a libvirt connection (any URI, read-only)."""

from __future__ import annotations

from typing import Any

from kvmtune.domain.cputune import cpu_layout
from kvmtune.domain.windows import windows_hint
from kvmtune.domain.xml import guest_from_tree, parse_xml_bytes
from kvmtune.errors import InputError, KvmtuneError
from kvmtune.model.guest import Guest


class BindingMissing(KvmtuneError):
    """libvirt's Python binding is not importable: an audit of this host goes on without libvirt (host, QEMU
    processes, Proxmox VE configs), with one note naming the binding; a named ``--connect`` fails on it."""


BINDING_HINT = ("libvirt's Python binding (libvirt-python) is not installed in this Python: Debian's python3-libvirt, "
                "reached from a virtualenv made with --system-site-packages (pipx install --system-site-packages), "
                "or built into it: pipx inject kvmtune libvirt-python (needs pkg-config, gcc, python3-dev and libvirt-dev)")


def _libvirt() -> Any:
    try:
        import libvirt
    except ImportError:
        raise BindingMissing(BINDING_HINT) from None
    # libvirt prints every error to stderr by default; we report them ourselves
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    return libvirt


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else exc.__class__.__name__


def open_connection(uri: str, *, read_only: bool = True) -> Any:
    """A libvirt connection, or one :class:`InputError` line saying why there is none."""
    libvirt = _libvirt()
    what = "cannot connect to libvirt" + ("" if read_only else " read-write")
    try:
        conn = libvirt.openReadOnly(uri) if read_only else libvirt.open(uri)
    except libvirt.libvirtError as exc:
        raise InputError(uri, f"{what}: {_first_line(exc)}") from None
    if conn is None:
        raise InputError(uri, what)
    return conn


def open_readonly(uri: str) -> Any:
    return open_connection(uri, read_only=True)


def read_domains(uri: str) -> tuple[list[Guest], list[str]]:
    """Every domain of ``uri``, active and inactive. Returns (guests, per-domain errors).

    The guests keep no lxml tree (the audit reads only the model), so a libvirt holding thousands
    of domains costs the models, not thousands of documents. Per domain there is one call to libvirt,
    its XML: whether it runs comes with the one listing (a domain handle carries its ID, -1 when shut off;
    ``ID()`` reads the handle, it asks libvirt nothing), so a domain started between two listings is
    neither read twice nor missed. Running domains come first, as libvirt listed them, then the others.
    """
    libvirt = _libvirt()
    conn = open_readonly(uri)
    guests: list[Guest] = []
    errors: list[str] = []
    try:
        try:
            listed = [(d, d.ID() >= 0) for d in conn.listAllDomains(0)]
        except libvirt.libvirtError as exc:
            raise InputError(uri, f"cannot list domains: {_first_line(exc)}") from None
        domains = [x for x in listed if x[1]] + [x for x in listed if not x[1]]
        del listed
        for dom, active in domains:
            name = "?"
            try:
                name = dom.name()
                flags = 0 if active else libvirt.VIR_DOMAIN_XML_INACTIVE
                xml = dom.XMLDesc(flags)
                origin = f"{uri}#{name}"
                guest = guest_from_tree(parse_xml_bytes(xml.encode(), origin), origin, "libvirt")
                guest.active = active
                _release_unless_needed(guest)
                guests.append(guest)
            except libvirt.libvirtError as exc:
                errors.append(f"{uri}#{name}: {_first_line(exc)}")
            except InputError as exc:
                errors.append(str(exc))
    finally:
        conn.close()
    return guests, errors


def _release_unless_needed(guest: Guest) -> None:
    """Drop the lxml document, keeping what the rules read from it: the CPU layout is kept as data;
    the few guests whose rules walk the document itself (Windows guests' Hyper-V and clock elements,
    vhost-user NICs' memory backing) keep it."""
    cpu_layout(guest)
    if windows_hint(guest) is not None or any(n.type == "vhostuser" for n in guest.nics):
        return
    guest.release_xml()


def libvirt_answers(uri: str) -> bool:
    try:
        open_readonly(uri).close()
    except KvmtuneError:
        return False
    return True
