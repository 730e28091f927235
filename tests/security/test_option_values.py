"""Hostile values against every attribute that reaches an option string (issue 43, item 1).

QEMU's ``key=value,…`` keeps the last of two equal keys, so one unescaped comma in a value swaps in a file of the
value's choosing. Each test feeds commas, ``=``, newlines, NUL and Unicode line separators through the real code
path (the domain reader, ``layout_of``, the replica's argv, the probe guest's ``side_spec`` through the launcher's
``qemu_argv``, the storage bench's daemon) and parses the argv the way QEMU does: no option ever gains a key.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path, PurePath
from xml.sax.saxutils import quoteattr

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvmtune.audit.collect import add_domain_files
from kvmtune.audit.engine import AuditResult
from kvmtune.bench.storage.block import daemon_argv
from kvmtune.cli import main
from kvmtune.domain.xml import guest_from_tree, parse_xml_bytes
from kvmtune.errors import InputError, KvmtuneError
from kvmtune.lab.probe.pair import Unbootable
from kvmtune.lab.probe.side import GuestSide
from kvmtune.lab.replica import Layout, Unreplicable, create_replica
from kvmtune.qemuopts import (
    Aio,
    Cache,
    DetectZeroes,
    Discard,
    OptionError,
    Text,
    fio_nbd_uri,
    fio_option,
    keyval,
    operand,
)
from kvmtune.runner import Runner
from kvmtune.verify.block.pair import _blockdev, layout_of
from probe_helpers import qemu_args

HOSTILE_WORDS = [
    "threads,filename=/etc/passwd", "none,,file=/x", "unmap\nfilename=/x", "io_uring\x00", "native\u2028x=1",
    "native\u2029", "x\x85y=1", ",", "=", ",,", "threads,", "on,aio=native", "THREADS", " threads ", "default",
]
hostile = st.one_of(
    st.sampled_from(HOSTILE_WORDS),
    st.text(alphabet=st.sampled_from(list(",=\n\r\x00\u2028\u2029\x85\x0b \t/.:_-aefilnmo\u00e9")), max_size=24),
    st.text(max_size=16),
)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])




def keys_of(option: str) -> list[str]:
    """The keys QEMU reads from ``key=value,…`` (``,,`` is a comma inside a value; a part without ``=`` is the
    implied first value, shown as ``""``)."""
    keys: list[str] = []
    part: list[str] = []
    i = 0
    while True:
        at_end = i >= len(option)
        if at_end or (option[i] == "," and option[i + 1 : i + 2] != ","):
            text = "".join(part)
            keys.append(text.split("=", 1)[0] if "=" in text else "")
            if at_end:
                return keys
            part = []
            i += 1
            continue
        if option[i] == ",":
            i += 1  # the first of ",,"
        part.append(option[i])
        i += 1


def option_keys(argv: list[str]) -> list[list[str]]:
    return [keys_of(a) for a in argv if "=" in a and not a.startswith("-")]


def test_the_parser_sees_a_smuggled_key() -> None:
    assert keys_of("driver=file,filename=/a,aio=threads,filename=/b") == ["driver", "filename", "aio", "filename"]
    assert keys_of("driver=file,filename=/a,,b=c") == ["driver", "filename"]
    assert keys_of("virtio-blk-pci,drive=d") == ["", "drive"]


@given(st.text(max_size=40))
def test_keyval_never_gains_a_key(value: str) -> None:
    for wrapped in (Text(value), PurePath("/" + value.replace("\x00", "")), value):
        try:
            option = keyval(("driver", "file"), ("filename", wrapped), ("aio", Aio.THREADS))
        except OptionError:
            continue
        assert keys_of(option) == ["driver", "filename", "aio"]
        assert "\n" not in option and "\x00" not in option and "\u2028" not in option


@given(hostile)
def test_enumerations_refuse_everything_but_their_words(value: str) -> None:
    for kind in (Cache, Aio, Discard, DetectZeroes):
        try:
            option = keyval(("x", kind(value)))  # type: ignore[arg-type]
        except (ValueError, OptionError):
            continue
        assert option == f"x={value}" and value in {m.value for m in kind} and value != "default"


@given(hostile)
def test_fio_options_are_one_value(value: str) -> None:
    for opt in ("name", "rw", "bs", "size", "filename"):
        for wrapped in (value, PurePath("/" + value.replace("\x00", ""))):
            try:
                arg = fio_option(opt, wrapped)
            except OptionError:
                continue
            text = arg.split("=", 1)[1]
            assert "," not in text and "$" not in text and "\n" not in text
            assert ":" not in text.replace("\\:", "")  # fio splits file names on an unescaped colon
    try:
        uri = fio_nbd_uri("A", "/run/" + value)
    except OptionError:
        return
    assert uri.count("?") == 1 and "&" not in uri and "," not in uri


@given(hostile)
def test_qemu_img_dd_operands_are_one_argument(value: str) -> None:
    try:
        arg = operand("of", PurePath("/" + value))
    except OptionError:
        return
    assert arg.startswith("of=/") and "," not in arg and "\n" not in arg


def _disk_xml(attr: str, value: str, source: str = "/nonexistent/t.raw") -> bytes:
    return f"""<domain type='kvm'><name>t</name><memory>1048576</memory><vcpu>1</vcpu>
      <os><type arch='x86_64' machine='pc'>hvm</type></os><devices>
      <disk type='file' device='disk'><driver name='qemu' type='raw' cache='writethrough' io='threads'
        {attr}={quoteattr(value)}/><source file={quoteattr(source)}/><target dev='vda' bus='virtio'/></disk>
      </devices></domain>""".replace(f"{attr}='threads'", "").replace(f"{attr}='writethrough'", "").encode()


@pytest.mark.parametrize("attr", ["cache", "io", "discard", "detect_zeroes"])
@SETTINGS
@given(value=hostile)
def test_a_definitions_driver_attribute_never_reaches_the_blockdev_unchecked(attr: str, value: str,
                                                                            tmp_path: Path) -> None:
    try:
        guest = guest_from_tree(parse_xml_bytes(_disk_xml(attr, value), "t.xml"), "t.xml", "xml")
    except InputError:
        return  # not XML (NUL and most control characters): the reader refuses the file
    (disk,) = guest.disks
    read = getattr(disk, attr)
    assert read is None or read.value == value.strip().lower() or value.strip().lower() in ("on", "off")
    if read is None and value.strip():
        assert attr in disk.refused and "is not one QEMU knows" in disk.refused[attr]
        assert any(attr.replace("_", " ") in n or "mode" in n for n in guest.notes)
    try:
        lay, _ = layout_of(disk)
    except Unreplicable as exc:
        assert attr in disk.refused and disk.refused[attr] in str(exc)
        return
    argv = _blockdev("A", tmp_path / "replica-A.raw", lay)
    assert option_keys(argv) == [["driver", "node-name", "filename", "cache.direct", "cache.no-flush", "aio", "discard"],
                                 ["driver", "node-name", "file", "cache.direct", "cache.no-flush", "discard"]]


@SETTINGS
@given(value=hostile)
def test_a_scratch_path_is_escaped_in_the_blockdev(value: str) -> None:
    path = Path("/srv/" + value.replace("\x00", "") + "/replica-A.raw")
    try:
        argv = _blockdev("A", path, Layout())
    except OptionError:
        return
    (proto, _fmt) = option_keys(argv)
    assert proto == ["driver", "node-name", "filename", "cache.direct", "cache.no-flush", "aio", "discard"]


_GUEST_FIELDS = ["disk_cache", "disk_io", "disk_format", "scsi_model", "nic_model", "machine"]


@pytest.mark.parametrize("field", _GUEST_FIELDS)
@SETTINGS
@given(value=hostile)
def test_the_probe_guests_argv_never_gains_a_key(field: str, value: str) -> None:
    base = GuestSide(disk_bus="scsi", scsi_model="virtio-scsi", disk_iothread=True, nic_model="virtio", vhost=True,
                     nic_queues=2)
    expected = option_keys(qemu_args(base, "/w/disk.raw", tap="kt0"))
    try:
        argv = qemu_args(replace(base, **{field: value}), "/w/disk.raw", tap="kt0")
    except (Unbootable, KvmtuneError):
        return
    assert option_keys(argv) == expected


@SETTINGS
@given(value=hostile)
def test_the_probe_guests_disk_path_is_escaped(value: str) -> None:
    base = GuestSide(disk_bus="virtio")
    expected = option_keys(qemu_args(base, "/w/disk.raw"))
    try:
        argv = qemu_args(base, "/w/" + value)
    except (Unbootable, KvmtuneError):
        return
    assert option_keys(argv) == expected


@SETTINGS
@given(value=hostile)
def test_the_storage_benchs_daemon_never_gains_a_key(value: str) -> None:
    expected = option_keys(daemon_argv("/w/img.raw", "raw", "none", "native", Path("/w/s.sock")))
    for args in (("/w/" + value, "raw", "none", "native"), ("/w/i", value, "none", "native"),
                 ("/w/i", "raw", value, "native"), ("/w/i", "raw", "none", value)):
        try:
            argv = daemon_argv(*args, Path("/w/s.sock"))
        except (KvmtuneError, KeyError):
            continue
        assert option_keys(argv) == expected


def test_an_unknown_io_mode_is_a_note_on_the_audit(tmp_path: Path) -> None:
    victim = tmp_path / "victim.raw"
    f = tmp_path / "d.xml"
    f.write_bytes(_disk_xml("io", f"threads,filename={victim}"))
    result = AuditResult()
    add_domain_files([str(f)], result)
    (guest,) = result.guests
    assert guest.disks[0].io is None
    note = (f"t: disk:vda: io mode 'threads,filename={victim}' is not one QEMU knows "
            "(/domain/devices/disk[1]/driver/@io); not judged, never passed on")
    assert guest.notes == [note]
    out = tmp_path / "report.json"
    assert main(["audit", "--format", "json", "-o", str(out), str(f)]) in (0, 1)
    assert note in json.loads(out.read_text())["looked_at"]


def test_a_replica_in_a_directory_with_a_comma_is_made_at_that_very_path(tmp_path: Path) -> None:
    """qemu-img create's FILENAME is no keyval: its comma is literal (doubling it would name another file)."""
    if shutil.which("qemu-img") is None:
        pytest.skip("qemu-img not installed")
    where = tmp_path / "a,filename=b"
    where.mkdir()
    create_replica(Runner(), where / "replica-A.raw", Layout(), 1 << 20)
    assert [p.name for p in tmp_path.iterdir()] == ["a,filename=b"] and (where / "replica-A.raw").stat().st_size == 1 << 20
    with pytest.raises(OptionError):
        create_replica(Runner(), Path("relative.raw"), Layout(), 1 << 20)
