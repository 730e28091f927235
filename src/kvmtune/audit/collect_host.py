"""Gathering the host and disk images to audit (the inputs of the host and image rules)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import AuditResult
from kvmtune.host.parsers import Mount, parse_mounts
from kvmtune.host.root import HostRoot
from kvmtune.inputs import walk_files
from kvmtune.model.guest import Guest
from kvmtune.qemu.image import DiskImage, ImageError, ImageUse, read_image

IMAGE_SUFFIXES = (".qcow2", ".qcow", ".img", ".raw", ".vmdk", ".vdi", ".vhd", ".vhdx", ".qed")


def add_host(ctx: AuditContext, result: AuditResult) -> None:
    """Mark the host for auditing and say what it is; a captured tree without proc/, sys/ and dev/ (one holding
    only etc/pve, say) has no host to judge: its host rules are skipped, said in one line."""
    if not ctx.host.is_live and not any(ctx.host.is_dir(d) for d in ("/proc", "/sys", "/dev")):
        result.looked_at.append(f"host {ctx.host.path}: the tree holds no proc/, sys/ or dev/: host rules skipped")
        return
    facts = ctx.facts
    result.host_audited = True
    where = "this machine" if ctx.host.is_live else f"captured tree {ctx.host.path}"
    mem = facts.mem_total_kib
    parts = [
        f"host {ctx.host_label()} ({where})",
        f"kernel {facts.kernel_release or '?'}",
        f"{facts.cpu_count or '?'} CPUs",
        f"{mem / 1048576:.1f} GiB RAM" if mem else "RAM ?",
        f"{len(facts.guests)} running guest(s)",
    ]
    result.looked_at.append(", ".join(parts))


def local_mounts() -> list[Mount]:
    """Mounts of this machine (images are always local files, whatever --root says)."""
    live = HostRoot("/")
    text = live.read_optional("/proc/self/mounts") or live.read_optional("/proc/mounts") or ""
    return parse_mounts(text)


@dataclass
class _Wanted:
    path: str
    uses: list[ImageUse] = field(default_factory=list)
    in_use: bool = False
    owner: tuple[int, int] | None = None  # uid, gid of the QEMU process that names it

    @property
    def declared_format(self) -> str | None:
        """The format its definitions declare; None (probe, report only) when none does or they disagree."""
        declared = {u.declared_format for u in self.uses if u.declared_format}
        return declared.pop() if len(declared) == 1 else None


def _expand(paths: Iterable[str], result: AuditResult) -> list[str]:
    out: list[str] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            walk = walk_files(str(p), lambda name: os.path.splitext(name)[1].lower() in IMAGE_SUFFIXES,
                              allow_block=True)
            result.errors.extend(walk.problems)
            if not walk.files and not walk.problems:
                result.errors.append(f"{p}: directory holds no disk images ({', '.join(IMAGE_SUFFIXES)})")
            out.extend(walk.files)
        else:
            out.append(raw)
    return out


# CAP_SETGID (6) and CAP_SETUID (7): what setpriv needs to read an image as the QEMU user who runs it
_SET_IDS = (1 << 6) | (1 << 7)


def can_take_uids() -> bool:
    """Whether this process may take another user's uid and gid (root with CAP_SETUID and CAP_SETGID in effect).
    ``kvmtune-audit.service`` leaves both out of its bounding set, so the timer's audit may not."""
    status = HostRoot("/").read_optional("/proc/self/status") or ""
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            try:
                return int(line.split(":", 1)[1].strip(), 16) & _SET_IDS == _SET_IDS
            except ValueError:
                return False
    return False


def _read_all(wanted: list[_Wanted], ctx: AuditContext, result: AuditResult, *, quiet_unreadable: bool) -> int:
    mounts = local_mounts()
    skipped: list[str] = []
    not_as_owner: list[str] = []
    can_take: bool | None = None
    header_only = 0
    n = 0
    for w in wanted:
        if w.owner is not None and w.owner[0] != 0 and os.geteuid() == 0:
            # root reads another user's QEMU's image as that user (setpriv), or not at all
            can_take = can_take_uids() if can_take is None else can_take
            if not can_take:
                not_as_owner.append(w.path)
                continue
        try:
            img = read_image(w.path, ctx.runner, mounts, in_use=w.in_use, declared_format=w.declared_format,
                             owner=w.owner)
        except ImageError as exc:
            if quiet_unreadable and any(m in exc.problem for m in ("not readable", "permission denied",
                                                                   "operation not permitted")):
                skipped.append(w.path)
            else:
                result.errors.append(str(exc))
            continue
        img.used_by.extend(w.uses)
        if img.info_source == "stat":
            header_only += 1
        result.images.append(img)
        n += 1
    if header_only:
        result.errors.append(
            f"qemu-img: not found on PATH (install qemu-utils): {header_only} image(s) read without it "
            "(sizes, and partition tables of raw images)"
        )
    if skipped:
        result.looked_at.append(f"{len(skipped)} guest image(s) not readable by this user (skipped): {', '.join(skipped)}")
    if not_as_owner:
        result.looked_at.append(
            f"{len(not_as_owner)} image(s) of QEMUs run by other users than root not read: this process may not take "
            "their uid (no CAP_SETUID/CAP_SETGID, as under kvmtune-audit.service); run 'kvmtune audit' as root "
            f"outside the unit to read them: {', '.join(not_as_owner)}")
    unfollowed = [i.path for i in result.images[-n:] if n and i.backing_note]
    if unfollowed:
        result.looked_at.append(
            f"{len(unfollowed)} image(s) with a backing file not followed, their format being probed, not declared "
            f"(name them in a domain definition to audit the chain): {', '.join(unfollowed)}"
        )
    return n


def add_images(paths: Iterable[str], ctx: AuditContext, result: AuditResult) -> int:
    """Audit the images named on the command line (files, block devices, directories of images)."""
    seen = {i.realpath for i in result.images}
    wanted: list[_Wanted] = []
    for p in _expand(paths, result):
        real = os.path.realpath(p)
        if real in seen:
            continue
        seen.add(real)
        wanted.append(_Wanted(p))
    n = _read_all(wanted, ctx, result, quiet_unreadable=False)
    result.looked_at.append(f"{n} of {len(wanted)} disk image(s) given")
    return n


def guest_images(guests: Iterable[Guest]) -> tuple[list[_Wanted], int]:
    """Local images the guests' data disks use, with who uses them; and how many paths are not here.

    Only guests known to run on this host bring their images along (a domain XML from
    elsewhere names paths of another machine). Whatever is at a path, :func:`read_image`
    opens only regular files and block devices.
    """
    by_real: dict[str, _Wanted] = {}
    missing = 0
    for g in guests:
        # a guest from elsewhere (file, remote libvirt) or from a captured tree names another machine's paths
        if not (g.on_audited_host and g.images_here) or not g.is_kvm_or_qemu:
            continue
        for d in g.disks:
            if not d.is_data_disk or d.source_type not in ("file", "block") or not d.source:
                continue
            if not os.path.lexists(d.source):
                missing += 1
                continue
            real = os.path.realpath(d.source)
            w = by_real.setdefault(real, _Wanted(d.source))
            w.uses.append(ImageUse(g.name, d.target, d.cache, d.source_type, d.format, g.origin, g.active))
            w.in_use = w.in_use or bool(g.active)
            if g.process_owner is not None:
                w.owner = g.process_owner
    return list(by_real.values()), missing


def add_guest_images(ctx: AuditContext, result: AuditResult) -> int:
    """Audit every local image used by the guests already gathered in ``result``."""
    wanted, missing = guest_images(result.guests)
    known = {i.realpath: i for i in result.images}
    fresh: list[_Wanted] = []
    for w in wanted:
        img: DiskImage | None = known.get(os.path.realpath(w.path))
        if img is not None:  # also given with --images: just record the users
            img.used_by.extend(w.uses)
        else:
            fresh.append(w)
    n = _read_all(fresh, ctx, result, quiet_unreadable=True) if fresh else 0
    if wanted or missing:
        note = f"{n} disk image(s) of audited guests"
        if missing:
            note += f" ({missing} disk path(s) not present on this machine)"
        result.looked_at.append(note)
    return n
