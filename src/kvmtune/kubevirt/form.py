"""A rule's fix in KubeVirt's terms: the VirtualMachine field to set, as plain data a rule declares (``kubevirt``),
the way its ``pve`` attribute declares the ``qm set`` form.

``field`` is relative to the VMI spec (``spec.template.spec`` of a VirtualMachine), with ``{disk}`` or ``{nic}``
for the index of the finding's disk or interface; ``None`` says KubeVirt has no field for it (the finding is then
information on a KubeVirt guest: nothing in the manifest changes it), ``note`` why. ``value`` is the text audit
shows.

What ``kvmtune fix`` sets (kept small, declared by the rule):

- ``setting``: the JSON value to set (``True``, ``"virtio"``, ``{}``, a mapping of them); or
- ``compute``: one of :data:`COMPUTED`, a value worked out per finding from the VM (``memory-guest``: the VM's
  ``memory.guest`` as written; ``cpu-request``: vCPUs / 10 in millicores, KubeVirt's own default ratio);
- neither: no concrete value (``an odd count``), so the finding stays advice and the plan says so;
- ``instancetype`` / ``preference``: the same setting's path in the instancetype's or preference's ``spec``, where
  the fix is made when the VM takes that value from one (KubeVirt refuses a VM that sets what its instancetype sets);
- ``guest_visible``: the guest sees the change (a disk bus, a NIC model): ``fix`` makes it only with
  ``--allow-bus-change``, as for libvirt and Proxmox VE guests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvmtune.kubevirt.guest import Spec
    from kvmtune.model.guest import Guest

COMPUTED = ("memory-guest", "cpu-request")
ALLOCATION_RATIO = 10  # KubeVirt's default cpuAllocationRatio


@dataclass(frozen=True)
class KubevirtForm:
    field: str | None
    value: str = ""
    note: str = ""
    setting: Any = None
    compute: str = ""
    instancetype: str = ""
    preference: str = ""
    guest_visible: bool = False

    def __post_init__(self) -> None:
        if self.compute and self.compute not in COMPUTED:
            raise ValueError(f"unknown computed KubeVirt value {self.compute!r}")

    def path(self, base: str, disk: int | None = None, nic: int | None = None) -> str | None:
        if self.field is None:
            return None
        rel = self.field.replace("{disk}", str(disk if disk is not None else 0))
        rel = rel.replace("{nic}", str(nic if nic is not None else 0))
        return f"{base}.{rel}"

    @property
    def settable(self) -> bool:
        return self.field is not None and (self.setting is not None or bool(self.compute))

    def value_for(self, spec: Spec, guest: Guest) -> Any:
        """The value ``fix`` sets for this VM; ``None`` when there is none to set."""
        if self.setting is not None:
            return self.setting
        if self.compute == "memory-guest":
            mem = spec.get("domain.memory.guest")
            return mem if isinstance(mem, str | int) and not isinstance(mem, bool) else None
        if self.compute == "cpu-request" and guest.vcpus:
            return f"{math.ceil(guest.vcpus * 1000 / ALLOCATION_RATIO)}m"
        return None


def no_field(note: str) -> KubevirtForm:
    return KubevirtForm(None, note=note)
