from __future__ import annotations

import re
from collections import defaultdict
from typing import TYPE_CHECKING

from kvmtune.audit.finding import Severity
from kvmtune.audit.rule import GuestRule, RunRule
from kvmtune.audit.verifyplan import NoExperiment
from kvmtune.rules.common import others_shown

if TYPE_CHECKING:
    from collections.abc import Iterator

    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.finding import Finding
    from kvmtune.model.guest import Guest, Nic

_HEX = re.compile(r"[^0-9a-f]")


def normalise_mac(mac: str | None) -> str | None:
    """52-54-00-AB-cd-01 and 52:54:00:ab:cd:01 are the same address; anything not 48 bits is ignored."""
    if not mac:
        return None
    digits = _HEX.sub("", mac.strip().lower())
    if len(digits) != 12:
        return None
    return ":".join(digits[i : i + 2] for i in range(0, 12, 2))


class DuplicateMac(RunRule):
    id = "KVM-NET-006"
    slug = "duplicate-mac"
    topic = "mac-address"
    severity = Severity.CRITICAL
    title = "The same MAC address is used by more than one NIC"
    why = (
        "Two NICs with one MAC on the same layer-2 segment confuse every bridge and switch forwarding table: "
        "frames go to whichever port announced the address last, so both guests lose packets, connections "
        "reset and DHCP hands out the same lease twice. It typically comes from cloning a domain XML and "
        "keeping the <mac> line."
    )
    fix_kind = "manual"
    fix_description = (
        "Give each NIC its own address: delete the copied <mac> so libvirt generates one (52:54:00:xx:xx:xx), "
        "then update any DHCP reservation or guest config bound to the old MAC."
        " Not automatic: which NIC keeps the address (DHCP reservations, firewall rules) is the administrator's decision."
    )
    fix_safe = False
    references = (
        "libvirt formatdomain: interface mac address (generated when omitted)",
        "IEEE 802.1D: a MAC address identifies one station on a bridged LAN",
    )
    verify = NoExperiment("a duplicate MAC is a correctness fault, not a speed setting; nothing to measure")

    def check_run(self, guests: list[Guest], ctx: AuditContext) -> Iterator[Finding]:
        # who uses each MAC: {mac: {guest identity: [(guest, nic), ...]}}. A guest is its UUID, else its
        # source plus its name: two VMs called "web" from two files are two guests, while one VM read
        # from its XML and from its running process (libvirt passes -uuid) is not its own duplicate
        users: dict[str, dict[tuple[str, ...], list[tuple[Guest, Nic]]]] = defaultdict(lambda: defaultdict(list))
        for guest in guests:
            for nic in guest.nics:
                mac = normalise_mac(nic.mac)
                if mac is not None and not nic.teaming:  # a failover pair shares its MAC by design
                    users[mac][guest.identity].append((guest, nic))
        seen: set[tuple[tuple[str, ...], str, int]] = set()
        for mac, by_id in users.items():
            ids = sorted(by_id)
            within = {ident for ident, pairs in by_id.items() if self._same_guest_twice(pairs)}
            if len(ids) < 2 and not within:
                continue
            labels = self._labels({ident: by_id[ident][0][0] for ident in ids})
            listed = [labels[i] for i in ids]
            for place, ident in enumerate(ids):
                # the other guests, without listing them all for each guest (linear in the guests, issue 38)
                n_others = len(ids) - 1
                pairs = by_id[ident]
                if not n_others and ident not in within:
                    continue
                for guest, nic in pairs:
                    key = (ident, mac, nic.index)
                    if key in seen:
                        continue
                    seen.add(key)
                    what = []
                    if n_others:
                        shown = ", ".join(others_shown(listed, place, 5)) + (
                            f" and {n_others - 5} more" if n_others > 5 else "")
                        what.append(f"also used by {shown}")
                    if ident in within:
                        what.append("used by another NIC of this guest")
                    yield self.finding(
                        target=GuestRule.target(guest, nic.label),
                        actual=f"{mac} (not unique)",
                        expected="a MAC address unique to this NIC",
                        evidence=nic.where("mac"),
                        source=guest.origin,
                        summary=f"MAC {mac} is not unique: {'; '.join(what)}",
                    )

    @staticmethod
    def _labels(guests: dict[tuple[str, ...], Guest]) -> dict[tuple[str, ...], str]:
        """Guests by name; a name shared by two different guests gets its source added."""
        count: dict[str, int] = defaultdict(int)
        for g in guests.values():
            count[g.name] += 1
        return {ident: g.name if count[g.name] == 1 else f"{g.name} ({g.origin})" for ident, g in guests.items()}

    @staticmethod
    def _same_guest_twice(pairs: list[tuple[Guest, Nic]]) -> bool:
        """Two NICs of one guest (as read from one source) carry the same MAC."""
        per_origin: dict[str, int] = defaultdict(int)
        for guest, _nic in pairs:
            per_origin[guest.origin] += 1
        return any(n > 1 for n in per_origin.values())
