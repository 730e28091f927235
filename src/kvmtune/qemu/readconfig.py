"""QEMU's configuration-file format (``-readconfig FILE``), as LXD and Incus write it.

``[group]`` or ``[group "id"]`` section lines, then ``key = "value"`` lines, ``#`` comments and blank
lines (QEMU's ``qemu_config_parse``: a key up to 63 characters, a value up to 1023, no quote inside it).
Each section is the option of the same name on a command line (``[device "d0"]`` is ``-device id=d0,…``),
applied where ``-readconfig`` stands among the options, so an option before it is overridden by the file
and one after it overrides the file, as QEMU merges them.

The file is another program's: read as hostile input (a regular file, a size cap, beneath ``--root`` for a
captured tree), and a line QEMU would refuse refuses the file, naming its line.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from kvmtune.errors import InputError
from kvmtune.host.root import HostReadError, HostRoot
from kvmtune.inputs import read_regular

MAX_CONFIG_BYTES = 1024 * 1024

# section -> the command-line option it stands for
SECTIONS = {
    "machine": "-machine", "accel": "-accel", "memory": "-m", "smp-opts": "-smp", "name": "-name",
    "global": "-global", "boot-opts": "-boot", "numa": "-numa", "mon": "-mon", "object": "-object",
    "device": "-device", "drive": "-drive", "netdev": "-netdev", "chardev": "-chardev", "fsdev": "-fsdev",
    "rtc": "-rtc", "realtime": "-realtime", "overcommit": "-overcommit",
}

# qemu-server's own files (Proxmox VE's package puts them in /usr/share/qemu-server/): USB controllers, an audio
# device, PCI bridges and PCIe root ports only, never an accelerator, memory, disk, NIC, balloon or RNG. One of them
# that cannot be read withholds no finding.
DEVICE_ONLY_FILES = frozenset({"/usr/share/qemu-server/pve-q35.cfg", "/usr/share/qemu-server/pve-q35-4.0.cfg",
                               "/usr/share/qemu-server/pve-usb.cfg"})

_SECTION = re.compile(r'\[([A-Za-z0-9_.-]{1,63})(?:\s+"([^"\n]{0,63})")?\]')
_KEY_VALUE = re.compile(r'([^\s=\[\]"]{1,63})\s*=\s*"([^"\n]{0,1023})"')
# the first line of such a file: a section, or a comment before one (LXD starts with "# Machine")
_LOOKS_LIKE = re.compile(rb'\A(?:\s*#[^\n]*\n|\s*\n)*\s*\[[A-Za-z0-9_.-]{1,63}(?:\s+"[^"\n]{0,63}")?\]\s*(?:\n|\Z)')


@dataclass
class ConfigSection:
    option: str  # "-device"
    props: dict[str, Any]
    where: str  # "qemu.conf:12 [device \"dev-lxd_root\"]"


@dataclass
class ConfigFile:
    path: str
    sections: list[ConfigSection] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def looks_like_config(data: bytes) -> bool:
    """Whether ``data`` is written in QEMU's configuration-file format rather than as a command line."""
    return bool(_LOOKS_LIKE.match(data[:4096]))


def parse_config(text: str, path: str, name: str | None = None) -> ConfigFile:
    """The sections of a ``-readconfig`` file (``name``: how evidence cites it, default its base name);
    :class:`InputError` naming the line QEMU would refuse."""
    if "\0" in text:
        raise InputError(path, "a NUL byte in a QEMU configuration file; not read")
    name = name or os.path.basename(path)
    out = ConfigFile(path)
    current: ConfigSection | None = None
    seen = False
    for number, raw in enumerate(text.split("\n"), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _SECTION.fullmatch(line)
        if m:
            seen = True
            group, ident = m.group(1), m.group(2)
            option = SECTIONS.get(group)
            if option is None:
                out.notes.append(f"{path}:{number}: section [{group}] not read (kvmtune does not know it)")
                current = None
                continue
            props: dict[str, Any] = {} if ident is None else {"id": ident}
            shown = f'[{group} "{ident}"]' if ident is not None else f"[{group}]"
            current = ConfigSection(option, props, f"{name}:{number} {shown}")
            out.sections.append(current)
            continue
        kv = _KEY_VALUE.fullmatch(line)
        if kv is None:
            raise InputError(f"{path}:{number}", "not a QEMU configuration line (expected [section] or "
                             'key = "value")')
        if current is not None:
            current.props[kv.group(1)] = kv.group(2)  # a key given twice: the last one counts, as in QEMU
        elif not seen:
            raise InputError(f"{path}:{number}", "a key = \"value\" line before any [section]")
    return out


def read_config(value: str, host: HostRoot) -> tuple[ConfigFile, str | None]:
    """The ``-readconfig`` file ``value`` names: an absolute path beneath ``host``'s root, a relative one against
    the current directory (QEMU's own is unknown; the second item says so). :class:`InputError` when not read."""
    note = None
    if value.startswith("/"):
        try:
            target = str(host.beneath(value))
        except HostReadError as exc:
            raise InputError(value, exc.problem) from None
        shown = value if host.is_live else f"{value} (beneath {host.path})"
    else:
        target, shown = value, value
        note = (f"-readconfig {value}: a relative path, read against the current directory "
                f"({os.getcwd()}); QEMU's own working directory is unknown")
    try:
        data = read_regular(target, MAX_CONFIG_BYTES, " (a QEMU configuration file)")
    except InputError as exc:
        raise InputError(shown, exc.problem) from None
    return parse_config(data.decode("utf-8", "replace"), shown, os.path.basename(value)), note
