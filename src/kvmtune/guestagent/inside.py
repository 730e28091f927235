"""The inside of one running guest, read through its agent with read-only commands.

What is read, and from where (a Linux guest's own files, opened read-only with
``guest-file-open`` mode ``r``; nothing runs in the guest, nothing is written there):

- the guest's operating system: ``guest-get-osinfo``;
- its disks: ``guest-get-disks`` (the disk's bus as the guest sees it), then each disk's
  ``/sys/block/<disk>/queue/scheduler``;
- the clock source: ``/sys/devices/system/clocksource/clocksource0/{current,available}_clocksource``;
- entropy and the hardware RNG it is fed from: ``/proc/sys/kernel/random/entropy_avail``,
  ``/sys/devices/virtual/misc/hw_random/rng_{current,available}``;
- THP: ``/sys/kernel/mm/transparent_hugepage/enabled``;
- trimming: ``/proc/mounts`` (file systems mounted with ``discard``) and whether a periodic
  ``fstrim`` is enabled (systemd's ``fstrim.timer`` wanted by ``timers.target``, or a cron job);
- a Windows guest's PCI devices and their drivers: ``guest-get-devices``.

Each answer is the guest's: a value is kept only if it fits the narrow pattern of what that
file holds (a scheduler name, a number); anything else is dropped and named in ``unreadable``,
so no guest-written text reaches a report except through these patterns, and no guest answer
chooses a path (a disk name must look like one before it becomes ``/sys/block/<name>``).
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from kvmtune.guestagent.client import Agent, AgentError, AgentRefused
from kvmtune.model.inside import GuestDiskScheduler, GuestDriver, GuestInside

MAX_FILE_BYTES = 64 * 1024
MAX_DISKS = 64
WORD = re.compile(r"[A-Za-z0-9_.:+-]{1,64}")
DISK_NAME = re.compile(r"[a-z][a-z0-9]{0,31}")
KERNEL_RELEASE = re.compile(r"[A-Za-z0-9_.+~-]{1,64}")
MOUNT_POINT = re.compile(r"/[\x21-\x7e]{0,255}")
DRIVER_TEXT = re.compile(r"[\x20-\x7e]{1,128}")

CLOCKSOURCE = "/sys/devices/system/clocksource/clocksource0"
HW_RANDOM = "/sys/devices/virtual/misc/hw_random"
TRIM_JOBS = (
    "/etc/systemd/system/timers.target.wants/fstrim.timer",
    "/etc/cron.weekly/fstrim",
    "/etc/cron.d/fstrim",
)


def _word(text: str | None) -> str | None:
    if text is None:
        return None
    text = text.strip()
    return text if WORD.fullmatch(text) else None


def _choices(text: str | None) -> tuple[str | None, tuple[str, ...]] | None:
    """``"[mq-deadline] kyber none"`` → ("mq-deadline", (all three)); None when it does not look like that."""
    if text is None:
        return None
    current = None
    names = []
    for token in text.split():
        bare = token.removeprefix("[").removesuffix("]")
        if not WORD.fullmatch(bare):
            return None
        if token.startswith("[") and token.endswith("]"):
            current = bare
        names.append(bare)
    return current, tuple(names)


class _Reader:
    def __init__(self, agent: Agent, inside: GuestInside, enabled: set[str] | None) -> None:
        self.agent = agent
        self.inside = inside
        self.enabled = enabled  # None: the agent did not say (old agents): try and see

    def offers(self, command: str) -> bool:
        if self.enabled is None or command in self.enabled:
            return True
        self.inside.blocked.append(command)
        return False

    def call(self, command: str, arguments: dict[str, Any] | None = None) -> Any:
        """The answer, or None when the agent refused this command (a timeout still ends the reading)."""
        try:
            return self.agent.call(command, arguments)
        except AgentRefused:
            return None

    def read_file(self, path: str) -> str | None:
        """The start of a guest file, or None when it cannot be opened (absent, or file access blocked)."""
        if not self.offers("guest-file-open"):
            return None
        handle = self.call("guest-file-open", {"path": path, "mode": "r"})
        if not isinstance(handle, int) or isinstance(handle, bool):
            return None
        try:
            reply = self.call("guest-file-read", {"handle": handle, "count": MAX_FILE_BYTES})
        finally:
            self.call("guest-file-close", {"handle": handle})
        if not isinstance(reply, dict) or not isinstance(reply.get("buf-b64"), str):
            self.inside.unreadable.append(path)
            return None
        try:
            data = base64.b64decode(reply["buf-b64"], validate=True)[:MAX_FILE_BYTES]
        except (binascii.Error, ValueError):
            self.inside.unreadable.append(path)
            return None
        return data.decode("ascii", "replace")

    def exists(self, path: str) -> bool | None:
        """True/False when the agent could tell, None when it could not (file access blocked)."""
        if not self.offers("guest-file-open"):
            return None
        try:
            handle = self.agent.call("guest-file-open", {"path": path, "mode": "r"})
        except AgentRefused as exc:
            return False if "No such file" in exc.desc or "not found" in exc.desc.lower() else None
        if isinstance(handle, int) and not isinstance(handle, bool):
            self.call("guest-file-close", {"handle": handle})
            return True
        return None


def _enabled_commands(info: Any) -> set[str] | None:
    if not isinstance(info, dict) or not isinstance(info.get("supported_commands"), list):
        return None
    return {c["name"] for c in info["supported_commands"]
            if isinstance(c, dict) and isinstance(c.get("name"), str) and c.get("enabled", True) is True}


def read_inside(agent: Agent, via: str, fallback_disks: tuple[str, ...] = ()) -> GuestInside:
    """Read what the rules judge; raises :class:`AgentError` when the agent does not answer at all."""
    inside = GuestInside(via=via)
    reader = _Reader(agent, inside, None)
    reader.enabled = _enabled_commands(agent.call("guest-info"))
    osinfo = reader.call("guest-get-osinfo") if reader.offers("guest-get-osinfo") else None
    if isinstance(osinfo, dict):
        inside.os_kind = "windows" if osinfo.get("id") == "mswindows" else "linux"
        release = osinfo.get("kernel-release")
        if isinstance(release, str) and KERNEL_RELEASE.fullmatch(release):
            inside.kernel_release = release
    if inside.os_kind == "windows":
        _windows_drivers(reader)
        return inside
    _schedulers(reader, fallback_disks)
    if inside.os_kind is None and (inside.schedulers or reader.read_file("/proc/version") is not None):
        inside.os_kind = "linux"  # an agent without guest-get-osinfo that reads Linux's files
    text = reader.read_file(f"{CLOCKSOURCE}/current_clocksource")
    inside.clocksource = _word(text)
    if text is not None and inside.clocksource is None:
        inside.unreadable.append("current_clocksource")
    available = _choices(reader.read_file(f"{CLOCKSOURCE}/available_clocksource"))
    inside.clocksources_available = available[1] if available else ()
    entropy = (reader.read_file("/proc/sys/kernel/random/entropy_avail") or "").strip()
    if entropy:
        if entropy.isdigit() and len(entropy) <= 7:
            inside.entropy_avail = int(entropy)
        else:
            inside.unreadable.append("entropy_avail")
    text = reader.read_file(f"{HW_RANDOM}/rng_current")
    inside.rng_current = _word(text)
    rngs = _choices(reader.read_file(f"{HW_RANDOM}/rng_available"))
    inside.rng_available = rngs[1] if rngs else ()
    thp = _choices(reader.read_file("/sys/kernel/mm/transparent_hugepage/enabled"))
    inside.thp_enabled = thp[0] if thp else None
    _trim(reader)
    return inside


def _schedulers(reader: _Reader, fallback_disks: tuple[str, ...]) -> None:
    disks: list[tuple[str, str | None]] = []
    answer = reader.call("guest-get-disks") if reader.offers("guest-get-disks") else None
    if isinstance(answer, list) and answer:  # an agent without udev's database may list none
        for entry in answer[:MAX_DISKS * 4]:
            if not isinstance(entry, dict) or entry.get("partition") is not False:
                continue
            name = entry.get("name")
            if not isinstance(name, str) or not name.startswith("/dev/"):
                continue
            short = name.removeprefix("/dev/")
            if not DISK_NAME.fullmatch(short):
                reader.inside.unreadable.append("a disk name")
                continue
            address = entry.get("address")
            bus = address.get("bus-type") if isinstance(address, dict) else None
            disks.append((short, bus if isinstance(bus, str) and WORD.fullmatch(bus) else None))
    else:
        disks = [(name, None) for name in fallback_disks if DISK_NAME.fullmatch(name)]
    for name, bus in disks[:MAX_DISKS]:
        text = reader.read_file(f"/sys/block/{name}/queue/scheduler")
        parsed = _choices(text)
        if parsed is None:
            if text is not None:
                reader.inside.unreadable.append(f"{name} scheduler")
            continue
        reader.inside.schedulers.append(GuestDiskScheduler(name, bus, parsed[0], parsed[1]))


def _trim(reader: _Reader) -> None:
    mounts = reader.read_file("/proc/mounts")
    discard: list[str] = []
    for line in (mounts or "").splitlines():
        fields = line.split()
        if len(fields) >= 4 and "discard" in fields[3].split(",") and MOUNT_POINT.fullmatch(fields[1]):
            discard.append(fields[1])
    reader.inside.discard_mounts = tuple(discard)
    seen = [reader.exists(path) for path in TRIM_JOBS]
    if any(seen):
        reader.inside.trim_scheduled = True
    elif all(s is False for s in seen):
        reader.inside.trim_scheduled = False


def _windows_drivers(reader: _Reader) -> None:
    answer = reader.call("guest-get-devices") if reader.offers("guest-get-devices") else None
    if not isinstance(answer, list):
        return
    for entry in answer[:4096]:
        if not isinstance(entry, dict):
            continue
        address = entry.get("address")
        pci = None
        if isinstance(address, dict) and address.get("type") == "pci":
            pci = address.get("data", address)  # QAPI unions: {"type", "data": {...}} or flat
        if not isinstance(pci, dict):
            continue
        vendor, device = pci.get("vendor-id"), pci.get("device-id")
        if not (isinstance(vendor, int) and isinstance(device, int) and 0 <= vendor <= 0xFFFF and 0 <= device <= 0xFFFF):
            reader.inside.unreadable.append("a device id")
            continue
        name, version = entry.get("driver-name"), entry.get("driver-version")
        reader.inside.drivers.append(GuestDriver(
            vendor, device,
            name if isinstance(name, str) and DRIVER_TEXT.fullmatch(name) else None,
            version if isinstance(version, str) and DRIVER_TEXT.fullmatch(version) else None,
        ))


__all__ = ["AgentError", "read_inside"]
