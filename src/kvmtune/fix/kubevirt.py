"""Fixing KubeVirt guests: in their manifests (``fix FILE|DIR``), or in a cluster (``fix --kubevirt``).

Each finding whose rule declares a settable KubeVirt form (:mod:`kvmtune.kubevirt.form`) asks for one value at one
path of one object: the VirtualMachine's, or, where the VM takes that value from its instancetype or preference,
that object's (KubeVirt refuses a VM that sets what its instancetype sets; a preference's value is the default of
every VM that uses it). The plan names the VMs that share such an object. Values are set, the objects read again
and audited again until a round adds nothing (a disk moved to virtio then asks for IOThreads); a finding an edit
did not remove is said.

Manifests are edited surgically (:mod:`kvmtune.kubevirt.edit`: every byte outside the edited value kept) and
written as any fixed file is (a :class:`ManifestEdit`, a :class:`FileChange`: compared with the bytes the plan was
made from, replaced atomically, never through a link, prior bytes journaled, ``undo`` byte-exact).

In a cluster each object's values are one ``kubectl patch --type merge`` (a :class:`KubectlPatch`) carrying the
``metadata.resourceVersion`` it was read at, so the API server refuses it (Conflict) if the object changed since;
the journal keeps the patch and its reverse (the prior values, ``null`` where a field was absent), which ``undo``
sends, again guarded by the resourceVersion read just before. A VM's spec change takes effect at its next restart
under KubeVirt's default rollout strategy (``Stage``: the VM's ``RestartRequired`` condition, read back after the
patch); none of the fields kvmtune sets is one ``LiveUpdate`` propagates (CPU sockets, memory guest, affinity,
volumes), so a change is ``restart`` under either strategy, ``live`` only for a VM that does not run.
"""

from __future__ import annotations

import copy
import errno
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any, ClassVar

from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import run_rules
from kvmtune.audit.finding import Finding
from kvmtune.audit.kubevirt_advice import device_index, owner_of
from kvmtune.audit.rule import GuestRule, Rule, all_rules
from kvmtune.audit.waivers import live_waiver
from kvmtune.errors import InputError, KvmtuneError
from kvmtune.fix.diff import Reason
from kvmtune.fix.effect import Planned, TakesEffect
from kvmtune.fix.entries import KubectlEntry
from kvmtune.fix.files import FileState, read_state, read_state_and_dir
from kvmtune.fix.plan import ApplyContext, ApplyError, Change, FileChange, Plan, UndoConflict, UndoContext
from kvmtune.fix.registry import FixOptions
from kvmtune.inputs import open_beneath
from kvmtune.kubevirt import kubectl
from kvmtune.kubevirt.edit import EditRefused, edit_bytes, get_in, parts_of, set_in
from kvmtune.kubevirt.form import KubevirtForm
from kvmtune.kubevirt.guest import Spec, guests_from_objects, spec_of
from kvmtune.kubevirt.load import KObject, read_bytes, read_paths
from kvmtune.model.guest import Guest
from kvmtune.runner import Runner, default_runner
from kvmtune.textsafe import safe

MAX_ROUNDS = 5
NEW_REVISION = "new revision: at the next restart of each VM that picks it up"
RESTART_NOTE = ("a VirtualMachine's spec change takes effect at its next restart (KubeVirt's default rollout "
                "strategy Stage marks it RestartRequired)")


@dataclass
class Want:
    """One value one finding asks for: the object it is set in, the path in that object, the value."""

    obj: KObject
    path: str  # relative to the object (spec.template.spec.domain.ioThreadsPolicy)
    value: Any
    finding: Finding
    guest: str
    shared: bool = False  # an instancetype or a preference

    @property
    def doc_path(self) -> str:
        """The path in the document (a ``kind: List``'s item is under ``items[N]``)."""
        prefix = self.obj.doc.prefix
        return f"{prefix}.{self.path}" if prefix else self.path

    @property
    def key(self) -> tuple[str, int, str]:
        return (self.obj.doc.path, self.obj.doc.number, self.doc_path)

    def planned(self, takes_effect: TakesEffect) -> Planned:
        f = self.finding
        return Planned(self.guest, f.rule, f.target.device or self.path, f"{f.slug}: {self.path} = "
                       f"{json.dumps(self.value)}", takes_effect)


def _forms() -> dict[str, KubevirtForm]:
    return {r.id: r.kubevirt for r in all_rules() if r.kubevirt is not None}


def want_for(finding: Finding, guest: Guest, form: KubevirtForm, options: FixOptions) -> Want | str | None:
    """What ``finding`` asks to be set; a string says why it is left alone; ``None``: advice only."""
    spec = spec_of(guest)
    if spec is None or not form.settable:
        return None
    value = form.value_for(spec, guest)
    if value is None:
        return None
    where = f"{guest.name} {finding.target.device or ''}: {finding.rule}".replace(" :", ":")
    if options.use_waivers and finding.rule not in options.named_rules:
        waiver = live_waiver(finding, options.waivers, guest, date.today())
        if waiver is not None:
            return (f"{where}: not fixed: waived ({waiver.reason}; {waiver.origin}); name the rule (--only "
                    f"{finding.rule}) to fix it anyway")
    if form.guest_visible and not options.allow_bus_change:
        return f"{where} changes what the guest sees (--allow-bus-change)"
    owner = owner_of(finding, spec, form)
    if owner is not None:
        return Want(owner[0], owner[1], value, finding, guest.name, shared=True)
    if form.instancetype and _has_matcher(spec, "instancetype"):
        return (f"{where}: the VM takes this from an instancetype that was not given; the fix belongs there "
                f"(spec.{form.instancetype})")
    disk, nic = device_index(finding.target.device, guest)
    path = form.path(spec.base, disk, nic)
    if path is None:
        return None
    if form.field and form.field.endswith(".disk.bus") and disk is not None:
        written = guest.disks[disk].evidence.get("bus", "").split(" (", 1)[0]
        if written.startswith(spec.base):  # a lun or cdrom entry has its bus under that key
            path = written
    return Want(spec.obj, path, value, finding, guest.name)


def _has_matcher(spec: Spec, which: str) -> bool:
    body = spec.obj.body.get("spec")
    if spec.obj.kind == "VirtualMachinePool" and isinstance(body, dict):
        tpl = body.get("virtualMachineTemplate")
        body = tpl.get("spec") if isinstance(tpl, dict) else None
    return isinstance(body, dict) and isinstance(body.get(which), dict)


def _users(obj: KObject, guests: Sequence[Guest]) -> list[str]:
    out = []
    for g in guests:
        spec = spec_of(g)
        if spec is not None and obj.key in {o.key for o in (spec.instancetype, spec.preference) if o is not None}:
            out.append(safe(g.name))
    return out


def _guest_rules(rules: Sequence[type[Rule]]) -> list[type[Rule]]:
    return [r for r in rules if issubclass(r, GuestRule)]


def _advice_of(form: KubevirtForm | None) -> str:
    if form is None:
        return "its rule has no KubeVirt form; 'kvmtune audit' says what to change"
    if form.field is None:
        return form.note
    return f"no value kvmtune can set: {form.value}"


def _shown(obj: KObject) -> str:
    """How the plan names an object (its kind, namespace and name are the manifest's: made terminal-safe)."""
    return safe(f"{obj.kind} {(obj.namespace + '/') if obj.namespace else ''}{obj.name}")


# --------------------------------------------------------------------------- manifests


@dataclass
class ManifestEdit(FileChange):
    """A KubeVirt manifest edited in place: values set, every other byte kept; replaced atomically."""

    objects: list[str] = field(default_factory=list)

    def title(self) -> str:
        return f"KubeVirt {', '.join(self.objects)}: edit {safe(self.shown)}"


@dataclass
class _Round:
    """The converging edit of a set of manifests."""

    texts: dict[str, bytes]
    extra: list[KObject]  # objects of files that are not edited (links, unreadable): still resolved against
    done: dict[tuple[str, int, str], Any] = field(default_factory=dict)
    wants: list[Want] = field(default_factory=list)
    refused: set[tuple[str, int, str]] = field(default_factory=set)

    def objects(self) -> list[KObject]:
        out = list(self.extra)
        for path, data in self.texts.items():
            out.extend(read_bytes(path, data))
        return out


def plan_manifests(paths: Sequence[str], recursive: bool, rules: Sequence[type[Rule]], options: FixOptions,
                   plan: Plan) -> None:
    """One :class:`ManifestEdit` per manifest file whose objects' findings have a value to set."""
    read = read_paths(list(paths), recursive)
    plan.skipped.extend(read.errors)
    plan.refused.extend(read.errors)
    plan.notes.extend(read.notes)
    states: dict[str, FileState] = {}
    dirs: dict[str, tuple[int, int] | None] = {}
    extra: list[KObject] = []
    tops = [p for p in paths if os.path.isdir(p)]
    for obj in read.objects:
        f = obj.doc.path
        if f in states or any(o.doc.path == f for o in extra):
            continue
        try:
            state, dirs[f] = _read_below(f, tops)
        except OSError as exc:
            plan.skipped.append(f"{f}: {exc}; not edited")
            plan.refused.append(f"{f}: {exc}")
            extra.extend(o for o in read.objects if o.doc.path == f)
            continue
        if state.data is None:
            plan.skipped.append(f"{f}: gone since it was read; not edited")
            continue
        states[f] = state
    state_round = _Round({f: s.data or b"" for f, s in states.items()}, extra)
    chosen = _guest_rules(rules)
    forms = _forms()
    ctx = AuditContext(host=options.host)
    guests: list[Guest] = []
    advice: set[tuple[str, str, str]] = set()
    last: list[Finding] = []
    for _ in range(MAX_ROUNDS):
        try:
            objects = state_round.objects()
        except InputError as exc:  # an edit left a file kvmtune cannot read: never expected, never written
            plan.skipped.append(f"{exc}; no manifest edited")
            return
        guests, _notes = guests_from_objects(objects)
        last = run_rules(ctx, guests, rules=chosen)
        if not _edit_round(state_round, last, guests, forms, options, plan, advice):
            break
    left = {w.key for w in state_round.wants}
    by_name = {g.name: g for g in guests}
    for finding in last:
        guest = by_name.get(finding.target.domain or "")
        form = forms.get(finding.rule)
        want = want_for(finding, guest, form, options) if guest is not None and form is not None else None
        if isinstance(want, Want) and want.key in left and want.key not in state_round.refused:
            plan.skipped.append(f"{want.guest}: {finding.rule}: setting {want.path} did not remove the finding")
    plan.manual += len(advice)
    plan.notes.extend(sorted(f"{g}: {r} is advice only ({why})" for g, r, why in advice))
    _manifest_changes(state_round, states, dirs, guests, plan)


def _read_below(f: str, tops: list[str]) -> tuple[FileState, tuple[int, int] | None]:
    """``f`` as :func:`read_state_and_dir` reads it; a file found in the walk of a named directory is reached from that
    directory's descriptor with no symbolic link on the way (``open_beneath``): another user's link in a tree must not
    choose which files elsewhere root rewrites (read for the plan, never edited)."""
    d = os.path.dirname(f)
    for top in tops:
        rel = os.path.relpath(d, top)
        if rel == os.pardir or rel.startswith(os.pardir + os.sep):
            continue
        top_fd = os.open(top, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            dir_fd = open_beneath(top_fd, rel, os.O_PATH | os.O_DIRECTORY)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EXDEV, errno.ENOTDIR):
                raise OSError(f"reached through a symbolic link below {top}; read, never written through") from None
            raise
        finally:
            os.close(top_fd)
        try:
            st = os.fstat(dir_fd)
            return read_state(Path(os.path.abspath(f)), dir_fd=dir_fd), (st.st_dev, st.st_ino)
        finally:
            os.close(dir_fd)
    return read_state_and_dir(Path(os.path.abspath(f)))


def _triage(finding: Finding, guest: Guest, forms: dict[str, KubevirtForm], options: FixOptions, plan: Plan,
            advice: set[tuple[str, str, str]]) -> Want | None:
    """What a finding asks to set, or None: advice only (noted in ``advice``) or skipped (why in ``plan.skipped``)."""
    form = forms.get(finding.rule)
    want = want_for(finding, guest, form, options) if form is not None else None
    if want is None:
        advice.add((guest.name, finding.rule, _advice_of(form)))
        return None
    if isinstance(want, str):
        if want not in plan.skipped:
            plan.skipped.append(want)
        return None
    return want


def _edit_round(state: _Round, findings: list[Finding], guests: list[Guest], forms: dict[str, KubevirtForm],
                options: FixOptions, plan: Plan, advice: set[tuple[str, str, str]]) -> bool:
    by_name = {g.name: g for g in guests}
    new = False
    for finding in findings:
        guest = by_name.get(finding.target.domain or "")
        if guest is None or spec_of(guest) is None:
            continue
        want = _triage(finding, guest, forms, options, plan, advice)
        if want is None:
            continue
        if want.key in state.refused:
            continue
        if want.key in state.done:
            if state.done[want.key] == want.value and not any(
                    w.key == want.key and w.finding.rule == finding.rule and w.guest == want.guest
                    and w.finding.target.device == finding.target.device for w in state.wants):
                state.wants.append(want)  # a second finding the same value answers
            continue
        f = want.obj.doc.path
        if f not in state.texts:
            plan.skipped.append(f"{want.guest}: {finding.rule}: {f} is not edited (see above)")
            state.refused.add(want.key)
            continue
        try:
            state.texts[f] = edit_bytes(f, state.texts[f], [(want.obj.doc.number, want.doc_path, want.value)])
        except EditRefused as exc:
            plan.skipped.append(f"{want.guest}: {finding.rule}: {exc}")
            plan.refused.append(str(exc))
            state.refused.add(want.key)
            continue
        state.done[want.key] = want.value
        state.wants.append(want)
        new = True
    return new


def _manifest_changes(state: _Round, states: dict[str, FileState], dirs: dict[str, tuple[int, int] | None],
                      guests: list[Guest], plan: Plan) -> None:
    for f, before in states.items():
        after = state.texts[f]
        if after == before.data:
            continue
        wants = [w for w in state.wants if w.obj.doc.path == f]
        reasons: list[Reason] = []
        notes: list[str] = []
        planned: list[Planned] = []
        objects: list[str] = []
        for w in wants:
            reason = Reason(f"{w.finding.rule} {w.finding.slug}: {safe(w.guest)}")
            if reason not in reasons:
                reasons.append(reason)
            name = _shown(w.obj)
            if name not in objects:
                objects.append(name)
            planned.append(w.planned("restart"))
            if w.shared:
                users = _users(w.obj, guests)
                note = f"{name} is used by {', '.join(users) or 'no VM given'}: {NEW_REVISION}"
                if note not in notes:
                    notes.append(note)
        if any(not w.shared for w in wants):
            notes.append(RESTART_NOTE)
        plan.changes.append(ManifestEdit(path=Path(os.path.abspath(f)), shown=f, before=before, after=after,
                                         reasons=reasons, notes=notes, planned=planned, objects=objects,
                                         dir_id=dirs.get(f)))


# --------------------------------------------------------------------------- a cluster


def merge_patch(old: Any, new: Any) -> dict[str, Any]:
    """The RFC 7386 merge patch that turns ``old`` into ``new`` (mappings; a list is replaced whole)."""
    out: dict[str, Any] = {}
    for k in old:
        if k not in new:
            out[k] = None
    for k, v in new.items():
        if k not in old:
            out[k] = copy.deepcopy(v)
        elif old[k] != v:
            out[k] = merge_patch(old[k], v) if isinstance(old[k], dict) and isinstance(v, dict) else copy.deepcopy(v)
    return out


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386's MergePatch(target, patch)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = apply_merge_patch(out.get(k), v)
    return out


@dataclass
class KubectlPatch(Change[KubectlEntry]):
    """One object's values set in a cluster by ``kubectl patch --type merge``, guarded by its resourceVersion."""

    kind: ClassVar[str] = "kubectl"
    context: str | None
    obj_kind: str
    namespace: str | None
    name: str
    resource_version: str
    spec_patch: dict[str, Any]  # the merge patch, without metadata.resourceVersion
    reverse: dict[str, Any]
    shared: bool = False
    reasons: list[Reason] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    planned: list[Planned] = field(default_factory=list)

    def title(self) -> str:
        return safe(f"KubeVirt {self.obj_kind} {(self.namespace + '/') if self.namespace else ''}{self.name}: kubectl patch")

    def patch(self) -> dict[str, Any]:
        out = copy.deepcopy(self.spec_patch)
        out.setdefault("metadata", {})["resourceVersion"] = self.resource_version
        return out

    def argv(self) -> list[str]:
        return kubectl.patch_argv(self.context, self.obj_kind, self.namespace, self.name, self.patch())

    def render(self) -> str:
        why = "".join(f"# {r.text}\n" for r in self.reasons)
        return f"{why}$ {kubectl.shell_line(self.argv())}\n# undo sends: {json.dumps(self.reverse, sort_keys=True)}\n"

    def snapshot(self, ctx: ApplyContext) -> KubectlEntry:
        try:
            now = kubectl.get_object(ctx.runner, self.context, self.obj_kind, self.namespace, self.name)
        except KvmtuneError as exc:
            raise ApplyError(str(exc)) from None
        if kubectl.resource_version(now) != self.resource_version:
            raise ApplyError(f"{self.title()}: changed since the plan was made (resourceVersion "
                             f"{self.resource_version} → {kubectl.resource_version(now)}); run kvmtune fix again")
        return KubectlEntry(what=self.title(), context=self.context, obj_kind=self.obj_kind, namespace=self.namespace,
                            name=self.name, prior_version=self.resource_version, patch=self.spec_patch,
                            reverse=self.reverse, shared=self.shared)

    def apply(self, entry: KubectlEntry, ctx: ApplyContext) -> None:
        try:
            kubectl.run_patch(ctx.runner, self.argv())
            after = kubectl.get_object(ctx.runner, self.context, self.obj_kind, self.namespace, self.name)
        except KvmtuneError as exc:
            raise ApplyError(str(exc)) from None
        if not _holds(after, self.spec_patch):
            raise ApplyError(f"{self.title()}: kubectl patch ran, but the object shows other values")
        entry.after_version = kubectl.resource_version(after)
        if self.obj_kind == "VirtualMachine":
            entry.restart_required = kubectl.restart_required(after)
            if not entry.restart_required and not kubectl.runs(after):
                # read back: a VM with no VMI starts with the change, nothing is staged
                entry.takes_effect = "live"
                entry.planned = [Planned(q.guest, q.rule, q.target, q.what, "live") for q in entry.planned]

    @staticmethod
    def undo(e: KubectlEntry, ctx: UndoContext) -> None:
        try:
            now = kubectl.get_object(ctx.runner, e.context, e.obj_kind, e.namespace, e.name)
        except KvmtuneError as exc:
            raise KvmtuneError(str(exc)) from None
        label = f"KubeVirt {e.obj_kind} {(e.namespace + '/') if e.namespace else ''}{e.name}"
        if _holds(now, e.reverse):
            ctx.done.append(f"{label}: already as before")
            return
        if e.status == "done" and not _holds(now, e.patch) and not ctx.force:
            raise UndoConflict(f"{label}: changed after kvmtune patched it; not restored (--force)")
        back: dict[str, Any] = copy.deepcopy(e.reverse)
        back["metadata"] = {"resourceVersion": kubectl.resource_version(now)}
        kubectl.run_patch(ctx.runner, kubectl.patch_argv(e.context, e.obj_kind, e.namespace, e.name, back))
        after = kubectl.get_object(ctx.runner, e.context, e.obj_kind, e.namespace, e.name)
        if not _holds(after, e.reverse):
            raise KvmtuneError(f"{label}: kubectl patch ran, but the object differs from the journaled values")
        ctx.done.append(f"{label}: the patched fields as they were (kubectl patch --type merge)")


def _holds(obj: Any, patch: Any) -> bool:
    """Does ``obj`` already show what merge patch ``patch`` sets (``null``: absent)?"""
    if not isinstance(patch, dict):
        return bool(obj == patch)
    if not isinstance(obj, dict):
        return False
    for k, v in patch.items():
        if v is None:
            if k in obj:
                return False
        elif not _holds(obj.get(k), v):
            return False
    return True


def plan_cluster(context: str | None, rules: Sequence[type[Rule]], options: FixOptions, plan: Plan,
                 runner: Runner | None = None) -> None:
    """One :class:`KubectlPatch` per object (VirtualMachine, instancetype, preference) whose VMs' findings have a
    value to set, from what ``kubectl get`` shows now (audit --kubevirt's read)."""
    runner = runner or default_runner()
    read = kubectl.read_cluster(runner, context)
    plan.skipped.extend(read.errors)
    plan.notes.extend(read.notes)
    objects = read.objects
    originals = {id(o): copy.deepcopy(o.body) for o in objects}
    chosen = _guest_rules(rules)
    forms = _forms()
    ctx = AuditContext(host=options.host)
    advice: set[tuple[str, str, str]] = set()
    wants: list[Want] = []
    done: dict[tuple[int, str], Any] = {}
    guests: list[Guest] = []
    for _ in range(MAX_ROUNDS):
        guests, _notes = guests_from_objects(objects)
        by_name = {g.name: g for g in guests}
        new = False
        for finding in run_rules(ctx, guests, rules=chosen):
            guest = by_name.get(finding.target.domain or "")
            if guest is None:
                continue
            want = _triage(finding, guest, forms, options, plan, advice)
            if want is None:
                continue
            refusal = _cluster_refusal(want)
            if refusal:
                if refusal not in plan.skipped:
                    plan.skipped.append(refusal)
                continue
            key = (id(want.obj), want.path)
            if not any(w.obj is want.obj and w.path == want.path and w.guest == want.guest
                       and w.finding.rule == finding.rule and w.finding.target.device == finding.target.device
                       for w in wants):
                wants.append(want)
            if key in done:
                continue
            set_in(want.obj.body, parts_of(want.path), want.value)
            done[key] = want.value
            new = True
        if not new:
            break
    plan.manual += len(advice)
    plan.notes.extend(sorted(f"{g}: {r} is advice only ({why})" for g, r, why in advice))
    for obj in objects:
        mine = [w for w in wants if w.obj is obj]
        if not mine:
            continue
        before = originals[id(obj)]
        rv = kubectl.resource_version(before)
        if rv is None:
            plan.skipped.append(f"{_shown(obj)}: kubectl's answer has no metadata.resourceVersion; not patched")
            continue
        forward = merge_patch(before.get("spec") or {}, obj.body.get("spec") or {})
        reverse = merge_patch(obj.body.get("spec") or {}, before.get("spec") or {})
        shared = obj.kind != "VirtualMachine"
        notes = ([f"{_shown(obj)} is used by {', '.join(_users(obj, guests)) or 'no VM read'}: {NEW_REVISION}"]
                 if shared else [RESTART_NOTE])
        reasons: list[Reason] = []
        for w in mine:
            r = Reason(f"{w.finding.rule} {w.finding.slug}: {safe(w.guest)}: {w.path} = {json.dumps(w.value)}")
            if r not in reasons:
                reasons.append(r)
        plan.changes.append(KubectlPatch(
            context=context, obj_kind=obj.kind, namespace=obj.namespace, name=obj.name, resource_version=rv,
            spec_patch={"spec": forward}, reverse={"spec": reverse}, shared=shared, reasons=reasons, notes=notes,
            planned=[w.planned("restart") for w in mine]))


def _cluster_refusal(want: Want) -> str | None:
    obj = want.obj
    if obj.kind not in kubectl.PATCHABLE:
        return (f"{want.guest}: {want.finding.rule}: a {obj.kind} is not patched (its spec is the running instance's; "
                "change its VirtualMachine or pool)")
    if not kubectl.valid_name(obj.name) or (obj.namespace is not None and not kubectl.valid_name(obj.namespace)):
        return f"{want.guest}: {want.finding.rule}: {obj.kind} {obj.name[:80]!r} is not a name kubectl is given"
    found, _ = get_in(obj.body, parts_of(want.path)[:1])
    if not found:
        return f"{want.guest}: {want.finding.rule}: {_shown(obj)} has no spec"
    return None
