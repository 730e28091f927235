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
from kvmtune.kubevirt.guest import Spec, spec_of
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
            finding.fix = FixHint("manual", f"KubeVirt: set {path}: {form.value} in {spec.obj.doc.path}{note}; "
                                  f"'{how}' sets it; takes effect {RESTART}", False, takes_effect="restart",
                                  when="applies at the next restart of the guest")
            continue
        finding.fix = FixHint("manual", f"KubeVirt: set {path}: {form.value} in {spec.obj.doc.path}{note}; "
                              f"takes effect {RESTART}", False)
