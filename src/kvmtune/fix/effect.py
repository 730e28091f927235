"""When a planned change takes effect: one of five words, decided when the plan is made.

Every :class:`~kvmtune.fix.plan.Change` carries :class:`Planned` items (one per finding or setting it answers),
each with its ``takes_effect``. The platforms' rules it follows (docs/fix.md, "When a fix takes effect"):

- libvirt: a definition changed with ``defineXML`` (``virsh define``, ``--config``) applies at the domain's next
  start; a running domain keeps its live XML until it is shut down and started again (libvirt's "Domain XML
  format" and ``virsh(1)``, ``--config`` vs ``--live``; ``virDomainUpdateDeviceFlags`` with ``AFFECT_LIVE``).
- Proxmox VE: ``qm set`` on a running VM writes ``[PENDING]`` unless the option is hot-pluggable (``qm.conf(5)``
  ``hotplug``, default ``network,disk,usb``); a controller change "only takes effect at VM start".
- Host: a sysctl or sysfs value written now applies at once; a drop-in (sysctl.d, tmpfiles.d, udev, modprobe.d)
  or a kernel command line applies at the next boot.
- Images: converted only while no guest has the image open.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest

TakesEffect = Literal["live", "restart", "new-instances", "host-boot", "guest-offline"]

VALUES: tuple[TakesEffect, ...] = get_args(TakesEffect)

MEANING: dict[TakesEffect, str] = {
    "live": "in force when 'fix --apply' returns (a stopped guest starts with it)",
    "restart": "at the next stop and start of the guest (a reboot inside the guest is not enough)",
    "new-instances": "only for guests created or defined from this definition, template or file from now on",
    "host-boot": "at the next boot of the host",
    "guest-offline": "needs the guest stopped to be applied at all",
}

# the words audit's fix text uses ("applies at the next restart")
PHRASE: dict[TakesEffect, str] = {
    "live": "applies at once",
    "restart": "applies at the next restart of the guest",
    "new-instances": "applies to guests defined from it from now on",
    "host-boot": "applies at the next boot of the host",
    "guest-offline": "applies only with the guest stopped",
}

# the later a value lets the change be seen, the higher: a change's one word is its latest item's
_ORDER: dict[TakesEffect, int] = {"live": 0, "restart": 1, "guest-offline": 2, "new-instances": 3, "host-boot": 4}

# Proxmox VE's hotplug default (qm.conf(5): "hotplug: <string> (default = network,disk,usb)")
PVE_HOTPLUG_DEFAULT = frozenset({"network", "disk", "usb"})


def parse(value: object) -> TakesEffect:
    """One of the five words; ValueError naming what it got otherwise (a journal is foreign input)."""
    for v in VALUES:
        if value == v:
            return v
    raise ValueError(f"unknown takes_effect {str(value)[:40]!r}")


@dataclass(frozen=True)
class Planned:
    """One finding or setting a change answers: which guest (or host), rule, target, what, and when."""

    guest: str
    rule: str
    target: str
    what: str
    takes_effect: TakesEffect

    def to_json(self) -> dict[str, str]:
        return {"guest": self.guest, "rule": self.rule, "target": self.target, "what": self.what,
                "takes_effect": self.takes_effect}


def latest(values: Iterable[TakesEffect]) -> TakesEffect:
    """The one word for several items: the latest any of them takes effect ("live" for none)."""
    return max(values, key=_ORDER.__getitem__, default="live")


def libvirt(*, origin: str, active: bool, live: bool = False) -> TakesEffect:
    """A libvirt definition's change: a file (``origin`` "xml") applies to domains defined from it; a stopped
    domain starts with it; a running one at its next start, unless it was also made live (``--live``)."""
    if origin != "libvirt":
        return "new-instances"
    if not active or live:
        return "live"
    return "restart"


def pve_hotplug(value: str | None) -> frozenset[str]:
    """A VM's ``hotplug`` option as the set of what PVE hot-plugs (``1``: the default set, ``0``: nothing)."""
    if value is None:
        return PVE_HOTPLUG_DEFAULT
    text = value.strip()
    if text == "1":
        return PVE_HOTPLUG_DEFAULT
    if text == "0" or not text:
        return frozenset()
    return frozenset(p.strip() for p in text.split(",") if p.strip())


def pve_key(key: str, *, running: bool, hotplug: frozenset[str], moves: bool = False) -> TakesEffect:
    """A ``qm set`` key: a volume moved to another bus needs the VM stopped; on a stopped VM the rest applies at
    once; on a running one a NIC (``netN``) is re-plugged live when ``network`` is hot-pluggable (qemu-server's
    ``vmconfig_update_net``), ``vcpus`` with ``cpu`` and ``memory`` with ``memory``; everything else, drive
    options and the SCSI controller included, waits in ``[PENDING]`` for the next start."""
    if moves:
        return "guest-offline"
    if not running:
        return "live"
    if key.startswith("net") and key[3:].isdigit() and "network" in hotplug:
        return "live"
    if key == "vcpus" and "cpu" in hotplug:
        return "live"
    if key == "memory" and "memory" in hotplug:
        return "live"
    return "restart"


# which qm set keys a rule's Proxmox VE form changes, by the form's kind (proxmox/qmset.py's PveForm)
_PVE_FORM_KEYS: dict[str, tuple[str, ...]] = {
    "disk-props": ("scsi0",), "aio": ("scsi0",), "iothread": ("scsi0",), "scsihw": ("scsihw",),
    "nic-model": ("net0",), "queues": ("net0",),
}


def for_finding(finding: Finding, guest: Guest | None) -> TakesEffect | None:
    """When ``kvmtune fix``'s change for ``finding`` would take effect, for its guest as audit read it; None where
    kvmtune fixes nothing (``manual``)."""
    kind = finding.fix.kind
    if kind == "manual":
        return None
    if kind == "image":
        return "guest-offline"
    if kind == "cmdline":
        return "host-boot"  # a kernel command-line argument: read by the next boot, nothing to write now
    if kind in ("sysctl", "sysfs", "udev", "modprobe"):
        return "live"  # fix --host writes the runtime value now; its drop-in repeats it at boot
    if guest is None:
        return "restart"
    if guest.origin_kind == "pve":
        from kvmtune.audit.rule import rule_by_id
        from kvmtune.proxmox.guest import config_of

        cfg = config_of(guest)
        hotplug = pve_hotplug(cfg.current.get("hotplug") if cfg is not None else None)
        rule = rule_by_id(finding.rule)
        form = rule.pve if rule is not None else None
        if form is None:
            return "restart"
        keys = _PVE_FORM_KEYS.get(form.kind) or tuple(k for k, _v in form.values) or ("",)
        # audit does not know whether the VM runs: as if it did (the later answer)
        return latest(pve_key(k, running=True, hotplug=hotplug, moves=form.kind == "bus")
                      for k in keys)
    if guest.origin_kind == "cmdline":
        return "restart"  # a running QEMU: its definition, wherever it is, is read at its next start
    if guest.origin_kind == "kubevirt":
        # KubeVirt's default rollout strategy, Stage: a VirtualMachine's spec change sets RestartRequired and reaches
        # the VMI at its next restart (user guide, "VM Rollout Strategies"); what LiveUpdate propagates is not
        # told apart yet (docs/kubevirt.md)
        return "restart"
    return libvirt(origin=guest.origin_kind, active=bool(guest.active))


def annotate(findings: Sequence[Finding], guests: Sequence[Guest]) -> None:
    """Set each finding's ``fix.takes_effect`` and its phrase (audit's fix text, JSON and SARIF)."""
    by_name: dict[str, Guest] = {}
    for g in guests:
        by_name.setdefault(g.name, g)
    for f in findings:
        when = for_finding(f, by_name.get(f.target.domain or ""))
        if when is not None:
            f.fix = replace(f.fix, takes_effect=when, when=PHRASE[when])
