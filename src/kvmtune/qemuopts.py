"""The one way a value becomes part of an option string for QEMU, qemu-storage-daemon, qemu-img, fio, ``qm`` or ``ip``.

QEMU's option strings are ``key=value`` lists split on ``,`` (a doubled ``,,`` is a comma in a value), and
when a key repeats the *last* one wins. A value pasted into such a string unchecked can therefore add keys:
``io='threads,filename=/etc/shadow'`` in a domain definition would swap that file in for a scratch replica.
Every value that came from a definition, a command line, a config or a guest reaches an option through here:

- enumerations (:class:`Cache`, :class:`Aio`, :class:`Discard`, :class:`DetectZeroes`, :class:`ImageFormat`,
  :class:`Preallocation`) are allow-lists; :func:`enum_value` turns a word into one or says it is not one QEMU knows;
  :data:`CACHE_MODES` is what each cache mode becomes in QEMU's flags (:class:`CacheMode`);
- numbers are ``int`` (``bool`` becomes ``on``/``off``);
- paths (:class:`pathlib.Path`) and free text (:class:`Text`) are escaped: ``,`` doubled; a path must be
  absolute (QEMU reads ``json:…`` or ``nbd:…`` before the first ``/`` as a protocol);
- a plain ``str`` must be a :func:`word` (letters, digits, ``_ . - : + @ /``), which cannot carry a key;
- control characters, NUL and line or paragraph separators are refused everywhere.

Anything else raises :class:`OptionError`, an input error: one line naming the option and the value.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import PurePath
from typing import TypeVar

from kvmtune.errors import InputError


class OptionError(InputError):
    """A value that cannot be put into an option string; ``where`` names the option."""

    def __init__(self, option: str, problem: str) -> None:
        super().__init__(option, problem)


# --- the enumerations ---------------------------------------------------------------------------
# ``DEFAULT`` is libvirt's word for "not stated" (the hypervisor's default): a model value, never sent to QEMU.

class Cache(StrEnum):
    """A disk's cache mode (libvirt ``<driver cache=…>``; QEMU ``-drive cache=``)."""

    NONE = "none"
    WRITETHROUGH = "writethrough"
    WRITEBACK = "writeback"
    DIRECTSYNC = "directsync"
    UNSAFE = "unsafe"
    DEFAULT = "default"


@dataclass(frozen=True)
class CacheMode:
    """What libvirt's ``<driver cache=…>`` becomes in QEMU.

    libvirt's ``qemuDomainDiskCachemodeFlags()`` (src/qemu/qemu_domain.c) turns each mode into three flags;
    ``qemuBlockStorageSourceGetBlockdevGetCacheProps()`` (src/qemu/qemu_block.c) puts ``direct`` and
    ``no-flush`` on the ``-blockdev`` as ``cache.direct`` / ``cache.no-flush``, and qemu_command.c puts
    ``writeback`` on the guest device as ``write-cache=on|off``. QEMU documents the same table under
    ``-drive cache=`` (qemu-options: cache.writeback / cache.direct / cache.no-flush). With no guest
    device, the NBD export's ``writethrough=on`` plays ``write-cache=off``: QEMU flushes after every
    write before completing it.
    """

    direct: bool
    no_flush: bool
    write_cache: bool


CACHE_MODES = {
    "none": CacheMode(direct=True, no_flush=False, write_cache=True),
    "writethrough": CacheMode(direct=False, no_flush=False, write_cache=False),
    "writeback": CacheMode(direct=False, no_flush=False, write_cache=True),
    "directsync": CacheMode(direct=True, no_flush=False, write_cache=False),
    "unsafe": CacheMode(direct=False, no_flush=True, write_cache=True),
}


class Aio(StrEnum):
    """A disk's AIO mode (libvirt ``<driver io=…>``; QEMU ``aio=``)."""

    THREADS = "threads"
    NATIVE = "native"
    IO_URING = "io_uring"
    DEFAULT = "default"


class Discard(StrEnum):
    """Whether guest discards reach the storage (libvirt ``discard=``; QEMU ``discard=``, with ``on``/``off``
    as QEMU's aliases of ``unmap``/``ignore``: :data:`ALIASES`)."""

    UNMAP = "unmap"
    IGNORE = "ignore"
    DEFAULT = "default"


class DetectZeroes(StrEnum):
    """libvirt ``detect_zeroes=``; QEMU ``detect-zeroes=``."""

    OFF = "off"
    ON = "on"
    UNMAP = "unmap"
    DEFAULT = "default"


class ImageFormat(StrEnum):
    """The image formats kvmtune creates or opens scratch images in."""

    RAW = "raw"
    QCOW2 = "qcow2"


class Preallocation(StrEnum):
    """``qemu-img create -o preallocation=``."""

    OFF = "off"
    METADATA = "metadata"
    FALLOC = "falloc"
    FULL = "full"


# words QEMU also takes for a value, and what they mean
ALIASES: dict[type[StrEnum], dict[str, str]] = {Discard: {"on": "unmap", "off": "ignore"}}
# what each enumeration is called in a note ("io mode 'x' is not one QEMU knows")
KINDS: dict[type[StrEnum], str] = {
    Cache: "cache mode", Aio: "io mode", Discard: "discard mode", DetectZeroes: "detect_zeroes mode",
    ImageFormat: "image format", Preallocation: "preallocation",
}

E = TypeVar("E", bound=StrEnum)


def enum_value(kind: type[E], raw: str) -> E | None:
    """``raw`` (as written: any case, surrounding blanks) as a member of ``kind``; ``None`` if QEMU does not know it."""
    word = raw.strip().lower()
    word = ALIASES.get(kind, {}).get(word, word)
    try:
        return kind(word)
    except ValueError:
        return None


def unknown_line(kind: type[StrEnum], raw: str) -> str:
    """The model's note for a value that is not a member of ``kind``."""
    return f"{KINDS.get(kind, kind.__name__)} {raw!r} is not one QEMU knows"


def member(option: str, kind: type[E], raw: str) -> E:
    """``raw`` as a member of ``kind``, or an :class:`OptionError` naming ``option``."""
    value = enum_value(kind, raw)
    if value is None:
        raise OptionError(option, unknown_line(kind, raw))
    return value


# --- values -------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Text:
    """Free text for an option value (a serial, a label): escaped, never split."""

    value: str


@dataclass(frozen=True, slots=True)
class Escaped:
    """A value this module has already escaped (:func:`unix_socket`): taken as it is."""

    text: str


Value = StrEnum | int | PurePath | Text | Escaped | str
_WORD = re.compile(r"[A-Za-z0-9_.:+@/-]*")
_KEY = re.compile(r"[a-z][a-z0-9_.-]*")
_FIO_KEY = re.compile(r"[a-z][a-z0-9_]*")


def _refuse_controls(option: str, text: str) -> None:
    for ch in text:
        if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp", "Cs") or ch in "\x85":
            raise OptionError(option, f"value {text!r} holds the control or separator character {ch!r}")


def word(option: str, value: str) -> str:
    """A value with no separator in it: letters, digits and ``_ . - : + @ /``."""
    if not value or not _WORD.fullmatch(value):
        raise OptionError(option, f"value {value!r} is not a plain word")
    return value


def path_value(option: str, path: PurePath | str) -> str:
    """An absolute path as a keyval value: commas doubled, control characters refused."""
    text = str(path)
    _refuse_controls(option, text)
    if not text.startswith("/"):
        raise OptionError(option, f"path {text!r} is not absolute")
    return text.replace(",", ",,")


def value_text(option: str, value: Value) -> str:
    """``value`` as it goes after ``option=`` in a QEMU keyval string."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, StrEnum):
        if value.value == "default":
            raise OptionError(option, "'default' is libvirt's word for not stating it, not a QEMU value")
        return value.value
    if isinstance(value, int):
        return str(value)
    if isinstance(value, PurePath):
        return path_value(option, value)
    if isinstance(value, Text):
        _refuse_controls(option, value.value)
        return value.value.replace(",", ",,")
    if isinstance(value, Escaped):
        return value.text
    if isinstance(value, str):
        return word(option, value)
    raise OptionError(option, f"a {type(value).__name__} is not an option value")


def unix_socket(path: PurePath) -> Escaped:
    """``unix:PATH`` for ``-qmp``/``-chardev``-style addresses, the path escaped."""
    return Escaped("unix:" + path_value("unix:", path))


def keyval(*pairs: tuple[str, Value | None], first: Value | None = None) -> str:
    """``key=value,…`` for QEMU and qemu-storage-daemon (``-drive``, ``--blockdev``, ``-device``, ``-o``).

    ``first``: an implied first value without a key (``-device virtio-blk-pci,…``, ``-netdev tap,…``,
    ``-name GUEST,…``). A pair whose value is ``None`` is left out.
    """
    parts = [value_text("first value", first)] if first is not None else []
    for key, value in pairs:
        if not _KEY.fullmatch(key):
            raise OptionError(key, "is not an option key")
        if value is not None:
            parts.append(f"{key}={value_text(key, value)}")
    return ",".join(parts)


def fio_option(key: str, value: Value) -> str:
    """``--key=value`` for fio. fio splits a file name on ``:`` (escaped as ``\\:``), sizes and other
    values on ``,``, and expands ``$``; a value is a word, a number, an enumeration or an absolute path."""
    if not _FIO_KEY.fullmatch(key):
        raise OptionError(f"--{key}", "is not a fio option")
    option = f"--{key}"
    if isinstance(value, PurePath):
        text = str(value)
        _refuse_controls(option, text)
        if not text.startswith("/") or "," in text or "$" in text:
            raise OptionError(option, f"path {text!r} is not an absolute path fio takes as one file")
        return f"{option}={text.replace(':', chr(92) + ':')}"
    if isinstance(value, Text):
        raise OptionError(option, "fio takes no free text")
    if isinstance(value, str) and not isinstance(value, StrEnum) and any(c in value for c in ",$:"):
        raise OptionError(option, f"value {value!r} is not a plain word")
    return f"{option}={value_text(option, value)}"


def fio_nbd_uri(export: str, socket: PurePath | str) -> str:
    """``--uri=nbd+unix:///EXPORT?socket=PATH`` for fio's nbd engine: a word for the export, an absolute socket
    path with no character a URI or fio gives a meaning to."""
    text = str(socket)
    _refuse_controls("--uri", text)
    if not text.startswith("/") or any(c in text for c in ",$?&#%"):
        raise OptionError("--uri", f"socket path {text!r} is not an absolute path fio takes whole")
    return "--uri=nbd+unix:///" + word("--uri", export) + "?socket" + "=" + text


def fio_counts(key: str, values: Sequence[int], sep: str = ",") -> str:
    """``--key=A,B`` (``rate_iops`` per direction) from non-negative integers only; ``sep`` is ``,`` or ``:``."""
    if not _FIO_KEY.fullmatch(key) or sep not in (",", ":") or not values:
        raise OptionError(f"--{key}", "is not a fio option taking a list of counts")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 53:
            raise OptionError(f"--{key}", f"{v!r} is not a count")
    return f"--{key}=" + sep.join(str(v) for v in values)


def fio_bssplit(entries: Sequence[tuple[int, int]]) -> str:
    """``--bssplit=SIZE/PCT:SIZE/PCT`` from (bytes, percent) integer pairs: sizes 1 B to 64 MiB, percents 0-100."""
    if not entries or len(entries) > 64:
        raise OptionError("--bssplit", "takes 1 to 64 sizes")
    parts = []
    for size, pct in entries:
        for v, hi in ((size, 64 << 20), (pct, 100)):
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= hi:
                raise OptionError("--bssplit", f"{v!r} is not an integer in [0, {hi}]")
        if size < 1:
            raise OptionError("--bssplit", "a size of 0 bytes")
        parts.append(f"{size}/{pct}")
    return "--bssplit=" + ":".join(parts)


def whole_path(option: str, path: PurePath | str) -> str:
    """An absolute path a tool takes whole (``nsenter --net=``, ``qemu-img dd of=``): no comma, no control."""
    text = str(path)
    _refuse_controls(option, text)
    if not text.startswith("/") or "," in text:
        raise OptionError(option, f"path {text!r} is not an absolute path without a comma")
    return text


def file_argument(option: str, path: PurePath | str) -> str:
    """A path as a positional argument (``qemu-img create … FILENAME``): absolute, so QEMU reads no protocol
    prefix (``json:``, ``nbd:``) from it; controls refused; a comma is literal there, so it is not doubled."""
    text = str(path)
    _refuse_controls(option, text)
    if not text.startswith("/"):
        raise OptionError(option, f"path {text!r} is not absolute")
    return text


def long_option(key: str, value: Value) -> str:
    """``--key=value`` for any other tool (``setpriv``, ``nsenter``, ``qm``): a path is taken whole
    (:func:`whole_path`), any other value as in :func:`keyval`."""
    if not _KEY.fullmatch(key):
        raise OptionError(f"--{key}", "is not an option key")
    option = "--" + key
    text = whole_path(option, value) if isinstance(value, PurePath) else value_text(option, value)
    return option + "=" + text


def operand(key: str, value: Value) -> str:
    """``key=value`` as one argument of ``qemu-img dd`` (split at its first ``=``, the rest taken whole): a
    path whole (:func:`whole_path`), a pinned ``json:`` image spec as :class:`Text` with controls refused."""
    if not _KEY.fullmatch(key):
        raise OptionError(key, "is not an operand")
    if isinstance(value, PurePath):
        return key + "=" + whole_path(key, value)
    if isinstance(value, Text):
        _refuse_controls(key, value.value)
        return key + "=" + value.value
    return key + "=" + value_text(key, value)
