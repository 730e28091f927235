from __future__ import annotations

import re
from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule
from kvmtune.domain.cputune import cpu_layout
from kvmtune.domain.windows import windows_hint

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest

# Windows client editions use at most two physical processors (sockets): Home one, Pro, Enterprise and
# Education two (Pro for Workstations four). Server editions are not limited this way.
CLIENT_SOCKETS = 2
# libosinfo ids of client editions: http://microsoft.com/win/7, /8, /8.1, /10, /11 (servers are /2k8, /2k19, ...)
_CLIENT_OSINFO = re.compile(r"^https?://microsoft\.com/win/(7|8|8\.1|10|11)$", re.I)
# a guest named like a client edition: win10, windows-11, Win7x64 (not win2019, w2k22)
_CLIENT_NAME = re.compile(r"(?<![a-z0-9])win(?:dows)?[-_ ]?(7|8|8\.1|10|11)(?![0-9.])", re.I)


def windows_client(guest: Guest) -> tuple[str, str] | None:
    """(version, confidence) when the guest runs a Windows client edition, else ``None``."""
    m = _CLIENT_OSINFO.match(guest.libosinfo_id or "")
    if m:
        return m.group(1), "certain"
    if guest.libosinfo_id or windows_hint(guest) is None:
        return None  # another libosinfo id says what it is; without any Windows hint the name is not enough
    m = _CLIENT_NAME.search(guest.name)
    return (m.group(1), "possible") if m else None


class WindowsClientSockets(GuestRule):
    id = "KVM-WIN-005"
    slug = "windows-client-sockets"
    topic = "cpu-model"
    severity = Severity.MEDIUM
    also_severities = (Severity.HIGH,)
    title = "Windows client edition given more than 2 CPU sockets: it leaves the vCPUs of the others idle"
    why = (
        "Windows 10 and 11 (like 7 and 8) license and schedule at most two physical processors: Home one, Pro "
        "and Enterprise two. A guest whose vCPUs are presented as sockets (sockets='8' cores='1', or libvirt's "
        "default without <topology>, one socket per vCPU) runs on the first two sockets' vCPUs only; the rest "
        "stay offline in Task Manager while the host still schedules them. Cores per socket are not limited."
    )
    fix_kind = "manual"
    fix_description = (
        "Present the vCPUs as cores of one socket: <cpu><topology sockets='1' dies='1' cores='N' threads='1'/> "
        "(or threads='2' matching the host's SMT when pinned); the vCPU count stays the same. Guest restart."
    )
    fix_safe = False
    references = (
        "Microsoft, Windows 10/11 edition comparison: maximum CPU sockets Home 1, Pro/Enterprise 2, "
        "Pro for Workstations 4",
        "libvirt formatdomain 'CPU model and topology': <topology sockets dies cores threads>; "
        "without it libvirt starts QEMU with one socket per vCPU (-smp N,sockets=N,cores=1,threads=1)",
        "Proxmox VE qm.adoc 'CPU': prefer cores to sockets where the OS is licensed per socket",
    )

    def check(self, guest: Guest, ctx: AuditContext) -> Iterator[Finding]:
        client = windows_client(guest)
        layout = cpu_layout(guest)
        if client is None or layout is None:
            return
        vcpus = guest.vcpus or 1
        topo = layout.topology
        if topo.get("sockets"):
            sockets = topo["sockets"]
            per_socket = topo.get("dies", 1) * topo.get("clusters", 1) * topo.get("cores", 1) * topo.get("threads", 1)
            stated = f"sockets='{sockets}'"
        else:
            sockets, per_socket = layout.max_vcpus or vcpus, 1
            stated = "no <topology> (libvirt: one socket per vCPU)"
        if sockets <= CLIENT_SOCKETS:
            return
        usable = min(vcpus, CLIENT_SOCKETS * per_socket)
        if usable >= vcpus:
            return  # the vCPUs online at boot all sit in the first two sockets
        idle = vcpus - usable
        version, confidence = client
        yield self.finding(
            target=self.target(guest, "cpu-topology"),
            actual=f"{stated} for {vcpus} vCPUs: Windows {version} uses {usable}, {idle} stay idle",
            expected=f"sockets='1' cores='{vcpus}' (at most {CLIENT_SOCKETS} sockets)",
            evidence="/domain/cpu/topology/@sockets, /domain/vcpu",
            source=guest.origin,
            severity=Severity.HIGH if idle >= usable else Severity.MEDIUM,
            confidence=confidence,
        )
