"""Running QEMU processes, read from /proc through the host root."""

from __future__ import annotations

from kvmtune.errors import InputError
from kvmtune.host.process import is_qemu_binary
from kvmtune.host.root import HostRoot
from kvmtune.model.guest import Guest
from kvmtune.qemu.agent_channel import agent_socket_path
from kvmtune.qemu.argv import split_proc_cmdline
from kvmtune.qemu.cmdline import guest_from_argv


def running_qemu_guests(host: HostRoot) -> tuple[list[Guest], list[str]]:
    guests: list[Guest] = []
    errors: list[str] = []
    for entry in host.listdir("/proc"):
        if not entry.isdigit():
            continue
        data = host.read_bytes(f"/proc/{entry}/cmdline")
        if not data:
            continue
        argv = split_proc_cmdline(data)
        if not argv or not is_qemu_binary(argv[0]):
            continue
        owner: tuple[int, int] | None = None
        if host.is_live:
            # argv[0] is chosen by whoever started the process; the executable is not
            exe = host.readlink(f"/proc/{entry}/exe")
            if exe is None or not is_qemu_binary(exe.removesuffix(" (deleted)")):
                continue
            owner = host.owner(f"/proc/{entry}")
            if owner is None:
                continue
        try:
            guest = guest_from_argv(argv, f"/proc/{entry}/cmdline", host=host)
        except InputError as exc:
            errors.append(str(exc))
            continue
        guest.active = True
        guest.on_audited_host = True  # a process of the host whose /proc this is
        guest.process_owner = owner
        guest.images_here = host.is_live
        guest.agent_channel, guest.agent_socket = agent_socket_path(argv)
        if guest.name == "?":
            guest.name = f"qemu-pid-{entry}"
        guests.append(guest)
    return guests, errors
