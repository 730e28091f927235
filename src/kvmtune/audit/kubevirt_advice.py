"""Findings on a KubeVirt guest point at the manifest line and carry their fix as the VirtualMachine field to set.

Each finding gets ``extra["location"]``: the manifest file, the line and column of the field (of the closest
written part of it, for a default: the disk entry that has no ``bus``) and the field's spec path
(``spec.template.spec.domain.devices.disks[1].disk.bus``); SARIF's region reads it. Its evidence becomes that spec
path. The fix text is the rule's ``kubevirt`` form (kubevirt/form.py); a rule whose form says KubeVirt has no field
for it becomes information (nothing in the manifest changes it); a rule with no form keeps its libvirt text, said to be
libvirt's. A change to a VirtualMachine's template takes effect at the VM's next restart under KubeVirt's default
rollout strategy (``Stage``: the VM shows ``RestartRequired``).
"""

from __future__ import annotations

from collections.abc import Iterable

from kvmtune.audit.finding import Finding, FixHint, Severity
from kvmtune.audit.rule import all_rules
from kvmtune.kubevirt.form import KubevirtForm
from kvmtune.kubevirt.guest import Spec, spec_of
from kvmtune.kubevirt.load import KObject
from kvmtune.model.guest import Guest

RESTART = "at the VM's next restart (KubeVirt's default rollout strategy Stage marks the VM RestartRequired)"


def device_index(device: str | None, guest: Guest) -> tuple[int | None, int | None]:
    if not device:
        return None, None
    for i, disk in enumerate(guest.disks):
        if disk.label == device:
            return i, None
    for i, nic in enumerate(guest.nics):
        if nic.label == device:
            return None, i
    return None, None


def _spec_path(evidence: str) -> str | None:
    path = evidence.split(" (", 1)[0].strip()
    return path if path.startswith("spec") else None


def locate(finding: Finding, spec: Spec, guest: Guest) -> None:
    """The finding's manifest line and spec path; its evidence the spec path (an XPath has no meaning here)."""
    form = next((r.kubevirt for r in all_rules() if r.id == finding.rule), None)
    path = _spec_path(finding.evidence)
    if path is None and form is not None:
        disk, nic = device_index(finding.target.device, guest)
        path = form.path(spec.base, disk, nic)
    if path is None:
        path = spec.base
        disk, nic = device_index(finding.target.device, guest)
        if disk is not None:
            path = guest.disks[disk].locator
        elif nic is not None:
            path = guest.nics[nic].locator
    written, (line, column) = spec.obj.doc.nearest(path)
    if not finding.evidence.startswith("spec"):
        finding.evidence = path if written == path else f"{path} (not set)"
    if spec.obj.doc.path.startswith("kubectl://"):  # read from a cluster: kubectl's answer has no line to point at
        finding.extra["location"] = {"file": spec.obj.doc.path, "path": path, "written": written == path}
        return
    finding.extra["location"] = {"file": spec.obj.doc.path, "line": line, "column": column, "path": path,
                                 "written": written == path}


def owner_of(finding: Finding, spec: Spec, form: KubevirtForm) -> tuple[KObject, str] | None:
    """The instancetype or preference a fix belongs to (audit's text and fix/kubevirt.py both ask here), with the
    path in it: the preference when the value is the preference's default, the instancetype when the VM has one
    and the form says the instancetype holds the field (KubeVirt refuses a VM that sets what its instancetype sets)."""
    if form.preference and "the preference's" in finding.evidence and spec.preference is not None:
        return spec.preference, f"spec.{form.preference}"
    body = spec.obj.body.get("spec")
    if spec.obj.kind == "VirtualMachinePool" and isinstance(body, dict):
        tpl = body.get("virtualMachineTemplate")
        body = tpl.get("spec") if isinstance(tpl, dict) else None
    if form.instancetype and isinstance(body, dict) and isinstance(body.get("instancetype"), dict) \
            and spec.instancetype is not None:
        return spec.instancetype, f"spec.{form.instancetype}"
    return None


def kubevirt_fix_texts(findings: Iterable[Finding], guests: Iterable[Guest]) -> None:
    by_name = {g.name: g for g in guests if g.origin_kind == "kubevirt"}
    forms = {r.id: r.kubevirt for r in all_rules()}
    for finding in findings:
        guest = by_name.get(finding.target.domain or "")
        spec = spec_of(guest) if guest is not None else None
        if guest is None or spec is None:
            continue
        locate(finding, spec, guest)
        form = forms.get(finding.rule)
        fix = finding.fix
        if form is None:
            if not fix.description.startswith("KubeVirt"):
                finding.fix = FixHint(fix.kind, f"libvirt's form (no KubeVirt form known): {fix.description}", fix.safe)
            continue
        if form.field is None:
            finding.severity = min(finding.severity, Severity.INFO)
            finding.summary = f"{finding.summary} (KubeVirt: {form.note})"
            finding.fix = FixHint("manual", f"KubeVirt: {form.note}", False)
            continue
        disk, nic = device_index(finding.target.device, guest)
        path = form.path(spec.base, disk, nic)
        note = f"; {form.note}" if form.note else ""
        if form.settable and form.value_for(spec, guest) is not None:
            # kvmtune fix sets it (in the manifest, or with kubectl patch): a spec change, at the VM's next restart
            how = "kvmtune fix FILE" if not spec.obj.doc.path.startswith("kubectl://") else "kvmtune fix --kubevirt"
            owner = owner_of(finding, spec, form)
            if owner is not None:  # the VM takes it from its instancetype or preference: the fix is made there
                obj, rel = owner
                finding.fix = FixHint("manual", f"KubeVirt: set {rel}: {form.value} in {obj.kind} {obj.name} "
                                      f"({obj.doc.path}), which the VM takes it from; '{how}' sets it; takes effect "
                                      "as a new revision, at the next restart of each VM that picks it up", False,
                                      takes_effect="restart", when="applies at the next restart of the guest")
                continue
            finding.fix = FixHint("manual", f"KubeVirt: set {path}: {form.value} in {spec.obj.doc.path}{note}; "
                                  f"'{how}' sets it; takes effect {RESTART}", False, takes_effect="restart",
                                  when="applies at the next restart of the guest")
            continue
        finding.fix = FixHint("manual", f"KubeVirt: set {path}: {form.value} in {spec.obj.doc.path}{note}; "
                              f"takes effect {RESTART}", False)
