"""Gathering what to audit: files, directories, command lines, libvirt, /proc."""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kvmtune.audit.collect_agent import add_guest_insides
from kvmtune.audit.collect_host import add_guest_images, add_host, add_images
from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import AuditResult
from kvmtune.domain.xml import load_guest_file
from kvmtune.errors import InputError
from kvmtune.host.root import HostRoot
from kvmtune.inputs import read_regular, walk_files
from kvmtune.kubevirt import kubectl
from kvmtune.kubevirt import load as kubevirt
from kvmtune.kubevirt.guest import guests_from_objects as kubevirt_guests
from kvmtune.model.guest import Guest
from kvmtune.proxmox import load as pve
from kvmtune.proxmox.config import VMID_FILE
from kvmtune.qemu.argv import DEFAULT_BINARY, split_proc_cmdline
from kvmtune.qemu.cmdline import guest_from_argv, guest_from_config, guest_from_text
from kvmtune.qemu.readconfig import MAX_CONFIG_BYTES, looks_like_config, parse_config
from kvmtune.textsafe import safe

MAX_CMDLINE_BYTES = 4 * 1024 * 1024
DEFAULT_URI = "qemu:///system"
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@dataclass(frozen=True)
class Sources:
    """What to audit, as ``audit`` and ``verify`` were asked (nothing named: this host's guests and the host)."""

    paths: tuple[str, ...] = ()  # domain XML files or directories of them
    connect: tuple[str, ...] = ()  # libvirt URIs
    domains: tuple[str, ...] = ()  # only these of the libvirt URIs' domains: names or UUIDs, shell globs allowed
    qemu_cmdline: tuple[str, ...] = ()  # files of one QEMU command line each
    qemu_binary: str = DEFAULT_BINARY  # whose argument lists those without the binary are
    running: bool = False  # every running qemu-system-* process
    examples: bool = False  # the example domains shipped with kvmtune
    host: bool = False  # the host's tunables, devices and load
    images: tuple[str, ...] = ()  # disk images: files, block devices or directories of them
    guest_images: bool = True  # the local disk images the audited domains use
    assume_this_host: bool = False  # guests from files are this host's
    agent_timeout: float | None = None  # ask running guests' agents about their inside, each within this; None: do not
    pve_configs: tuple[str, ...] = ()  # Proxmox VE VM configs (<vmid>.conf) or directories of them
    pve_storage: str | None = None  # the storage.cfg they name storage from (default: the host's /etc/pve/storage.cfg)
    kubevirt: tuple[str, ...] = ()  # KubeVirt manifests (.yaml, .yml, .json) or directories of them
    recursive: bool = False  # a directory of manifests: its whole tree, not one level
    kubevirt_context: str | None = None  # read KubeVirt objects from a cluster with kubectl ("": the current context)
    template: bool = False  # audit templates whose placeholders stand for judged values, those values not stated

    @property
    def explicit(self) -> bool:
        """Something was named (so the default inputs are not added)."""
        return bool(self.paths or self.connect or self.qemu_cmdline or self.running or self.examples
                    or self.host or self.images or self.pve_configs or self.kubevirt
                    or self.kubevirt_context is not None)


def domain_files_among_images(paths: Iterable[str], images: Iterable[str]) -> tuple[list[str], list[str], list[str]]:
    """``--images`` takes every path after it, so ``--images a.qcow2 vm.xml`` would read a domain file as a
    disk image. A ``.xml`` name there counts as a domain path: returns (paths, images, the names moved)."""
    images = list(images)
    moved = [p for p in images if p.lower().endswith(".xml") and not os.path.isdir(p)]
    return [*paths, *moved], [p for p in images if p not in moved], moved


def gather(sources: Sources, ctx: AuditContext) -> AuditResult:
    """Read every input ``sources`` names (or, with none named, what this host runs) into one result."""
    result = AuditResult()
    explicit = sources.explicit
    if sources.paths:
        add_domain_files(sources.paths, result, sources.template)
    _add_named_libvirt(sources, result)
    if sources.qemu_cmdline:
        add_cmdline_files(sources.qemu_cmdline, result, sources.qemu_binary, ctx.host, sources.template)
    if sources.pve_configs:
        add_pve_files(sources, ctx.host, result)
    if sources.kubevirt:
        add_kubevirt_files(sources.kubevirt, sources.recursive, result)
    if sources.kubevirt_context is not None:
        add_kubevirt_cluster(ctx, sources.kubevirt_context or None, result)
    if sources.running:
        add_running(ctx.host, result)
    if sources.examples:
        add_domain_files([str(EXAMPLES)], result)
    if sources.host or not explicit:
        add_host(ctx, result)
    if sources.images:
        add_images(sources.images, ctx, result)
    if not explicit:
        _add_this_hosts_guests(ctx, result)
    forget_bad_uuids(result)
    mark_guests_off_host(result, sources.assume_this_host)
    for guest in result.guests:  # values the readers refused (kvmtune.qemuopts' enumerations)
        result.looked_at.extend(safe(n) for n in guest.notes)
    if sources.agent_timeout is not None:
        add_guest_insides(result, timeout=sources.agent_timeout, live_host=ctx.host.is_live)
    if sources.guest_images and result.guests:
        add_guest_images(ctx, result)
    return result


def _add_named_libvirt(sources: Sources, result: AuditResult) -> None:
    """The domains of each ``--connect`` URI (only the ``--domain`` ones, when named); a pattern that matches none is an error."""
    matched: set[str] = set()
    for uri in sources.connect:
        add_libvirt(uri, result, domains=sources.domains, matched=matched)
    for pattern in sources.domains:
        if pattern not in matched:
            result.errors.append(f"--domain {pattern}: no domain of {', '.join(sources.connect)} matches")


def _add_this_hosts_guests(ctx: AuditContext, result: AuditResult) -> None:
    """With nothing named: the local libvirt's domains, Proxmox VE's VM configs and the running QEMU processes."""
    found = 0
    if ctx.host.is_live:  # a captured tree's libvirt is not this machine's
        found += add_libvirt(DEFAULT_URI, result, required=False)
    found += add_pve_host(ctx.host, result)
    found += add_running(ctx.host, result)
    merge_pve_processes(result)
    if not found:
        # Say so rather than audit something else: an operator reads this as the answer about this host.
        result.looked_at.append(f"0 guests on {'this host' if ctx.host.is_live else 'host ' + ctx.host.path}")
        result.hints.append("no guests to audit; 'kvmtune audit --examples' audits the example domains "
                            "shipped with kvmtune")


def pve_config_paths(paths: Iterable[str]) -> tuple[list[str], list[str]]:
    """Split audit PATHs into domain XML ones and Proxmox VE configs (``<vmid>.conf``, or a directory of them
    holding no ``.xml``): returns (xml paths, pve paths)."""
    xml: list[str] = []
    confs: list[str] = []
    for raw in paths:
        p = Path(raw)
        if (raw.endswith(".conf") and not _is_dir(p)) or (_is_dir(p) and _pve_dir(p)):
            confs.append(raw)
        else:
            xml.append(raw)
    return xml, confs


def kubevirt_paths(paths: Iterable[str], recursive: bool = False) -> tuple[list[str], list[str]]:
    """Split audit PATHs into the others and KubeVirt manifests (``.yaml``, ``.yml``, ``.json``, or a directory
    holding such files, or with ``recursive`` any directory, and no ``.xml``): returns (other paths, manifests)."""
    rest: list[str] = []
    manifests: list[str] = []
    for raw in paths:
        p = Path(raw)
        if (kubevirt.is_manifest_name(raw) and not _is_dir(p)) or (_is_dir(p) and _manifest_dir(p, recursive)):
            manifests.append(raw)
        else:
            rest.append(raw)
    return rest, manifests


def _manifest_dir(p: Path, recursive: bool) -> bool:
    try:
        names = os.listdir(p)
    except OSError:
        return False
    return not any(n.endswith(".xml") for n in names) and (
        recursive or any(kubevirt.is_manifest_name(n) for n in names))


def add_kubevirt_files(paths: Iterable[str], recursive: bool, result: AuditResult) -> None:
    """KubeVirt objects from manifests: VMs, VMIs and pools as guests, their instancetypes and preferences
    resolved among what was given (kubevirt/)."""
    _take_kubevirt(kubevirt.read_paths(list(paths), recursive), result, "manifest file(s)")


def add_kubevirt_cluster(ctx: AuditContext, context: str | None, result: AuditResult) -> None:
    """KubeVirt objects from a cluster through ``kubectl get`` (read-only), resolved among themselves; then each
    running VMI's effective domain XML through its virt-launcher pod (``audit/kubevirt_running.py``)."""
    from kvmtune.audit.kubevirt_running import add_running as add_running_vmis

    try:
        read = kubectl.read_cluster(ctx.runner, context)
    except InputError as exc:
        result.errors.append(safe(str(exc)))
        return
    _take_kubevirt(read, result, f"kubectl answer(s) from {kubectl.origin(context)}")
    add_running_vmis(ctx.runner, context, read.objects, result)


def _take_kubevirt(read: kubevirt.Read, result: AuditResult, what: str) -> None:
    result.errors.extend(safe(e) for e in read.errors)
    guests, notes = kubevirt_guests(read.objects)
    result.guests.extend(guests)
    result.looked_at.extend(safe(n) for n in (*read.notes, *notes))
    others = sum(1 for o in read.objects if o.kind in kubevirt.REFERENCED_KINDS)
    result.looked_at.append(f"{len(guests)} KubeVirt guest(s) and {others} instancetype(s)/preference(s) in "
                            f"{read.files} {what}")


def _pve_dir(p: Path) -> bool:
    try:
        names = os.listdir(p)
    except OSError:
        return False
    return any(VMID_FILE.match(n) for n in names) and not any(n.endswith(".xml") for n in names)


def add_pve_files(sources: Sources, host: HostRoot, result: AuditResult) -> None:
    """Named ``.conf`` files: storage from ``--pve-storage``, else the audited host's storage.cfg."""
    try:
        storages = pve.storage_file(sources.pve_storage) if sources.pve_storage else pve.host_storages(host)
    except InputError as exc:
        result.errors.append(str(exc))
        return
    read = pve.read_files(list(sources.pve_configs), storages)
    if storages is None:
        result.looked_at.append(f"{pve.STORAGE_CFG}: absent on this host and no --pve-storage; only 'local' "
                                "(/var/lib/vz) is known")
    _take_pve(read, result)
    result.looked_at.append(f"{len(read.guests)} Proxmox VE VM config file(s)")


def add_pve_host(host: HostRoot, result: AuditResult) -> int:
    read = pve.read_host(host)
    _take_pve(read, result)
    return len(read.guests)


def _take_pve(read: pve.PveRead, result: AuditResult) -> None:
    result.guests.extend(read.guests)
    result.errors.extend(read.errors)
    result.looked_at.extend(safe(n) for n in read.notes)


def merge_pve_processes(result: AuditResult) -> None:
    """A running QEMU that PVE started from a config read here (same SMBIOS UUID, or ``-id <vmid>``) is that
    config's guest, running: one guest, not two."""
    by_uuid = {g.uuid.lower(): g for g in result.guests if g.origin_kind == "pve" and g.uuid}
    by_vmid = {g.name.split()[0][4:]: g for g in result.guests if g.origin_kind == "pve"}
    keep: list[Guest] = []
    for guest in result.guests:
        if guest.origin_kind == "cmdline" and guest.active:
            config = by_uuid.get((guest.uuid or "").lower()) or by_vmid.get(str(guest.derived.get("pve_vmid", "")))
            if config is not None:
                config.active, config.process_owner = True, guest.process_owner
                result.looked_at.append(f"{safe(config.name)}: running as {safe(guest.origin)}")
                continue
        keep.append(guest)
    result.guests[:] = keep


def _is_dir(p: Path) -> bool:
    try:
        return p.is_dir()
    except OSError:
        return False  # unreadable: reading it as a file reports why


def _expand(paths: Iterable[str], result: AuditResult) -> list[Path]:
    files: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if _is_dir(p):
            walk = walk_files(str(p), lambda name: name.endswith(".xml"))
            result.errors.extend(walk.problems)
            if not walk.files and not walk.problems:
                result.errors.append(f"{p}: directory has no .xml files")
            files.extend(Path(f) for f in walk.files)
        else:
            files.append(p)
    return files


# a UUID as libvirt and QEMU write it: 32 hex digits, dashed 8-4-4-4-12 or not at all
_UUID = re.compile(r"[0-9a-fA-F]{8}(-?)[0-9a-fA-F]{4}\1[0-9a-fA-F]{4}\1[0-9a-fA-F]{4}\1[0-9a-fA-F]{12}")


def forget_bad_uuids(result: AuditResult) -> None:
    """A guest's UUID that is no UUID (``<uuid>*</uuid>``) is said in one line and the guest audited without
    one: a UUID names one guest, in waivers, baselines and reports, and such a value names none."""
    for guest in result.guests:
        if guest.uuid is not None and not _UUID.fullmatch(guest.uuid.strip()):
            result.looked_at.append(f"{safe(guest.origin)}: guest {safe(guest.name)}'s UUID '{safe(guest.uuid)}' is "
                                    "not a UUID; audited without one")
            guest.uuid = None


def refuse_template(guest: Guest, template: bool) -> None:
    """A template whose placeholders stand for values the rules judge (memory, a cache mode) is refused with
    the placeholder's line, unless ``template`` (``--template``): then those values are not stated."""
    judged = guest.derived.get("template_judged")
    if judged is None or template:
        return
    placeholder, where, line = judged
    raise InputError(guest.origin, f"a template: placeholder {safe(placeholder)} in {safe(where)} stands for a "
                     "value the rules judge; not audited (--template audits it with those values not stated)", line)


def note_template(guest: Guest, result: AuditResult) -> None:
    """A definition with placeholders is a template: said in one line, its placeholder values not judged."""
    if guest.template:
        shown = ", ".join(safe(p) for p in guest.template[:4]) + (", …" if len(guest.template) > 4 else "")
        result.looked_at.append(f"{safe(guest.origin)}: a template, not a guest definition (placeholders {shown}); "
                                "the values holding them are not judged")


def add_domain_files(paths: Iterable[str], result: AuditResult, template: bool = False) -> None:
    files = _expand(paths, result)
    ok = 0
    for f in files:
        try:
            guest = load_guest_file(f)
            refuse_template(guest, template)
            result.guests.append(guest)
            ok += 1
            note_template(guest, result)
        except InputError as exc:
            result.errors.append(str(exc))
    if files:
        result.looked_at.append(f"{ok} of {len(files)} domain XML file(s)")


def add_cmdline_files(paths: Iterable[str], result: AuditResult, qemu_binary: str = DEFAULT_BINARY,
                      host: HostRoot | None = None, template: bool = False) -> None:
    """Each file holds one command line; one whose first word is an option (the binary logged apart) is
    ``qemu_binary``'s argument list, said in one line. Its ``-readconfig`` files are read beneath ``host``'s
    root. A file in QEMU's configuration-file format is audited as a fragment of a guest."""
    n = 0
    for raw in paths:
        p = Path(raw)
        try:
            if _is_dir(p):
                raise InputError(str(p), "is a directory (give a file holding one QEMU command line)")
            data = read_regular(str(p), MAX_CMDLINE_BYTES)
        except InputError as exc:
            result.errors.append(str(exc))
            continue
        try:
            guest = _cmdline_guest(p, data, qemu_binary, host)
            refuse_template(guest, template)
        except InputError as exc:
            result.errors.append(str(exc))
            continue
        if guest.name == "?":
            guest.name = p.stem
        result.guests.append(guest)
        n += 1
        if "binary_assumed" in guest.derived:
            result.looked_at.append(f"{safe(str(p))}: an argument list without the binary, read as "
                                    f"{safe(qemu_binary)}'s (--qemu-binary NAME to choose another)")
        note_reading(guest, result)
        note_template(guest, result)
    result.looked_at.append(f"{n} QEMU command line file(s)")


def _cmdline_guest(p: Path, data: bytes, qemu_binary: str, host: HostRoot | None) -> Guest:
    if not data.strip():
        raise InputError(str(p), "empty file")
    if b"\0" in data:
        return guest_from_argv(split_proc_cmdline(data), str(p), qemu_binary, host)
    if len(data) <= MAX_CONFIG_BYTES and looks_like_config(data):
        guest = guest_from_config(parse_config(data.decode("utf-8", "replace"), str(p)), str(p))
        guest.derived.setdefault("notes", []).insert(
            0, "a QEMU configuration file (-readconfig format), not a command line: audited as a fragment of a "
            "guest; what only the command line can say is not judged")
        return guest
    return guest_from_text(data.decode("utf-8", "replace"), str(p), qemu_binary, host)


def note_reading(guest: Guest, result: AuditResult) -> None:
    """What reading the guest's definition had to say (its -readconfig files), one line each."""
    for note in guest.derived.get("notes", ()):
        result.looked_at.append(f"{safe(guest.origin)}: {safe(note)}")


def add_running(host: HostRoot, result: AuditResult) -> int:
    from kvmtune.qemu.process import running_qemu_guests

    guests, errors = running_qemu_guests(host)
    result.guests.extend(guests)
    for guest in guests:
        note_reading(guest, result)
    result.errors.extend(errors)
    result.looked_at.append(f"{len(guests)} running QEMU process(es) from {host.path.rstrip('/') or ''}/proc")
    return len(guests)


def is_local_uri(uri: str) -> bool:
    """qemu:///system, qemu+unix:///session: this machine's libvirt. qemu+ssh://host/..., qemu://host/: not."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return False
    transport = scheme.partition("+")[2]
    return transport in ("", "unix") and not rest.split("/", 1)[0].split("?", 1)[0]


def mark_guests_off_host(result: AuditResult, assume_this_host: bool) -> None:
    """Guests from files may describe another machine: host-relative checks need to know.

    With ``--assume-this-host`` they count as this host's; otherwise one line says what is skipped.
    """
    foreign = [g for g in result.guests if not g.on_audited_host]
    if not foreign:
        return
    if assume_this_host:
        for guest in foreign:
            guest.on_audited_host = True
        return
    result.looked_at.append(
        f"{len(foreign)} guest(s) from files or a remote libvirt are not known to run on this host: "
        "vCPUs against this host's CPUs and disk image probing skipped for them (--assume-this-host runs them)"
    )


def add_libvirt(uri: str, result: AuditResult, *, required: bool = True, domains: Sequence[str] = (),
                matched: set[str] | None = None) -> int:
    """The domains of ``uri``; with ``domains``, only those whose name or UUID matches one of these globs
    (each pattern that matched is added to ``matched``)."""
    from kvmtune.domain.connection import BindingMissing, read_domains

    try:
        guests, errors = read_domains(uri)
    except BindingMissing as exc:  # the wheel in a venv of its own: audit what needs no libvirt, say what is missing
        if required:
            result.errors.append(f"{uri}: {exc}")
        else:
            result.looked_at.append(f"libvirt {uri}: not read: {exc}")
        return 0
    except InputError as exc:
        if required:
            result.errors.append(str(exc))
        else:
            result.looked_at.append(f"libvirt {uri}: not answering")
        return 0
    if domains:
        kept = []
        for guest in guests:
            names = [guest.name, *([guest.uuid] if guest.uuid else [])]
            hits = {p for p in domains if any(fnmatch.fnmatchcase(n, p) for n in names)}
            if hits:
                kept.append(guest)
                if matched is not None:
                    matched |= hits
        guests = kept
    local = is_local_uri(uri)
    for guest in guests:
        guest.on_audited_host = local
    result.guests.extend(guests)
    result.errors.extend(errors)
    active = sum(1 for g in guests if g.active)
    result.looked_at.append(f"libvirt {uri}: {len(guests)} domain(s), {active} active")
    return len(guests)
