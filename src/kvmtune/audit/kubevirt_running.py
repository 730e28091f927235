"""A running VMI's effective domain XML (``audit --kubevirt``), audited by the domain rules and mapped back to the spec.

``kubevirt/launcher.py`` reads ``virsh dumpxml NS_NAME`` from the VMI's virt-launcher pod; here it is parsed as any
domain XML kvmtune reads (``domain/xml.py``: at most 16 MiB, no DTD or entity, malformed XML in one line), held to
what was asked (its ``<name>`` is ``NS_NAME``; a KubeVirt ``<metadata>`` uid, where there is one, the VMI's), and
becomes a guest named ``kubevirt:NS/NAME (running)`` beside the one read from the spec.

Each of its findings is mapped back to the spec field that causes it: the rule's ``kubevirt`` form (kubevirt/form.py)
gives the field, the domain's device is matched to the spec's disk or interface by the user alias KubeVirt's
converter gives it (``ua-<name>``), and the spec is the VirtualMachine's template when the VMI belongs to a VM that
was read, else the VMI's own. The finding keeps its XPath as evidence (that is where it was read) and carries the
spec path in ``extra["location"]`` and its fix text; a rule with no KubeVirt form says that no spec field is known,
one whose form says KubeVirt has none becomes information, as on the spec's own guest.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kvmtune.audit.engine import AuditResult
from kvmtune.audit.finding import Finding, FixHint, Severity
from kvmtune.audit.kubevirt_advice import RESTART
from kvmtune.audit.rule import all_rules
from kvmtune.domain.cputune import cpu_layout
from kvmtune.domain.windows import windows_hint
from kvmtune.domain.xml import guest_from_tree, parse_xml_bytes
from kvmtune.errors import InputError
from kvmtune.kubevirt.form import KubevirtForm
from kvmtune.kubevirt.guest import Spec, spec_of
from kvmtune.kubevirt.launcher import LauncherXml, read_running
from kvmtune.kubevirt.load import KObject
from kvmtune.model.guest import Guest
from kvmtune.runner import Runner
from kvmtune.textsafe import safe

LAUNCHER = "kubevirt-launcher"  # Guest.origin_kind of a domain read from a virt-launcher pod
LINK = "kubevirt_running"  # Guest.derived: its Link to the spec
KUBEVIRT_XMLNS = "http://kubevirt.io"
USER_ALIAS = "ua-"  # the converter's alias prefix for a spec disk's or interface's name


@dataclass
class Link:
    vmi: str  # kubevirt:NS/NAME, the spec's guest
    pod: str
    where: str  # kubectl://CONTEXT/NS/POD#NS_NAME
    spec: Spec | None
    devices: dict[str, str] = field(default_factory=dict)  # the domain's device label -> the spec's name (its alias)


def running_name(namespace: str, name: str) -> str:
    return f"kubevirt:{namespace}/{name} (running)"


def _metadata_uid(guest: Guest) -> str | None:
    root = guest.tree.getroot() if guest.tree is not None else None
    el = root.find(f"metadata/{{{KUBEVIRT_XMLNS}}}kubevirt/{{{KUBEVIRT_XMLNS}}}uid") if root is not None else None
    text = el.text if el is not None else None
    return text.strip() if isinstance(text, str) and text.strip() else None


def _alias(element: Any) -> str | None:
    el = element.find("alias") if element is not None else None
    name = el.get("name") if el is not None else None
    return name[len(USER_ALIAS):] if isinstance(name, str) and name.startswith(USER_ALIAS) else None


def guest_of(found: LauncherXml, spec: Spec | None) -> Guest:
    """The running domain as a guest; :class:`InputError` when it is not the one asked for."""
    data = found.xml.encode("utf-8")
    guest = guest_from_tree(parse_xml_bytes(data, found.where), found.where, LAUNCHER, raw=data)
    vmi = found.running
    if guest.name != vmi.domain:
        raise InputError(found.where, f"virsh answered the domain {safe(guest.name)!r}, not {vmi.domain}; not audited")
    uid = _metadata_uid(guest)
    if uid is not None and uid != vmi.uid:
        raise InputError(found.where, f"the domain's KubeVirt metadata names the VMI uid {safe(uid)!r}, not {vmi.uid}; "
                         "not audited")
    link = Link(f"kubevirt:{vmi.namespace}/{vmi.name}", found.pod, found.where, spec)
    for label, element in [*((d.label, d.element) for d in guest.disks), *((n.label, n.element) for n in guest.nics)]:
        alias = _alias(element)
        if alias is not None:
            link.devices[label] = alias
    guest.name = running_name(vmi.namespace, vmi.name)
    guest.active = True
    guest.derived[LINK] = link
    cpu_layout(guest)  # read while the document is there (domain/connection.py keeps the same)
    if windows_hint(guest) is None and not any(n.type == "vhostuser" for n in guest.nics):
        guest.release_xml()
    return guest


def add_running(runner: Runner, context: str | None, objects: list[KObject], result: AuditResult) -> None:
    """Every running VMI's effective domain XML as a guest of its own, linked to the spec guest it runs."""
    launched = read_running(runner, context, objects)
    result.looked_at.extend(safe(n) for n in launched.notes)
    result.errors.extend(safe(e) for e in launched.errors)
    specs = {g.name: spec_of(g) for g in result.guests if g.origin_kind == "kubevirt"}
    ok = 0
    for found in launched.found:
        vmi = found.running
        try:
            guest = guest_of(found, specs.get(f"kubevirt:{vmi.namespace}/{vmi.name}"))
        except InputError as exc:
            result.errors.append(safe(str(exc)))
            continue
        result.guests.append(guest)
        ok += 1
    tried = len(launched.found) + len(launched.errors)
    if tried or launched.notes:
        result.looked_at.append(f"{ok} running VMI domain(s) read through virt-launcher (virsh dumpxml)")


def _spec_index(spec: Spec, what: str, name: str | None) -> int | None:
    items = spec.get(f"domain.devices.{what}")
    for i, item in enumerate(items if isinstance(items, list) else []):
        if isinstance(item, dict) and item.get("name") == name:
            return i
    return None


def _path(form: KubevirtForm, finding: Finding, link: Link, spec: Spec) -> tuple[str | None, str]:
    """The spec path of ``form`` for ``finding``'s device, or ``None`` and why it cannot be told."""
    assert form.field is not None
    device = finding.target.device
    name = link.devices.get(device or "")
    disk = nic = None
    if "{disk}" in form.field or "{nic}" in form.field:
        what = "disks" if "{disk}" in form.field else "interfaces"
        if name is None:
            return None, (f"the running domain's {safe(device or 'device')} carries no KubeVirt alias (ua-NAME): "
                          "which spec entry made it is not known")
        index = _spec_index(spec, what, name)
        if index is None:
            return None, (f"the running domain's {safe(device or '')} is {safe(name)!r}, which has no entry in "
                          f"{spec.path('domain.devices.' + what)} (KubeVirt added it)")
        disk, nic = (index, None) if what == "disks" else (None, index)
    return form.path(spec.base, disk, nic), ""


def _map(finding: Finding, link: Link, form: KubevirtForm | None) -> None:
    spec = link.spec
    location: dict[str, Any] = {"file": spec.obj.doc.path if spec else link.where, "domain_xml": link.where,
                                "xpath": finding.evidence, "spec_of": link.vmi}
    finding.extra["location"] = location
    found_in = "read from the running domain, not the manifest"
    if spec is None:
        location["path"] = None
        finding.fix = FixHint("manual", f"{found_in}; the VMI's spec was not read, so no spec field is named", False)
        return
    if form is None:
        location["path"] = None
        finding.fix = FixHint("manual", f"no KubeVirt spec field is known to cause this ({found_in}); libvirt's "
                              f"form: {finding.fix.description}", False)
        return
    if form.field is None:
        location["path"] = None
        finding.severity = min(finding.severity, Severity.INFO)
        finding.summary = f"{finding.summary} (KubeVirt: {form.note})"
        finding.fix = FixHint("manual", f"KubeVirt: {form.note} ({found_in})", False)
        return
    path, why = _path(form, finding, link, spec)
    location["path"] = path
    if path is None:
        finding.fix = FixHint("manual", f"no spec field can be named: {why} ({found_in})", False)
        return
    location["written"] = spec.obj.doc.at(path) is not None
    note = f"; {form.note}" if form.note else ""
    finding.fix = FixHint("manual", f"KubeVirt: set {path}: {form.value} in {spec.obj.doc.path}{note}; takes effect "
                          f"{RESTART} ({found_in})", False)


def kubevirt_running_texts(findings: Iterable[Finding], guests: Iterable[Guest]) -> None:
    """Map each finding on a running VMI's domain back to the spec field that causes it (module docstring)."""
    links = {g.name: link for g in guests if g.origin_kind == LAUNCHER and isinstance(link := g.derived.get(LINK), Link)}
    if not links:
        return
    forms = {r.id: r.kubevirt for r in all_rules()}
    for finding in findings:
        link = links.get(finding.target.domain or "")
        if link is not None:
            _map(finding, link, forms.get(finding.rule))
