"""``kvmtune fix --live``: the changes libvirt also makes to a running domain, and only those.

A fixer declares a :class:`LivePath` when libvirt has a call that applies its change to the running guest for that
device and attribute. Today one does: the balloon's statistics period (KVM-MEM-013), which libvirt's QEMU driver sets
live (``qemuDomainSetMemoryStatsPeriod``, ``src/qemu/qemu_driver.c``: with ``VIR_DOMAIN_AFFECT_LIVE`` it sets the
balloon's ``guest-stats-polling-interval`` over QMP and records the period in the live definition). The other
fixers' attributes are ones ``virDomainUpdateDeviceFlags`` refuses on a running domain (libvirt's QEMU driver):
a disk's ``cache``, ``io``, ``discard`` and ``iothread`` (``qemuDomainDiskChangeSupported``, ``src/qemu/qemu_domain.c``:
"cannot modify field 'cache' of the disk"); a NIC's model ("cannot modify network device model") and its virtio
driver's ``queues`` ("cannot modify virtio network device driver attributes", ``qemuDomainChangeNet``,
``src/qemu/qemu_hotplug.c``, which changes live only link state, bandwidth, filter and bridge); a controller or
the balloon's model, which have no live update at all. Their changes stay ``restart`` on a running domain.

The definition is changed by the domain's :class:`~kvmtune.fix.plan.XmlEdit` as without ``--live``; the live value
is one more change after it, :class:`LiveSet`, journaled with the running domain's value before and its run id, and
undone live on that same run (``kvmtune undo`` undoes it first, then the definition).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from lxml import etree

from kvmtune.domain.xml import MAX_XML_BYTES, parse_xml_bytes, stats_period
from kvmtune.errors import KvmtuneError
from kvmtune.fix.diff import Reason
from kvmtune.fix.effect import Planned
from kvmtune.fix.entries import LiveEntry
from kvmtune.fix.plan import ApplyContext, ApplyError, Change, UndoConflict, UndoContext

VIRTIO_BALLOONS = frozenset({"virtio", "virtio-transitional", "virtio-non-transitional"})


def _balloon_period(root: etree._Element) -> int | None:
    """The statistics period of a domain's virtio balloon (0: none); None where it has no virtio balloon."""
    for el in root.iterfind("devices/memballoon"):
        if (el.get("model") or "").strip().lower() not in VIRTIO_BALLOONS:
            return None
        stats = el.find("stats")
        return stats_period(stats.get("period")) if stats is not None else 0
    return None


def _set_balloon_period(dom: Any, value: int) -> None:
    from kvmtune.fix.libvirt_rw import set_memory_stats_period

    set_memory_stats_period(dom, value)


@dataclass(frozen=True)
class LivePath:
    """How libvirt changes one setting of a running domain: its journal name, how the plan shows it, how a domain's
    XML states it (None: the domain has no such device, nothing to set), and the call that sets it live."""

    setting: str  # one of entries.LIVE_SETTINGS
    shown: str
    api: str
    read: Callable[[etree._Element], int | None]
    write: Callable[[Any, int], None]


MEMORY_STATS_PERIOD = LivePath(
    "memory-stats-period", "balloon statistics period (s)", "virDomainSetMemoryStatsPeriod, VIR_DOMAIN_AFFECT_LIVE",
    _balloon_period, _set_balloon_period,
)
LIVE_PATHS: dict[str, LivePath] = {p.setting: p for p in (MEMORY_STATS_PERIOD,)}


def read_root(xml: str, where: str) -> etree._Element:
    """A domain XML libvirt answered, read as hostile input (bounded, parsed as any domain XML kvmtune reads)."""
    data = xml.encode("utf-8", "surrogatepass")
    if len(data) > MAX_XML_BYTES:
        raise KvmtuneError(f"{where}: its XML is larger than {MAX_XML_BYTES // 2**20} MiB")
    return parse_xml_bytes(data, where).getroot()


@dataclass
class LiveSet(Change[LiveEntry]):
    """One setting of a running libvirt domain set live (``fix --live``), after its definition was changed."""

    kind: ClassVar[str] = "live"
    uri: str
    name: str
    uuid: str
    path: LivePath
    prior: int  # the running domain's value when the plan was made
    new: int
    rules: tuple[str, ...] = ()  # the rules whose change this is
    reasons: list[Reason] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    planned: list[Planned] = field(default_factory=list)

    def title(self) -> str:
        return f"domain {self.name} ({self.uri}): set its {self.path.shown} live"

    def render(self) -> str:
        why = "".join(f"# {r.text}\n" for r in self.reasons)
        return f"{why}{self.uri}#{self.name} (running): {self.path.shown}: {self.prior} → {self.new} ({self.path.api})\n"

    def _running(self, ctx: ApplyContext) -> Any:
        from kvmtune.fix.libvirt_rw import lookup_uuid

        dom = lookup_uuid(ctx.libvirt(self.uri), self.uuid, self.uri)
        if not dom.isActive():
            raise ApplyError(f"domain {self.name} is not running any more; run kvmtune fix again")
        return dom

    def snapshot(self, ctx: ApplyContext) -> LiveEntry:
        from kvmtune.fix.libvirt_rw import live_xml, run_id

        dom = self._running(ctx)
        now = self.path.read(read_root(live_xml(dom), f"{self.uri}#{self.name} (live)"))
        if now != self.prior:
            raise ApplyError(f"domain {self.name}: its running {self.path.shown} changed since the plan was made "
                             f"({self.prior} → {now}); run kvmtune fix again")
        return LiveEntry(what=self.title(), uri=self.uri, name=self.name, uuid=self.uuid, setting=self.path.setting,
                         prior=self.prior, new=self.new, domain_id=run_id(dom))

    def apply(self, entry: LiveEntry, ctx: ApplyContext) -> None:
        from kvmtune.fix.libvirt_rw import live_xml, run_id

        dom = self._running(ctx)
        if run_id(dom) != entry.domain_id:
            raise ApplyError(f"domain {self.name} was restarted since the plan was made; run kvmtune fix again")
        self.path.write(dom, self.new)
        now = self.path.read(read_root(live_xml(dom), f"{self.uri}#{self.name} (live)"))
        if now != self.new:
            raise ApplyError(f"domain {self.name}: set its {self.path.shown} to {self.new} but it reads {now}")

    @staticmethod
    def undo(e: LiveEntry, ctx: UndoContext) -> None:
        from kvmtune.fix.libvirt_rw import live_xml, lookup_uuid, run_id

        path = LIVE_PATHS[e.setting]
        dom = lookup_uuid(ctx.libvirt(e.uri), e.uuid, e.uri)
        if dom.name() != e.name:  # a running domain keeps its name (libvirt renames only inactive ones)
            raise KvmtuneError(f"domain {e.name}: the journal's UUID {e.uuid} is domain {dom.name()}'s; its live "
                               f"{path.shown} is not touched")
        if not dom.isActive():
            ctx.done.append(f"domain {e.name}: not running; its live {path.shown} went with that run")
            return
        if run_id(dom) != e.domain_id:
            ctx.done.append(f"domain {e.name}: started again since; it runs with its definition's {path.shown}")
            return
        where = f"{e.uri}#{e.name} (live)"
        now = path.read(read_root(live_xml(dom), where))
        if now == e.prior:
            ctx.done.append(f"domain {e.name}: live {path.shown} already {e.prior}")
            return
        if e.status == "done" and now != e.new and not ctx.force:
            raise UndoConflict(f"domain {e.name}: its live {path.shown} is {now}, not the {e.new} kvmtune set; "
                               "not restored (--force)")
        path.write(dom, e.prior)
        back = path.read(read_root(live_xml(dom), where))
        if back != e.prior:
            raise KvmtuneError(f"domain {e.name}: set its live {path.shown} back to {e.prior} but it reads {back}")
        ctx.done.append(f"domain {e.name}: live {path.shown} {now} → {e.prior}")


def live_changes(dom: Any, uri: str, after: bytes, fixed: list[tuple[Any, str, str]]) -> tuple[list[LiveSet], set[str],
                                                                                               list[str]]:
    """For a running domain whose definition becomes ``after``: one :class:`LiveSet` per live path of the fixers
    that changed it (``fixed``: (fixer's live path or None, rule, what it said)), the rules whose change is then
    in force on the running guest, and a line for each live path that cannot be used on it."""
    from kvmtune.fix.libvirt_rw import live_xml

    name = dom.name()
    paths: dict[str, tuple[LivePath, list[str], list[str]]] = {}
    for path, rule, said in fixed:
        if path is None:
            continue
        entry = paths.setdefault(path.setting, (path, [], []))
        entry[1].append(rule)
        entry[2].append(said)
    if not paths:
        return [], set(), []
    live_root = read_root(live_xml(dom), f"{uri}#{name} (live)")
    new_root = read_root(after.decode("utf-8"), f"{uri}#{name} (new definition)")
    out: list[LiveSet] = []
    rules: set[str] = set()
    skipped: list[str] = []
    for path, its_rules, saids in paths.values():
        now, new = path.read(live_root), path.read(new_root)
        if now is None or new is None:
            skipped.append(f"{name}: {', '.join(its_rules)}: not set live: the running domain has no device for its "
                           f"{path.shown}; applies at its next start")
            continue
        rules.update(its_rules)
        if now != new:
            out.append(LiveSet(uri=uri, name=name, uuid=dom.UUIDString(), path=path, prior=now, new=new,
                               rules=tuple(its_rules),
                               reasons=[Reason(f"{r}: {s}", ()) for r, s in zip(its_rules, saids, strict=True)],
                               notes=[f"the running guest, now, through {path.api}; undo sets it back live"]))
    return out, rules, skipped
