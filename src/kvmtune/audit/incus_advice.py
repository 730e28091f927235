"""Findings on an LXD or Incus VM carry their fix in that manager's CLI where it has a key for it.

Incus (and LXD, as ``lxc``) set a VM's QEMU options from instance keys: ``io.bus`` and ``io.cache`` on a disk
device, ``limits.cpu`` and ``limits.memory.hugepages`` on the instance. An edit the guest's QEMU configuration
file would need but no key makes is said to need ``raw.qemu`` (or ``raw.qemu.conf``), which the manager passes
to QEMU unchecked; the libvirt text of the rule follows as what to express there.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from kvmtune.audit.finding import Finding, FixHint
from kvmtune.model.guest import Guest
from kvmtune.qemu.cmdline import INSTANCE_NAME

CLI = {"incus": "incus", "lxd": "lxc"}

# rule -> (device key or None for an instance key, key, value)
DEVICE_KEYS: dict[str, tuple[str, str]] = {
    "KVM-STO-001": ("io.bus", "virtio-blk"),
    "KVM-STO-012": ("io.bus", "virtio-scsi"),
    "KVM-STO-002": ("io.cache", "none"),
    "KVM-STO-003": ("io.cache", "none"),
    "KVM-STO-004": ("io.cache", "none"),
    "KVM-STO-005": ("io.cache", "none"),
    "KVM-STO-014": ("io.cache", "none"),
}
INSTANCE_KEYS: dict[str, tuple[str, str]] = {
    "KVM-MEM-004": ("limits.memory.hugepages", "true"),
}


def incus_fix_texts(findings: Iterable[Finding], guests: Iterable[Guest]) -> None:
    instances = {g.name: g.derived["instance"] for g in guests if "instance" in g.derived}
    if not instances:
        return
    for finding in findings:
        found = instances.get(finding.target.domain or "")
        if found is None:
            continue
        manager, instance = found
        cli = CLI.get(manager, "incus")
        device = _device_name(finding.target.device or "", manager)
        if finding.rule in DEVICE_KEYS and device:
            key, value = DEVICE_KEYS[finding.rule]
            text = f"{cli} config device set {instance} {device} {key}={value} (takes effect at the next start)"
        elif finding.rule in INSTANCE_KEYS:
            key, value = INSTANCE_KEYS[finding.rule]
            text = f"{cli} config set {instance} {key}={value} (takes effect at the next start)"
        elif finding.rule == "KVM-CPU-002":
            text = f"{cli} config set {instance} limits.cpu=N with N at most this host's online CPUs"
        elif finding.fix.kind == "xml":
            text = (f"{manager.upper() if manager == 'lxd' else 'Incus'} has no key for this; only raw.qemu or "
                    f"raw.qemu.conf ({cli} config set {instance} raw.qemu.conf=...) would do, unchecked by it: "
                    + finding.fix.description)
            finding.fix = FixHint("manual", text, finding.fix.safe)
            continue
        else:
            continue
        finding.fix = FixHint("manual", text, finding.fix.safe)


def _device_name(label: str, manager: str) -> str | None:
    """``disk:dev-incus_root`` -> ``root``: the instance's device, as the manager names QEMU's drive after it."""
    kind, _, name = label.partition(":")
    if kind != "disk" or not name:
        return None
    name = name.removeprefix("dev-")
    for prefix in ("lxd_", "incus_"):
        if name.startswith(prefix) and re.fullmatch(INSTANCE_NAME, name[len(prefix):]):
            return name[len(prefix):]
    return None
