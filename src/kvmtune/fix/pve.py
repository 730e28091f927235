"""Fixing Proxmox VE guests: the ``qm set`` changes of their findings.

In a captured tree (``fix --root TREE``, PVE not running there) the ``.conf`` file is rewritten atomically
through the journal (a :class:`PveConfEdit`, a :class:`FileChange`), so ``undo`` puts back its bytes.

On a running node (``/`` with PVE's ``qm``), each VM's changes are one ``qm set`` (a :class:`QmSet`): PVE
validates it, takes its config lock, refuses it if the config changed since the plan (``--digest``) and keeps
what it cannot hotplug on a running VM as pending until its next start. Each VM's values and digest are read
from PVE's API as JSON (``pvesh get …/config``, :mod:`kvmtune.proxmox.pvesh`). The journal records the changed keys'
values as the API showed them before, and ``undo`` sets them back with ``qm set`` (``--revert`` where the
change is still only pending): the same values, in the form PVE writes its files, not the same bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from kvmtune.audit.context import AuditContext
from kvmtune.audit.finding import Finding
from kvmtune.audit.pve_advice import Keep, converge
from kvmtune.audit.rule import Rule
from kvmtune.errors import KvmtuneError
from kvmtune.fix.diff import Reason, unified
from kvmtune.fix.effect import Planned, latest, pve_hotplug, pve_key
from kvmtune.fix.entries import QmEntry
from kvmtune.fix.files import read_state
from kvmtune.fix.plan import ApplyContext, ApplyError, Change, FileChange, Plan, UndoConflict, UndoContext
from kvmtune.fix.registry import FixOptions
from kvmtune.host.root import HostRoot
from kvmtune.model.guest import Guest
from kvmtune.proxmox import pvesh, qm
from kvmtune.proxmox.config import DISK_KEY, PveConfig, drive_props
from kvmtune.proxmox.guest import config_of
from kvmtune.proxmox.load import host_storages, read_config_text, read_host
from kvmtune.proxmox.qmset import QmChange, drive_refusal, new_values, qm_set_line
from kvmtune.runner import Runner, default_runner

PENDING_NOTE = "the VM runs: PVE keeps what it cannot hotplug as pending until the VM's next start ('qm pending {}')"


@dataclass
class PveConfEdit(FileChange):
    """A Proxmox VE VM config rewritten in place (atomically), as ``qm set`` would change it."""

    guest: str = ""

    def title(self) -> str:
        return f"Proxmox VE {self.guest}: rewrite {self.shown}"


@dataclass
class QmSet(Change[QmEntry]):
    """One VM's changes on a running Proxmox VE node, made by ``qm set`` and undone by it."""

    kind: ClassVar[str] = "qm"
    vmid: str
    guest: str
    digest: str
    before: dict[str, str]  # the API's config (pending applied)
    current: dict[str, str]  # the API's config --current 1
    values: dict[str, str | None]  # the keys qm set changes (None: --delete)
    text_before: str
    text_after: str
    running: bool
    reasons: list[Reason] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    planned: list[Planned] = field(default_factory=list)

    def title(self) -> str:
        return f"Proxmox VE {self.guest}: qm set"

    def argv(self, *, digest: bool = True) -> list[str]:
        return qm.set_argv(self.vmid, self.values, digest=self.digest if digest else None)

    def render(self) -> str:
        label = f"VM {self.vmid} config"
        return (f"$ {qm.shell_line(self.argv(digest=False))}\n"
                + unified(self.text_before, self.text_after, label, label + " (after qm set)", self.reasons))

    def snapshot(self, ctx: ApplyContext) -> QmEntry:
        try:
            now = pvesh.config(ctx.runner, self.vmid)
        except qm.QmError as exc:
            raise ApplyError(str(exc)) from None
        if now.digest != self.digest:
            raise ApplyError(f"VM {self.vmid}: its config changed since the plan was made; run kvmtune fix again")
        return QmEntry(what=self.title(), vmid=self.vmid, guest=self.guest, digest=self.digest,
                       prior={k: self.before.get(k) for k in self.values},
                       prior_current={k: self.current.get(k) for k in self.values}, new=dict(self.values))

    def apply(self, entry: QmEntry, ctx: ApplyContext) -> None:
        try:
            qm.run_set(ctx.runner, self.argv())
            after = pvesh.config(ctx.runner, self.vmid)
            now = pvesh.config(ctx.runner, self.vmid, current=True)
        except qm.QmError as exc:
            raise ApplyError(str(exc)) from None
        wrong = [k for k, v in self.values.items() if not qm.same_value(after.values.get(k), v)]
        if wrong:
            raise ApplyError(f"VM {self.vmid}: qm set ran, but its config shows other values for {', '.join(wrong)}")
        entry.pending = [k for k, v in self.values.items() if not qm.same_value(now.values.get(k), v)]
        if entry.pending and entry.takes_effect == "live":
            entry.takes_effect = "restart"  # PVE's word over the plan's: what it kept pending waits for a restart

    @staticmethod
    def undo(e: QmEntry, ctx: UndoContext) -> None:
        try:
            after = pvesh.config(ctx.runner, e.vmid)
            now = pvesh.config(ctx.runner, e.vmid, current=True)
        except qm.QmError as exc:
            raise KvmtuneError(str(exc)) from None
        _check_moved_volumes(e, after)
        todo = [k for k in e.new if not qm.same_value(after.values.get(k), e.prior.get(k))]
        if not todo:
            ctx.done.append(f"Proxmox VE VM {e.vmid}: already as before")
            return
        changed = [k for k in todo if not qm.same_value(after.values.get(k), e.new.get(k))]
        if e.status == "done" and changed and not ctx.force:
            raise UndoConflict(f"Proxmox VE VM {e.vmid}: {', '.join(changed)} changed after kvmtune set them; "
                               "not restored (--force)")
        # a change still only pending, where nothing was pending before: dropping it restores exactly
        revert = [k for k in todo if qm.same_value(now.values.get(k), e.prior_current.get(k))
                  and qm.same_value(e.prior.get(k), e.prior_current.get(k))]
        values = {k: e.prior.get(k) for k in todo if k not in revert}
        try:
            qm.run_set(ctx.runner, qm.set_argv(e.vmid, values, revert=revert))
            back = pvesh.config(ctx.runner, e.vmid)
        except qm.QmError as exc:
            raise KvmtuneError(str(exc)) from None
        wrong = [k for k in e.new if not qm.same_value(back.values.get(k), e.prior.get(k))]
        if wrong:
            raise KvmtuneError(f"Proxmox VE VM {e.vmid}: qm set ran, but {', '.join(wrong)} differ from the journal")
        ctx.done.append(f"Proxmox VE VM {e.vmid}: {', '.join(sorted(e.new))} as its config showed them before")


def _check_moved_volumes(e: QmEntry, now: qm.QmConfig) -> None:
    """Undoing a bus change re-attaches a volume under its old key: only one the VM holds now (under any disk key),
    never one a journal names that the VM no longer has, even with --force."""
    attached = {drive_props(v)[0] for k, v in now.values.items() if DISK_KEY.match(k)}
    for key, value in e.prior.items():
        if value is not None and DISK_KEY.match(key) and key in e.new and e.new[key] is None:
            volume = drive_props(value)[0]
            if volume not in attached:
                raise KvmtuneError(f"Proxmox VE VM {e.vmid}: {key}'s volume {volume} is no longer attached to the "
                                   "VM; not re-attached")


def has_pve(root: str, runner: Runner | None = None) -> bool:
    """A tree with PVE's ``/etc/pve``, or this host with it or with PVE's ``qm``."""
    host = HostRoot(root)
    if host.is_dir("/etc/pve"):
        return True
    return host.is_live and (runner or default_runner()).which(qm.QM) is not None


def _keep(guest: Guest, options: FixOptions, plan: Plan, *, running: bool) -> Keep:
    """Which findings' changes ``fix`` makes (the others said in ``plan.skipped``, once each)."""
    def skip(line: str) -> bool:
        if line not in plan.skipped:
            plan.skipped.append(line)
        return False

    def keep(finding: Finding, one: QmChange, cfg: PveConfig) -> bool:
        where = f"{guest.name} {finding.target.device or ''}: {finding.rule}"
        if one.refused:
            return skip(f"{where}: {one.refused}")
        if one.moves and running:
            moved = ", ".join(f"{old} → {new}" for old, new in one.moves.items())
            return skip(f"{where} ({moved}) needs the VM stopped: on a running VM PVE would hot-plug the volume a "
                        f"second time (qm shutdown {cfg.vmid}, then kvmtune fix again)")
        refusal = drive_refusal(cfg, one, options.pve_volumes)
        if refusal:
            return skip(f"{where}: {refusal}")
        if one.cpu_change and not options.allow_cpu_change:
            return skip(f"{where} changes the guest's CPU model (--allow-cpu-change)")
        if one.guest_visible and not options.allow_bus_change:
            return skip(f"{where} changes what the guest sees (--allow-bus-change)")
        return True
    return keep


def _converge(guest: Guest, cfg: PveConfig, text: str, ctx: AuditContext, rules: Sequence[type[Rule]],
              options: FixOptions, plan: Plan, *, running: bool = False, runs: bool | None = None
              ) -> tuple[QmChange, list[Reason], str, list[Planned]]:
    """One VM's change until nothing new turns up (audit/pve_advice.converge), and why: each finding with the
    config lines it changes, and when each takes effect (the VM running or not, its ``hotplug``; ``runs``: as if it
    ran, where that is unknown)."""
    done = converge(guest, cfg, text, ctx, rules, _keep(guest, options, plan, running=running))
    hotplug = pve_hotplug(cfg.current.get("hotplug"))
    reasons: list[Reason] = []
    planned: list[Planned] = []
    for finding, one, at in done.taken:
        keys = [*one.values, *one.props]
        lines = tuple(n for k in keys if (n := at.lines.get(k)))
        reason = Reason(f"{finding.rule} {finding.slug}", lines)
        if reason not in reasons:
            reasons.append(reason)
        when = latest(pve_key(k, running=running if runs is None else runs, hotplug=hotplug, moves=bool(one.moves)) for k in keys)
        planned.append(Planned(guest.name, finding.rule, finding.target.device or ", ".join(keys) or guest.name,
                               f"{finding.slug}: {', '.join(keys)}", when))
    return done.change, reasons, done.text, planned


def plan_pve(root: str, rules: Sequence[type[Rule]], options: FixOptions, plan: Plan,
             runner: Runner | None = None) -> None:
    host = HostRoot(root)
    if host.is_live:
        runner = runner or default_runner()
        if runner.which(qm.QM) is None:
            plan.notes.append("this host has /etc/pve but no 'qm': make the changes with the 'qm set' lines "
                              "'kvmtune audit' prints")
            return
        plan_qm(host, runner, rules, options, plan)
        return
    read = read_host(host)
    plan.skipped.extend(read.errors)
    ctx = AuditContext(host=host)
    for guest in read.guests:
        cfg = config_of(guest)
        if cfg is None:
            continue
        path = Path(cfg.path)
        before = read_state(path)
        text = (before.data or b"").decode("utf-8")
        # a tree says nothing of whether the VM runs: planned as if it did (the later of the two)
        change, reasons, after_text, planned = _converge(guest, cfg, text, ctx, rules, options, plan, runs=True)
        after = after_text.encode("utf-8")
        if after == before.data:
            continue
        plan.changes.append(PveConfEdit(path=path, shown=cfg.path, before=before, after=after, reasons=reasons,
                                        guest=guest.name, planned=planned))
        plan.notes.extend(f"{guest.name}: {n}" for n in change.notes)
        when = "with the VM stopped" if change.moves else "pending until the VM's next start"
        plan.notes.append(f"{guest.name}: on a running node the same change is: {qm_set_line(cfg, change)} ({when})")


def plan_qm(host: HostRoot, runner: Runner, rules: Sequence[type[Rule]], options: FixOptions, plan: Plan) -> None:
    """This node's VMs (``qm list``), each read from the API (``pvesh``): one :class:`QmSet` per VM with changes."""
    try:
        vms = qm.list_vms(runner)
    except qm.QmError as exc:
        plan.skipped.append(str(exc))
        return
    storages = host_storages(host)
    ctx = AuditContext(host=host, runner=runner)
    for vm in vms:
        try:
            pending = pvesh.config(runner, vm.vmid)
            current = pvesh.config(runner, vm.vmid, current=True)
            # what the VM gets at its next start: a qm set on a running VM replaces the pending value, so the
            # change starts from it, never from the running value under it
            text = pending.as_config_text()
            guest, cfg, _notes = read_config_text(text, f"{vm.vmid}.conf", storages)
        except KvmtuneError as exc:
            plan.skipped.append(f"VM {vm.vmid}: {exc}")
            continue
        cfg.path = f"VM {vm.vmid} config"
        plan.notes.extend(n.replace(f"{vm.vmid}.conf:", f"{cfg.path}, line ", 1) for n in cfg.notes)
        guest.on_audited_host = guest.images_here = True
        change, reasons, after, planned = _converge(guest, cfg, text, ctx, rules, options, plan, running=vm.running)
        values = new_values(cfg, change)
        values = {k: v for k, v in values.items() if not qm.same_value(pending.values.get(k), v)}
        if not values:
            continue
        notes = [PENDING_NOTE.format(vm.vmid)] if vm.running else []
        notes += change.notes
        waiting = sorted(k for k in {*pending.values, *current.values}
                         if k != "description" and pending.values.get(k) != current.values.get(k))
        if waiting:
            notes.append(f"already pending before this change: {', '.join(waiting)}")
        plan.changes.append(QmSet(vmid=vm.vmid, guest=guest.name, digest=pending.digest, before=pending.values,
                                  current=current.values, values=values, text_before=text, text_after=after,
                                  running=vm.running, reasons=reasons, notes=notes, planned=planned))
