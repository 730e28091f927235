"""A QEMU command line as words and options: splitting the text (``.args`` files, shell lines, start scripts,
``/proc/PID/cmdline``), QEMU's ``key=value`` option syntax (and JSON objects), and the options in order.

:mod:`kvmtune.qemu.cmdline` reads a :class:`~kvmtune.model.guest.Guest` from these options; live sampling reads
them directly (a QEMU process's threads, sockets and devices).
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from typing import Any

_ENV_ASSIGN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")

# options that take no argument (all others take exactly one)
_FLAGS = {
    "-S", "-nodefaults", "-no-user-config", "-no-shutdown", "-no-reboot", "-enable-kvm",
    "-nographic", "-snapshot", "-no-hpet", "-no-acpi", "-daemonize", "-no-fd-bootchk",
    "-enable-fips", "-full-screen", "-win2k-hack", "-old-param", "-no-kvm", "-s", "-preconfig",
    "-version", "-help", "-h", "-no-quit", "-usb", "-disable-ssp",
}

# the first bare word of these options is the value of this key
_IMPLIED_KEY = {
    "-device": "driver", "-netdev": "type", "-machine": "type", "-M": "type", "-cpu": "model",
    "-smp": "cpus", "-m": "size", "-object": "qom-type", "-accel": "accel", "-chardev": "backend",
    "-name": "guest", "-nic": "type", "-net": "type", "-blockdev": "driver", "-balloon": "model",
}

# the short options that stand for a -drive (QEMU's drive_add with these interfaces)
LEGACY_DRIVE_OPTIONS = {
    "-hda": "ide", "-hdb": "ide", "-hdc": "ide", "-hdd": "ide", "-cdrom": "ide", "-pflash": "pflash",
    "-fda": "floppy", "-fdb": "floppy", "-mtdblock": "mtd", "-sd": "sd",
}


@dataclass
class Option:
    name: str  # "-device"
    value: str | None
    index: int  # position among the options, for evidence
    props: dict[str, Any]
    where: str | None = None  # a -readconfig file's section: its file and line, cited instead of the position

    @property
    def label(self) -> str:
        return self.where or f"{self.name} #{self.index}"


def split_args_text(text: str) -> list[str]:
    """Split a command line written as text (``.args`` file, a shell line or a small start script).

    Whole comment lines (``#!/bin/sh``, ``# notes``) are dropped and a leading ``exec`` is skipped,
    so a hand-written ``exec qemu-system-x86_64 \\ ...`` script reads as its command line.
    """
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    joined = re.sub(r"\\\r?\n", " ", text)
    try:
        words = shlex.split(joined, comments=False, posix=True)
    except ValueError as exc:
        raise ValueError(f"cannot split the command line: {exc}") from None
    while words and (_ENV_ASSIGN.match(words[0]) or words[0] == "exec") and not words[0].startswith("-"):
        words.pop(0)
    return words


def split_proc_cmdline(data: bytes) -> list[str]:
    return [w.decode("utf-8", "replace") for w in data.split(b"\0") if w]


def parse_keyval(text: str, implied: str | None = None) -> dict[str, Any]:
    """QEMU's ``key=value,key2=value2`` with ``,,`` as an escaped comma.

    A JSON object (``{...}``) is returned decoded. Dotted keys are kept flat
    (``cache.direct``), JSON objects are flattened the same way.
    """
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            data = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise ValueError(f"invalid JSON option value: {exc.msg}") from None
        except RecursionError:  # another user's QEMU may carry it: a line, not a traceback
            raise ValueError("JSON option value nested too deeply to read") from None
        if not isinstance(data, dict):
            raise ValueError("JSON option value is not an object")
        return _flatten(data)
    parts: list[str] = []
    buf: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == ",":
            if i + 1 < len(text) and text[i + 1] == ",":
                buf.append(",")
                i += 2
                continue
            parts.append("".join(buf))
            buf = []
        else:
            buf.append(ch)
        i += 1
    parts.append("".join(buf))
    out: dict[str, Any] = {}
    for n, part in enumerate(parts):
        if not part:
            continue
        if "=" in part:
            key, val = part.split("=", 1)
            out[key] = val
        elif n == 0 and implied:
            out[implied] = part
        else:
            out[part] = "on"
    return out


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, val in data.items():
        full = f"{prefix}{key}"
        if isinstance(val, dict):
            out[full] = val  # keep the nested form too (blockdev "file" children)
            out.update(_flatten(val, full + "."))
        else:
            out[full] = val
    return out


DEFAULT_BINARY = "qemu-system-x86_64"


def is_qemu_binary(word: str) -> bool:
    base = word.rsplit("/", 1)[-1]
    return base.startswith("qemu-system-") or base in ("qemu-kvm", "kvm") or base.startswith("qemu-kvm")


def parse_options(argv: list[str], default_binary: str | None = None) -> tuple[str, list[Option]]:
    """Return (binary, options). Raises ValueError when this is no QEMU command line.

    With ``default_binary``, an argument list whose first word is an option (the binary passed separately, as
    Packer, Multipass and Kata log it) is read as that binary's; one option alone stays a fragment, refused.
    """
    if not argv:
        raise ValueError("empty command line")
    binary = argv[0]
    base = binary.rsplit("/", 1)[-1]
    start = 1
    if default_binary is not None and binary.startswith("-") and len(binary) > 1:
        binary, start = default_binary, 0
    elif not is_qemu_binary(binary):
        raise ValueError(f"not a QEMU system emulator command line (starts with {base!r})")
    options: list[Option] = []
    i = start
    index = 0
    while i < len(argv):
        word = argv[i]
        if not word.startswith("-"):
            # a bare word is the disk image (qemu-system-x86_64 disk.img)
            options.append(Option("-hda", word, index, {"file": word}))
            i += 1
            index += 1
            continue
        name = "-" + word.lstrip("-")  # --device == -device
        if name in _FLAGS or i + 1 >= len(argv):
            options.append(Option(name, None, index, {}))
            i += 1
        else:
            value = argv[i + 1]
            props = parse_keyval(value, _IMPLIED_KEY.get(name)) if name in _IMPLIED_KEY or name in (
                "-drive", "-blockdev", "-overcommit", "-mem-prealloc", "-numa", "-global"
            ) else {}
            options.append(Option(name, value, index, props))
            i += 2
        index += 1
    if start == 0 and len(options) < 2:
        raise ValueError(f"a single option ({argv[0]!r}), a fragment of a QEMU command line, not an argument list "
                         "to audit")
    return binary, options
