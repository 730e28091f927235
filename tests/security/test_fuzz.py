"""Property tests over the untrusted inputs (issue 19 and issue 20): domain XML, QEMU command lines, partition
tables, image headers and backing names. Each reader either returns its model or raises the one-line
InputError, never anything else; and on real images, under a Python audit hook, nothing outside the allowed
set is opened, connected to or executed."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvmtune.domain.xml import guest_from_tree, parse_xml_bytes
from kvmtune.errors import InputError
from kvmtune.qemu.cmdline import guest_from_argv, guest_from_text
from kvmtune.qemu.image import KNOWN_FORMATS, ImageError, read_image
from kvmtune.qemu.partitions import parse_partition_table
from kvmtune.runner import Runner
from kvmtune.textsafe import safe

FUZZ = settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
CONTROL = st.sampled_from(["\x1b]0;x\x07", "\x1b[2J", "\n", "\r", "\x00", "\u202e", "\x9b", ",", ",,", "=", "'", '"'])
WORD = st.one_of(st.text(min_size=0, max_size=30), CONTROL,
                 st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-.:/", min_size=1, max_size=30))


# -- domain XML -> model ------------------------------------------------------------------------

ELEMENTS = ["name", "memory", "currentMemory", "vcpu", "cpu", "os", "devices", "disk", "driver", "source", "target",
            "interface", "model", "memoryBacking", "hugepages", "numatune", "cputune", "vcpupin", "iothreads",
            "controller", "memballoon", "rng", "backend", "feature", "features", "clock", "timer", "hostdev"]
ATTRS = ["type", "device", "name", "cache", "io", "dev", "bus", "file", "unit", "mode", "model", "queues", "cpuset",
         "vcpu", "placement", "discard", "iothread", "present", "size", "nodeset", "memory", "bridge", "network"]


@st.composite
def element(draw: Any, depth: int = 0) -> str:
    tag = draw(st.sampled_from(ELEMENTS))
    attrs = draw(st.dictionaries(st.sampled_from(ATTRS), WORD, max_size=4))
    attr_text = "".join(f" {k}=\"{_xml_escape(v)}\"" for k, v in attrs.items())
    children = draw(st.lists(element(depth + 1), max_size=3)) if depth < 3 else []
    text = _xml_escape(draw(WORD)) if not children else ""
    return f"<{tag}{attr_text}>{text}{''.join(children)}</{tag}>"


def _xml_escape(s: str) -> str:
    s = "".join(c if (c in "\t\n\r" or ord(c) >= 0x20) and c not in "\ufffe\uffff" and not 0xD800 <= ord(c) <= 0xDFFF
                else f"&#x{ord(c):x};" if c in "\t\n\r" else "?" for c in s)
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


@FUZZ
@given(body=st.lists(element(), max_size=6), domain_type=WORD)
def test_domain_xml_to_model_never_crashes(body: list[str], domain_type: str) -> None:
    doc = f"<domain type=\"{_xml_escape(domain_type)}\">{''.join(body)}</domain>".encode()
    try:
        guest = guest_from_tree(parse_xml_bytes(doc, "fuzz.xml"), "fuzz.xml")
    except InputError as exc:
        assert "\n" not in safe(exc)
        return
    assert isinstance(guest.name, str)
    for d in guest.disks:
        assert d.format is None or isinstance(d.format, str)


@FUZZ
@given(data=st.binary(max_size=400))
def test_arbitrary_bytes_as_domain_xml(data: bytes) -> None:
    try:
        guest_from_tree(parse_xml_bytes(data, "fuzz.xml"), "fuzz.xml")
    except InputError as exc:
        assert str(exc).startswith("fuzz.xml")


# -- QEMU command line ---------------------------------------------------------------------------

OPTIONS = ["-name", "-m", "-smp", "-cpu", "-machine", "-accel", "-enable-kvm", "-drive", "-blockdev", "-device",
           "-netdev", "-object", "-chardev", "-mem-path", "-mem-prealloc", "-overcommit", "-numa", "-iothread",
           "-hda", "-cdrom", "-nic", "-net", "-boot", "-append", "-kernel", "-incoming", "-S", "-nodefaults"]
VALUES = st.one_of(
    WORD,
    st.builds(lambda kv: ",".join(f"{k}={v}" for k, v in kv),
              st.lists(st.tuples(st.sampled_from(["file", "format", "if", "cache", "driver", "id", "node-name",
                                                 "drive", "netdev", "aio", "size", "guest", "queues", "bus",
                                                 "cache.direct", "file.filename", "backing", "discard"]), WORD),
                       max_size=6)),
    st.builds(lambda d: "{" + ",".join(f'"{k}":{v}' for k, v in d.items()) + "}",
              st.dictionaries(st.sampled_from(["driver", "node-name", "file", "cache", "filename", "id", "qom-type"]),
                              st.sampled_from(['"raw"', '"qcow2"', '"file"', "1", "true", "null", '{"driver":"file"}',
                                               '"x"', "[]"]), max_size=5)),
    st.sampled_from(["1G", "99999999999T", "-1", "0x10", "2,maxcpus=-5", "4,sockets=0", "nan", "1e400"]),
)


@FUZZ
@given(argv=st.lists(st.tuples(st.sampled_from(OPTIONS), VALUES), max_size=12),
       binary=st.sampled_from(["qemu-system-x86_64", "/usr/libexec/qemu-kvm", "qemu-system-aarch64"]))
def test_qemu_argv_never_crashes(argv: list[tuple[str, str]], binary: str) -> None:
    flat = [binary] + [w for pair in argv for w in pair]
    try:
        guest = guest_from_argv(flat, "fuzz.args")
    except InputError as exc:
        assert str(exc).startswith("fuzz.args")
        return
    assert isinstance(guest.name, str)


@FUZZ
@given(text=st.text(max_size=300))
def test_qemu_command_line_text_never_crashes(text: str) -> None:
    try:
        guest_from_text("qemu-system-x86_64 " + text, "fuzz.args")
    except InputError:
        pass


# -- partition tables ----------------------------------------------------------------------------

@st.composite
def disk(draw: Any) -> bytes:
    """A small disk: random MBR entries (extended chains included) or a GPT header with random entries."""
    size = 64 * 512
    buf = bytearray(draw(st.binary(max_size=1024)).ljust(size, b"\0"))
    if draw(st.booleans()):
        for i in range(4):
            t = draw(st.sampled_from([0, 0x83, 0x05, 0x0F, 0x85, 0xEE, 0x07]))
            start = draw(st.integers(0, 2**32 - 1))
            count = draw(st.integers(0, 2**32 - 1))
            buf[446 + 16 * i: 446 + 16 * (i + 1)] = struct.pack("<B3xB3xII", 0x80, t, start, count)
        buf[510:512] = b"\x55\xaa"
    if draw(st.booleans()):
        buf[512:520] = b"EFI PART"
        buf[512 + 72: 512 + 88] = struct.pack("<QII", draw(st.integers(0, 2**64 - 1)), draw(st.integers(0, 2**32 - 1)),
                                              draw(st.integers(0, 2**32 - 1)))
    return bytes(buf)


@FUZZ
@given(data=disk())
def test_partition_reader_terminates_on_any_table(data: bytes) -> None:
    reads = 0

    def read(offset: int, length: int) -> bytes:
        nonlocal reads
        reads += 1
        assert length <= 2 * 1024 * 1024, "a table must not make kvmtune read without bound"
        return data[offset: offset + length].ljust(length, b"\0") if offset < len(data) else b"\0" * length

    table = parse_partition_table(read, len(data))
    assert reads <= 200
    for p in table.partitions:
        assert p.start >= 0 and p.size >= 0


# -- image headers and backing names, on real images, under an audit hook --------------------------

_EVENTS: list[tuple[str, tuple[Any, ...]]] = []
_WATCH = threading.local()


def _hook(event: str, args: tuple[Any, ...]) -> None:
    if getattr(_WATCH, "on", False) and event in ("open", "socket.connect", "subprocess.Popen", "os.exec", "os.system"):
        _EVENTS.append((event, args))


sys.addaudithook(_hook)


@contextmanager
def watched() -> Iterator[list[tuple[str, tuple[Any, ...]]]]:
    _EVENTS.clear()
    _WATCH.on = True
    try:
        yield _EVENTS
    finally:
        _WATCH.on = False


HEADER_KINDS = ["qcow2", "qcow2-backing", "vmdk", "raw-zero", "random", "qcow2-garbage"]
# Protocols through unix sockets only: were a test ever to fail, no packet may leave this machine.
BACKING_NAMES = st.sampled_from([
    "nbd+unix:///x?socket=/run/kvmtune-fuzz-nonexistent.sock",
    'json:{"driver":"nbd","server":{"type":"unix","path":"/run/kvmtune-fuzz-nonexistent.sock"},"export":"x"}',
    "/etc/shadow", "../../../../etc/shadow", "BAIT", "file:/etc/shadow", "/dev/zero", "fuzz.img",
])


def _make(tmp: Path, kind: str, backing: str, noise: bytes) -> Path:
    img = tmp / "fuzz.img"
    bait = tmp / "bait.raw"
    bait.write_bytes(b"\0" * 512)
    name = str(bait) if backing == "BAIT" else backing
    if kind.startswith("qcow2"):
        argv = ["qemu-img", "create", "-q", "-f", "qcow2"]
        if kind == "qcow2-backing":
            argv += ["-u", "-b", name, "-F", "raw"]
        subprocess.run([*argv, str(img), "8M"], check=True, capture_output=True)
        if kind == "qcow2-garbage":
            with open(img, "r+b") as fh:
                fh.seek(8)
                fh.write(noise[:64])
    elif kind == "vmdk":
        subprocess.run(["qemu-img", "create", "-q", "-f", "vmdk", str(img), "8M"], check=True, capture_output=True)
    elif kind == "raw-zero":
        img.write_bytes(b"\0" * 65536)
    else:
        img.write_bytes(noise.ljust(65536, b"\0"))
    return img


@pytest.mark.skipif(shutil.which("qemu-img") is None, reason="qemu-img not installed")
@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(kind=st.sampled_from(HEADER_KINDS), backing=BACKING_NAMES, noise=st.binary(min_size=0, max_size=512),
       declared=st.sampled_from([None, "raw", "qcow2"]))
def test_image_headers_choose_nothing_kvmtune_opens(tmp_path_factory: pytest.TempPathFactory, kind: str, backing: str,
                                                     noise: bytes, declared: str | None) -> None:
    tmp = tmp_path_factory.mktemp("fuzzimg")
    img = _make(tmp, kind, backing, noise)
    runner = Runner()
    with watched() as events:
        try:
            read_image(str(img), runner, [], declared_format=declared)
        except ImageError:
            pass
    for event, args in events:
        assert event != "socket.connect", args
        if event == "open":
            path = str(args[0]) if args[0] is not None else ""
            if isinstance(args[0], int):
                continue
            allowed = (path == str(img) or path.startswith("/tmp/kvmtune-dd-") or "/kvmtune-dd-" in path
                       or path.startswith(("/proc/", "/sys/", "/dev/null", "/usr/", "/lib", "/etc/localtime"))
                       or path.startswith(sys.prefix) or path.startswith(os.path.dirname(os.__file__)))
            assert allowed, f"opened {path}"
        if event == "subprocess.Popen":
            argv = [str(a) for a in args[1]]
            assert argv[0] in ("qemu-img", "setpriv"), argv
            assert "--backing-chain" not in argv
            if declared is None:  # a probed header names no file kvmtune opens (a declared qcow2's is the host's)
                assert str(tmp / "bait.raw") not in " ".join(argv)
            targets = [a.removeprefix("if=") for a in argv if a.startswith(("json:", "if=json:"))]
            assert targets, argv
            for t in targets:
                _check_pinned(json.loads(t[5:]), declared is not None, img)


def _check_pinned(node: dict[str, Any], declared: bool, img: Path) -> None:
    """One layer: a format (or none: probe) over a local file; a backing layer only from a declared format."""
    assert set(node) <= {"driver", "file", "backing"}, node
    assert node["file"]["driver"] in ("file", "host_device") and set(node["file"]) == {"driver", "filename"}
    assert node["file"]["filename"].startswith("/") and "://" not in node["file"]["filename"]
    assert node.get("driver") in (None, *KNOWN_FORMATS)
    backing = node.get("backing")
    if backing is not None:
        assert declared, "a probed format never opens a backing file"
        assert node["file"]["filename"] != backing["file"]["filename"]
        _check_pinned(backing, declared, img)
