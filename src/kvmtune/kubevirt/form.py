"""A rule's fix in KubeVirt's terms: the VirtualMachine field to set, as plain data a rule declares (``kubevirt``),
the way its ``pve`` attribute declares the ``qm set`` form.

``field`` is relative to the VMI spec (``spec.template.spec`` of a VirtualMachine), with ``{disk}`` or ``{nic}``
for the index of the finding's disk or interface; ``None`` says KubeVirt has no field for it (the finding is then
information on a KubeVirt guest: nothing in the manifest changes it), ``note`` why.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KubevirtForm:
    field: str | None
    value: str = ""
    note: str = ""

    def path(self, base: str, disk: int | None = None, nic: int | None = None) -> str | None:
        if self.field is None:
            return None
        rel = self.field.replace("{disk}", str(disk if disk is not None else 0))
        rel = rel.replace("{nic}", str(nic if nic is not None else 0))
        return f"{base}.{rel}"


def no_field(note: str) -> KubevirtForm:
    return KubevirtForm(None, note=note)
