"""Host profiles: drop-in files kvmtune owns, plus the runtime writes that make them take effect now.

What to set comes from the table in :mod:`kvmtune.host.settings`, the same one the
host rules check against: values are read through :class:`~kvmtune.host.facts.HostFacts`,
each setting decides from the current value what it wants (``None`` = the current
value is fine), and applying twice plans nothing the second time.

Files kvmtune owns (all below ``--root``):

* ``/etc/sysctl.d/90-kvmtune.conf`` — sysctls
* ``/etc/tmpfiles.d/90-kvmtune.conf`` — sysfs values (KSM, transparent hugepages), written at boot
* ``/etc/udev/rules.d/90-kvmtune.rules`` — I/O scheduler per device kind, tap txqueuelen
* ``/etc/modprobe.d/kvmtune.conf`` — ``kvm halt_poll_ns``
* ``/etc/default/grub.d/90-kvmtune.cfg`` — kernel command-line arguments (``iommu=pt``), on a Debian/Ubuntu GRUB host
  only (``grub_host``): their ``grub-mkconfig`` sources ``/etc/default/grub.d/*.cfg``, Red Hat's does not;
  kvmtune never writes ``grub.cfg`` and never runs ``update-grub``. Nothing is written now: the argument takes
  effect at the next boot (``host-boot``) after the operator has run ``update-grub``.

A drop-in lists what this profile set now or what kvmtune's own file already set
(so the file stays the same once the values are in place).
"""

from __future__ import annotations

import re
from pathlib import Path

from kvmtune.fix.diff import Reason
from kvmtune.fix.effect import Planned
from kvmtune.fix.files import read_state
from kvmtune.fix.plan import MAX_VALUE_BYTES, DropIn, Plan, SysfsWrite, normalise
from kvmtune.host.facts import HostFacts
from kvmtune.host.parsers import format_cpu_mask, parse_sysctl_conf
from kvmtune.host.root import HostReadError, HostRoot
from kvmtune.host.settings import (
    GRUB_DEFAULTS,
    GRUB_MKCONFIG,
    IOMMU_PT,
    PROFILE_DEFS,
    PROFILES,
    SCHED_WANT,
    SCHED_WANT_LEGACY,
    TAP_QLEN,
    Setting,
    grub_host,
    halt_poll_want,
    iommu_pt_want,
    rps_want,
    scheduler_want,
    tap_qlen_want,
)
from kvmtune.qemu.process import running_qemu_guests

SYSCTL_DROPIN = "/etc/sysctl.d/90-kvmtune.conf"
TMPFILES_DROPIN = "/etc/tmpfiles.d/90-kvmtune.conf"
UDEV_DROPIN = "/etc/udev/rules.d/90-kvmtune.rules"
MODPROBE_DROPIN = "/etc/modprobe.d/kvmtune.conf"
GRUB_DROPIN = "/etc/default/grub.d/90-kvmtune.cfg"
# the kernel command-line arguments kvmtune sets, and the one line of its drop-in that carries them
CMDLINE_ARGS = (IOMMU_PT,)
_GRUB_LINE = re.compile(r'^GRUB_CMDLINE_LINUX="\$GRUB_CMDLINE_LINUX((?: [a-z0-9._=-]+)+)"$', re.M)
HALT_POLL = "/sys/module/kvm/parameters/halt_poll_ns"

SCHED_UDEV = {
    "nvme": 'KERNEL=="nvme[0-9]*n[0-9]*"',
    "virtual": 'KERNEL=="vd[a-z]*|xvd[a-z]*"',
    "hdd": 'KERNEL=="sd[a-z]*|hd[a-z]*", ATTR{queue/rotational}=="1"',
    "ssd": 'KERNEL=="sd[a-z]*", ATTR{queue/rotational}=="0"',
}
TAP_UDEV = 'ACTION=="add", SUBSYSTEM=="net", KERNEL=="vnet[0-9]*|macvtap[0-9]*", ATTR{tx_queue_len}="%d"'
RPS_UDEV = 'ACTION=="add", SUBSYSTEM=="net", KERNEL=="%s", ATTR{queues/rx-0/rps_cpus}="%s"'
_MARK = re.compile(r"^# kvmtune: (\S+) (\S+)")
_TMPFILES_W = re.compile(r"^w\s+(\S+)\s+-\s+-\s+-\s+-\s+(.+)$")


def _header(profile: str) -> list[str]:
    return [
        f"# Managed by kvmtune (kvmtune fix --host --profile {profile}).",
        "# 'kvmtune undo ID' restores what was here before; the next 'kvmtune fix --host' rewrites this file.",
    ]


class HostPlanner:
    def __init__(self, root: str, profile: str) -> None:
        if profile not in PROFILE_DEFS:
            raise ValueError(f"unknown profile {profile!r} (one of: {', '.join(PROFILES)})")
        self.root = Path(root)
        self.host = HostRoot(root)
        self.facts = HostFacts(self.host, guests=running_qemu_guests)
        self.profile = PROFILE_DEFS[profile]
        self.plan = Plan()
        self.runtime: list[SysfsWrite] = []
        self.cmdline_rules: list[tuple[str, str]] = []  # (rule, what) the kernel command-line drop-in answers

    def real(self, host_path: str) -> Path:
        """``host_path`` inside the root; OSError when a link in a tree leads out of it (never written through)."""
        try:
            return self.host.beneath(host_path)
        except HostReadError as exc:
            raise OSError(str(exc)) from None

    def _own(self, host_path: str) -> str:
        try:
            data = read_state(self.real(host_path)).data
        except OSError:
            return ""
        return data.decode("utf-8", "replace") if data else ""

    def _write(self, path: str, cur: str, new: str, why: str, parse: str = "plain",
               restore: list[tuple[str, str]] | None = None, rules: tuple[str, ...] = ()) -> None:
        answers = f" (answers {', '.join(rules)})" if rules else ""
        try:
            self.host.beneath(path)
        except HostReadError as exc:
            self.plan.skipped.append(f"{exc}; left alone")
            return
        self.runtime.append(
            SysfsWrite(
                path=path, root=self.root, prior=cur, new=new, parse=parse,
                restore=restore or [(path, cur)],
                reasons=[Reason(f"{self.profile.name}: {why}{answers}")],
                # a runtime value is in force as soon as it is written
                planned=[Planned("host", rule, path, why, "live") for rule in rules or ("",)],
            )
        )

    # -- sysctl ---------------------------------------------------------------------------

    def sysctls(self) -> list[str]:
        own = {s.key: s.value for s in parse_sysctl_conf(self._own(SYSCTL_DROPIN), SYSCTL_DROPIN)}
        return [
            f"{s.name} = {keep}"
            for s in self.profile.settings
            if s.is_sysctl and (keep := self._setting(s, own.get(s.name))) is not None
        ]

    def sysfs_values(self) -> list[str]:
        """KSM and THP values: written now, and again at boot by systemd-tmpfiles."""
        own = {m.group(1): m.group(2).strip() for m in map(_TMPFILES_W.match, self._own(TMPFILES_DROPIN).splitlines())
               if m}
        lines: list[str] = []
        for s in self.profile.settings:
            path = s.path(self.facts)
            if s.is_sysctl or path is None:
                continue
            keep = self._setting(s, own.get(path))
            if keep is not None:
                lines.append(f"w {path} - - - - {keep}")
        return lines

    def _setting(self, s: Setting, own: str | None) -> str | None:
        """Plan the runtime write ``s`` wants; return the value its drop-in line should hold (or None)."""
        cur = s.current(self.facts)
        path = s.path(self.facts)
        if cur is None or path is None:
            if not s.absent_ok:
                where = "not on this kernel" if self.host.is_live else "not in this host root"
                self.plan.skipped.append(f"{s.name}: {where} ({path or 'no such file'} absent); left alone")
            return own
        if len(cur.encode()) > MAX_VALUE_BYTES:  # a tree's file: its whole text would be the plan's prior value
            self.plan.skipped.append(f"{s.name}: {self.facts.where(path)} holds more than {MAX_VALUE_BYTES} bytes, "
                                     "not a kernel value; left alone")
            return own
        want = s.want(self.facts, cur)
        choices = s.choices(self.facts)
        if want is not None and choices is not None and want not in choices:
            self.plan.skipped.append(f"{s.name}: {want} not offered ({', '.join(choices)}); left alone")
            return own
        if want is not None and normalise(want) != cur:
            restore = [(path, cur)]
            if s.couple:
                other = self.facts.sysctl(s.couple)
                if other not in (None, "0"):
                    restore = [(HostFacts.sysctl_path(s.couple), other)]
            self._write(path, cur, want, f"{s.name} {cur} → {want} ({s.why})", restore=restore,
                        parse="bracket" if s.bracket else "plain", rules=s.rules)
        keep = want if want is not None else own
        if keep is not None and s.is_sysctl:
            self._overridden(s.name, keep)
        return keep

    def _overridden(self, key: str, value: str) -> None:
        try:
            settings = self.facts.sysctl_settings
        except Exception:
            return
        ours = Path(SYSCTL_DROPIN).name
        for st in settings:
            if st.key != key or st.file == SYSCTL_DROPIN or st.value == value:
                continue
            if st.file == "/etc/sysctl.conf" or Path(st.file).name > ours:
                self.plan.notes.append(
                    f"{key}: {st.file}:{st.line} sets {st.value} and is read after {SYSCTL_DROPIN}; at boot it wins"
                )

    # -- halt polling ------------------------------------------------------------------------

    def cmdline(self) -> list[str]:
        """The GRUB drop-in's line: ``iommu=pt`` where KVM-HST-047 asks for it (``iommu_pt_want``), and the arguments
        kvmtune's own file already adds (only those kvmtune sets: anything else in it is not kept)."""
        own = _GRUB_LINE.search(self._own(GRUB_DROPIN))
        args = [a for a in (own.group(1).split() if own else []) if a in CMDLINE_ARGS]
        want = iommu_pt_want(self.facts)
        if want is not None and want not in args:
            if not grub_host(self.facts):
                self.plan.skipped.append(
                    f"KVM-HST-047 iommu: {want} belongs on the kernel command line, but this host has no "
                    f"{GRUB_DEFAULTS} read with /etc/default/grub.d (Debian's {GRUB_MKCONFIG}); not Red Hat's "
                    "grub2-mkconfig, grubby's BLS entries or systemd-boot's /etc/kernel/cmdline either: left alone, "
                    "the finding says what to add")
                return [f"GRUB_CMDLINE_LINUX=\"$GRUB_CMDLINE_LINUX {' '.join(args)}\""] if args else []
            args.append(want)
            self.cmdline_rules.append(("KVM-HST-047", f"{want} on the kernel command line"))
        if not args:
            return []
        return [f"GRUB_CMDLINE_LINUX=\"$GRUB_CMDLINE_LINUX {' '.join(args)}\""]

    def halt_poll(self) -> list[str]:
        own = re.search(r"^options\s+kvm\s+.*\bhalt_poll_ns=(\d+)", self._own(MODPROBE_DROPIN), re.M)
        raw = self.facts.module_param("kvm", "halt_poll_ns")
        if raw is None:
            self.plan.skipped.append("kvm.halt_poll_ns: kvm is not loaded; left alone")
            return [f"options kvm halt_poll_ns={own.group(1)}"] if own else []
        try:
            cur = int(raw)
        except ValueError:
            self.plan.skipped.append(f"kvm.halt_poll_ns: {HALT_POLL} holds {raw!r}; left alone")
            return []
        wanted = halt_poll_want(self.facts, cur, latency_profile=self.profile.name == "network-latency")
        want, why = wanted if wanted is not None else (None, "")
        if want is not None:
            self._write(HALT_POLL, str(cur), str(want), f"kvm.halt_poll_ns {cur} → {want}: {why}",
                        rules=("KVM-HST-011",))
        keep = str(want) if want is not None else (own.group(1) if own else None)
        return [f"options kvm halt_poll_ns={keep}"] if keep is not None else []

    # -- udev: schedulers and taps ------------------------------------------------------------------

    def udev(self) -> list[str]:
        marks = {(m.group(1), m.group(2)) for m in map(_MARK.match, self._own(UDEV_DROPIN).splitlines()) if m}
        kinds: set[str] = {k for what, k in marks if what == "scheduler"}
        names: dict[str, str] = dict(SCHED_WANT)
        devices = self.facts.block_devices
        for dev in devices:
            table = SCHED_WANT_LEGACY if dev.legacy else SCHED_WANT
            names[dev.kind] = table.get(dev.kind, names.get(dev.kind, ""))
            want = scheduler_want(dev)
            if want is None:
                continue
            if want not in dev.available:
                self.plan.skipped.append(f"block {dev.name}: {want} not offered ({', '.join(dev.available)})")
                continue
            self._write(
                f"/sys/block/{dev.name}/queue/scheduler", dev.scheduler, want,
                f"block {dev.name} ({dev.kind}): scheduler {dev.scheduler} → {want}", parse="bracket",
                rules=("KVM-HST-004",),
            )
            kinds.add(dev.kind)
        lines: list[str] = []
        for dev in devices:
            if dev.kind in kinds and dev.scheduler != names[dev.kind] and not any(
                w.path == f"/sys/block/{dev.name}/queue/scheduler" for w in self.runtime
            ):
                self.plan.notes.append(
                    f"block {dev.name}: keeps {dev.scheduler} now (fine for a {dev.kind}), but the udev rule "
                    f"sets {names[dev.kind]} on every {dev.kind} device when it appears (next boot)"
                )
        for kind in ("nvme", "virtual", "ssd", "hdd"):
            if kind in kinds:
                lines.append(f"# kvmtune: scheduler {kind}")
                lines.append(
                    f'ACTION=="add|change", SUBSYSTEM=="block", ENV{{DEVTYPE}}=="disk", {SCHED_UDEV[kind]}, '
                    f'ATTR{{queue/scheduler}}="{names[kind]}"'
                )
        if self.profile.network:
            taps = ("txqueuelen", "taps") in marks
            for net in sorted(self.facts.net_devices.values(), key=lambda d: d.name):
                if tap_qlen_want(net) is not None and net.tx_queue_len is not None:
                    self._write(
                        f"/sys/class/net/{net.name}/tx_queue_len", str(net.tx_queue_len), str(TAP_QLEN),
                        f"{net.kind} {net.name}: txqueuelen {net.tx_queue_len} → {TAP_QLEN} "
                        f"({net.tx_dropped} packets dropped on transmit)", rules=("KVM-HST-015",),
                    )
                    taps = True
            if taps:
                lines.append("# kvmtune: txqueuelen taps")
                lines.append(TAP_UDEV % TAP_QLEN)
            lines.extend(self.rps(marks))
        return lines

    def rps(self, marks: set[tuple[str, str]]) -> list[str]:
        """Receive packet steering for single-queue NICs: one CPU no longer takes every packet's softirq."""
        own = {name for what, name in marks if what == "rps"}
        old = {m.group(1): m.group(2) for m in re.finditer(r'KERNEL=="([^"]+)", ATTR\{queues/rx-0/rps_cpus\}="([0-9a-f,]+)"',
                                                           self._own(UDEV_DROPIN))}
        masks: dict[str, str] = {name: old[name] for name in own if name in old}
        for net in sorted(self.facts.net_devices.values(), key=lambda d: d.name):
            cpus = rps_want(self.facts, net)
            if cpus is None:
                continue
            mask = format_cpu_mask(cpus)
            path = f"/sys/class/net/{net.name}/queues/rx-0/rps_cpus"
            shown = normalise(self.facts.text(path, quiet=True) or "0")  # undo writes back what was there
            self._write(
                path, "0", mask,
                f"{net.name}: one receive queue, RPS off → rps_cpus {mask} (spread receive work over its CPUs)",
                parse="mask", restore=[(path, shown)], rules=("KVM-HST-016",),
            )
            masks[net.name] = mask
        lines: list[str] = []
        for name in sorted(masks):
            lines.append(f"# kvmtune: rps {name}")
            lines.append(RPS_UDEV % (name, masks[name]))
        return lines

    # -- the plan -------------------------------------------------------------------------------

    def _dropin(self, host_path: str, lines: list[str], why: str, answers: list[tuple[str, str]] | None = None,
                notes: list[str] | None = None) -> None:
        real = self.real(host_path)
        try:
            before = read_state(real)
        except OSError as exc:
            self.plan.skipped.append(f"{host_path}: {exc}; left alone")
            return
        if not lines:
            return
        after = ("\n".join([*_header(self.profile.name), *lines]) + "\n").encode()
        if before.data == after:
            return
        # a drop-in is read at boot (systemd-sysctl, systemd-tmpfiles, udev's coldplug, modprobe at kvm's load, the
        # boot loader's configuration): an item per rule it alone answers (no runtime value does), else one for it
        planned = ([Planned("host", rule, host_path, what, "host-boot") for rule, what in answers] if answers
                   else [Planned("host", "", host_path, why, "host-boot")])
        self.plan.changes.append(DropIn(path=real, shown=host_path, before=before, after=after, reasons=[Reason(why)],
                                        notes=list(notes or []), planned=planned))

    def build(self) -> Plan:
        sysctl_lines = self.sysctls()
        tmpfiles_lines = self.sysfs_values()
        modprobe_lines = self.halt_poll()
        grub_lines = self.cmdline()
        udev_lines = self.udev()
        self.plan.changes.extend(self.runtime)
        self._dropin(SYSCTL_DROPIN, sysctl_lines, "makes the sysctls last across reboots (systemd-sysctl)")
        self._dropin(TMPFILES_DROPIN, tmpfiles_lines, "writes the KSM/THP values again at boot (systemd-tmpfiles)")
        self._dropin(UDEV_DROPIN, udev_lines, "sets the scheduler / txqueuelen again whenever a device appears")
        self._dropin(MODPROBE_DROPIN, modprobe_lines, "kvm module option, applied when kvm is loaded")
        self._dropin(GRUB_DROPIN, grub_lines, "kernel command line, read by grub-mkconfig (update-grub)",
                     answers=self.cmdline_rules,
                     notes=["takes effect at the host's next boot, once 'update-grub' (grub-mkconfig) has rebuilt "
                            "grub.cfg from it: kvmtune runs neither; 'kvmtune fix --status' lists it until then"])
        self.plan.skipped.extend(self.facts.errors)
        return self.plan


def plan_host(root: str, profile: str) -> Plan:
    return HostPlanner(root, profile).build()
