from __future__ import annotations

from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.rules.host import HostFactsRule

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.host.facts import HostFacts


class PveFirewallBridges(HostFactsRule):
    id = "KVM-HST-062"
    slug = "pve-firewall-bridges-unused"
    topic = "net-backend"
    severity = Severity.LOW
    title = "Guest NICs go through Proxmox VE firewall bridges while the firewall is off"
    why = (
        "A NIC with firewall=1 is plugged through its own firewall bridge (fwbr…) and veth pair (fwln…/fwpr…) so "
        "that iptables can filter it; with the datacenter firewall disabled nothing is filtered, but every frame "
        "still crosses the extra bridge and veth pair."
    )
    fix_kind = "manual"
    fix_description = (
        "Either enable the firewall these NICs ask for (Datacenter > Firewall > Options > Firewall: Yes), or clear "
        "the NICs' firewall flag: qm set VMID --netN <its value with firewall=0> (web UI: Network Device > "
        "Firewall), effective when the NIC is plugged again (VM restart)."
    )
    fix_safe = True
    references = (
        "Proxmox VE Administration Guide, 'Proxmox VE Firewall': the firewall flag of a guest's network device "
        "and the datacenter 'Firewall' option (cluster.fw [OPTIONS] enable)",
        "https://pve.proxmox.com/wiki/Firewall",
    )

    def check_facts(self, facts: HostFacts, ctx: AuditContext) -> Iterator[Finding]:
        if not facts.pve_node:
            return
        bridges = sorted(n for n in facts.net_devices if n.startswith("fwbr"))
        if not bridges or facts.pve_firewall_enabled:
            return
        shown = ", ".join(bridges[:6]) + (f" and {len(bridges) - 6} more" if len(bridges) > 6 else "")
        yield self.finding(
            target=self.at(ctx, "pve-firewall"),
            actual=f"{len(bridges)} firewall bridge(s) ({shown}); datacenter firewall disabled",
            expected="no firewall bridges while the firewall is off (firewall=0 on the NICs), or the firewall on",
            evidence="/sys/class/net/fwbr*, /etc/pve/firewall/cluster.fw [OPTIONS] enable",
        )
