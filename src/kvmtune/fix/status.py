"""``kvmtune fix --status``: the journaled changes still staged, read back where the platform says it.

- a libvirt domain redefined while it ran: its live XML (``virDomainGetXMLDesc`` without ``INACTIVE``) is read as
  hostile input and audited for the rules the change answered; a finding still there, at the same target, is a
  change the running guest does not have yet (staged until the live and the inactive definition agree on it);
- a Proxmox VE VM changed by ``qm set``: the keys its change set that PVE still lists as pending
  (``pvesh get /nodes/localhost/qemu/VMID/pending``);
- a KubeVirt VM patched with ``kubectl patch``: its ``RestartRequired`` condition (``kubectl get vm NAME -n NS -o
  json``); an instancetype or preference: a new revision, which each VM picks up at its next restart;
- a drop-in that takes effect at the host's next boot: staged while the host has not booted since the journal.

Only changes that were made (``done``) and not undone are looked at; a journal from before ``takes_effect`` is
read as its kind implies.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from dataclasses import dataclass
from typing import Any

from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import run_rules
from kvmtune.audit.rule import GuestRule, all_rules
from kvmtune.domain.xml import MAX_XML_BYTES, guest_from_tree, parse_xml_bytes
from kvmtune.errors import KvmtuneError
from kvmtune.fix.entries import AnyEntry, DomainEntry, FileEntry, KubectlEntry, QmEntry
from kvmtune.fix.journal import Journal
from kvmtune.host.root import HostRoot
from kvmtune.runner import Runner


@dataclass(frozen=True)
class Staged:
    journal: str
    n: int  # the change's number in its journal (1-based)
    what: str
    takes_effect: str
    why: str  # what still waits, or why it could not be told


def live_findings(xml: str, where: str, rules: set[str], host: HostRoot) -> set[tuple[str, str]]:
    """(rule, device) of each finding of ``rules`` on a running domain's live XML (hostile: bounded, parsed as
    any domain XML kvmtune reads)."""
    data = xml.encode("utf-8", "surrogatepass")
    if len(data) > MAX_XML_BYTES:
        raise KvmtuneError(f"{where}: its live XML is larger than {MAX_XML_BYTES // 2**20} MiB")
    guest = guest_from_tree(parse_xml_bytes(data, where), where, "libvirt")
    guest.on_audited_host = True
    chosen = [r for r in all_rules() if r.id in rules and issubclass(r, GuestRule)]
    return {(f.rule, f.target.device or guest.name) for f in run_rules(AuditContext(host=host), [guest], rules=chosen)}


def _domain(e: DomainEntry, conns: dict[str, Any], host: HostRoot) -> str | None:
    from kvmtune.fix.libvirt_rw import inactive_xml, live_xml, lookup_uuid, open_rw

    if e.uri not in conns:
        conns[e.uri] = open_rw(e.uri)
    dom = lookup_uuid(conns[e.uri], e.uuid, e.uri)
    if not dom.isActive():
        return None  # a stopped domain starts with its definition
    inactive = inactive_xml(dom)
    if e.after_xml is not None and inactive != e.after_xml:
        return "cannot tell: redefined since kvmtune changed it"
    if not e.planned:
        return "cannot tell: it runs, and the journal predates takes_effect (which settings to compare is unknown)"
    where = f"{e.uri}#{e.name} (live)"
    still = live_findings(live_xml(dom), where, {p.rule for p in e.planned if p.rule}, host)
    waiting = [f"{p.rule} {p.target}" for p in e.planned if (p.rule, p.target) in still]
    if not waiting:
        return None
    return f"the running domain does not have it yet: {', '.join(dict.fromkeys(waiting))} (shut it down and start it)"


def _qm(e: QmEntry, runner: Runner) -> str | None:
    from kvmtune.proxmox import pvesh

    waiting = pvesh.pending(runner, e.vmid)
    keys = sorted(k for k in e.new if k in waiting)
    if not keys:
        return None
    return f"pending: {', '.join(keys)} (qm pending {e.vmid}; applies at the VM's next start)"


def _kubectl(e: KubectlEntry, runner: Runner) -> str | None:
    from kvmtune.kubevirt import kubectl

    if e.shared:
        return ("new revision: at the next restart of each VM that picks it up (a VM keeps the revision it was "
                "started with)")
    if e.obj_kind != "VirtualMachine":
        return None
    vm = kubectl.get_object(runner, e.context, e.obj_kind, e.namespace, e.name)
    if not kubectl.restart_required(vm):
        return None
    return (f"RestartRequired: the running VMI does not have it yet (virtctl restart {e.name} -n "
            f"{e.namespace or 'default'})")


def boot_time(host: HostRoot) -> dt.datetime | None:
    """The host's boot time (``btime`` of ``/proc/stat``); None where it cannot be read."""
    try:
        text = host.read_text("/proc/stat")
    except (OSError, KvmtuneError):
        return None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "btime" and parts[1].isdigit():
            return dt.datetime.fromtimestamp(int(parts[1]), dt.UTC)
    return None


def _host_boot(journal: Journal, host: HostRoot) -> str | None:
    booted = boot_time(host)
    try:
        made = dt.datetime.strptime(journal.created, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return "cannot tell: the journal has no creation time"
    if booted is not None and booted > made:
        return None
    return "read at the host's next boot (not booted since); the runtime values beside it are in force"


def staged(journals: list[Journal], runner: Runner, host: HostRoot) -> list[Staged]:
    """Every made change of ``journals`` that is not in force yet, one :class:`Staged` each."""
    out: list[Staged] = []
    conns: dict[str, Any] = {}
    try:
        for journal in journals:
            if journal.state == "undone":
                continue
            for n, e in enumerate(journal.entries, 1):
                if e.status != "done":
                    continue
                try:
                    why = _one(journal, e, runner, host, conns)
                except KvmtuneError as exc:
                    why = f"cannot tell: {exc}"
                if why is not None:
                    out.append(Staged(journal.id, n, e.what, e.takes_effect or "?", why))
    finally:
        for conn in conns.values():
            with contextlib.suppress(Exception):  # closing a connection that failed: nothing to do
                conn.close()
    return out


def summary(journals: list[Journal], refused: int, runner: Runner, host: HostRoot) -> dict[str, Any]:
    """What ``audit --staged`` adds to its JSON, for the fleet report's staged count per host: how many journaled
    changes are not in force yet, by when they take effect, how many of those could not be told ("cannot tell",
    counted as staged), and how many journals were read and refused."""
    waiting = staged(journals, runner, host)
    by: dict[str, int] = {}
    for s in waiting:
        by[s.takes_effect] = by.get(s.takes_effect, 0) + 1
    return {"changes": len(waiting), "by_takes_effect": by,
            "cannot_tell": sum(1 for s in waiting if s.why.startswith("cannot tell")),
            "journals": len(journals), "refused_journals": refused}


def _one(journal: Journal, e: AnyEntry, runner: Runner, host: HostRoot, conns: dict[str, Any]) -> str | None:
    if isinstance(e, DomainEntry):
        return _domain(e, conns, host)
    if isinstance(e, QmEntry):
        return _qm(e, runner)
    if isinstance(e, KubectlEntry):
        return _kubectl(e, runner)
    if isinstance(e, FileEntry) and e.takes_effect == "host-boot":
        return _host_boot(journal, host)
    return None
