"""kvmtune capture's libvirt side without libvirtd: the live XML, QMP replies, domain names and markers as hostile
input, the disk mapping, and the domain log followed across virtlogd's rotation."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from kvmtune.capture.libvirt import LibvirtGuest, LogFollower, disks_from_xml, log_path, qmp_reply, target_of
from kvmtune.capture.session import Capture, blockstats, identity, restore_leftovers
from kvmtune.errors import InputError, KvmtuneError
from kvmtune.host.root import HostReadError, HostRoot

UUID = "130c872b-dd4d-4262-b344-9758e3d6d1ef"


def live_xml(*disks: str) -> bytes:
    return ("<domain type='qemu'><name>g</name><devices>" + "".join(disks) + "</devices></domain>").encode()


def disk(dev: str, alias: str | None, bus: str = "virtio") -> str:
    return (f"<disk type='file' device='disk'><target dev='{dev}' bus='{bus}'/>"
            + (f"<alias name='{alias}'/>" if alias is not None else "") + "</disk>")


def test_the_live_xml_maps_aliases_to_targets_and_qdevs_find_them() -> None:
    aliases = disks_from_xml(live_xml(disk("vda", "virtio-disk0"), disk("vdb", "virtio-disk1"),
                                      disk("sda", "scsi0-0-0-0", "scsi"), disk("vdc", None)), "x")
    assert aliases == {"virtio-disk0": "vda", "virtio-disk1": "vdb", "scsi0-0-0-0": "sda"}
    # the qdev paths QEMU 7.2 under libvirt 9 reports (query-blockstats, seen on this host)
    assert target_of("/machine/peripheral/virtio-disk0/virtio-backend", aliases) == "vda"
    assert target_of("scsi0-0-0-0", aliases) == "sda"
    assert target_of("/machine/peripheral/virtio-disk10/virtio-backend", aliases) is None  # not virtio-disk1's
    assert target_of("/machine/peripheral-anon/virtio-disk0", aliases) is None
    assert target_of(None, aliases) is None and target_of("", aliases) is None


@pytest.mark.parametrize(("xml", "problem"), [
    (live_xml(disk("vda", "virtio-disk0"), disk("vdb", "virtio-disk0")), "alias virtio-disk0 given twice"),
    (live_xml(disk("vda", "virtio-disk0"), disk("vda", "virtio-disk1")), "target vda given twice"),
    (live_xml(disk("vd*", "virtio-disk0")), "is not a disk name"),
    (live_xml(disk("../x", "virtio-disk0")), "is not a disk name"),
    (live_xml(disk("vda", "virtio disk0")), "is not a plain device id"),
    (live_xml(disk("vda", "virtio-disk0\u2028")), "is not a plain device id"),
    (live_xml(disk("vda", "a/b")), "is not a plain device id"),
    (live_xml(disk("vda", "")), "is not a plain device id"),
    (live_xml("<disk><target dev='vda'/><target dev='vdb'/><alias name='d'/></disk>"), "2 <target>"),
    (live_xml("<disk><alias name='d'/></disk>"), "0 <target>"),
    (b"<!DOCTYPE d [<!ENTITY e 'vda'>]><domain/>", "DOCTYPE"),
    (b"<domain><devices>", "malformed XML"),
])
def test_a_live_xml_out_of_pattern_is_one_input_error(xml: bytes, problem: str) -> None:
    with pytest.raises(InputError) as exc:
        disks_from_xml(xml, "qemu:///system#g")
    assert problem in str(exc.value) and "qemu:///system#g" in str(exc.value) and "\n" not in str(exc.value)


def test_blockstats_name_a_libvirt_guests_disks_by_target_and_keep_the_first_of_a_name_given_twice() -> None:
    class Fake:
        def execute(self, cmd: str, **args: Any) -> Any:
            assert cmd == "query-blockstats"
            return [{"device": "", "qdev": "/machine/peripheral/virtio-disk0/virtio-backend", "stats": {"rd_operations": 5}},
                    {"device": "", "qdev": "/machine/peripheral/virtio-disk0/virtio-backend", "stats": {"rd_operations": 9}},
                    {"device": "", "qdev": "/machine/peripheral/other/virtio-backend", "stats": {"rd_operations": True}},
                    {"device": "", "qdev": "x" * 300, "stats": {}},
                    "not an object"]

        def close(self) -> None:
            pass

    got = blockstats(Fake(), {"virtio-disk0": "vda"})
    assert sorted(got) == ["/machine/peripheral/other/virtio-backend", "vda"]
    assert got["vda"]["rd_operations"] == 5 and got["vda"]["qdev"].endswith("virtio-disk0/virtio-backend")
    assert got["/machine/peripheral/other/virtio-backend"]["rd_operations"] == 0  # a bool is not a count


@pytest.mark.parametrize(("raw", "problem"), [
    (None, "no reply"),
    ('{"return": 1, "return": 2}', "duplicate key"),
    ('{"return": NaN}', "non-JSON constant"),
    ('[{"return": 1}]', "not a JSON object"),
    ('{"id": "libvirt-1"}', "has no 'return'"),
    ('{"error": {"class": "GenericError", "desc": "no such event"}}', "no such event"),
    ('{"error": "x"}', "QMP trace-event-set-state: error"),
    ("[" * 100_000, "not plain JSON"),
    ('{"return": "' + "x" * (16 * 1024 * 1024) + '"}', "over 16 MiB"),
    ("\ufeff{}", "not plain JSON"),
])
def test_a_qmp_reply_libvirt_passes_on_is_checked(raw: str | None, problem: str) -> None:
    with pytest.raises(KvmtuneError) as exc:
        qmp_reply("trace-event-set-state", raw)
    assert problem in str(exc.value) and str(exc.value).startswith("QMP trace-event-set-state")


def test_a_good_qmp_reply_gives_its_return() -> None:
    assert qmp_reply("query-blockstats", '{"return": [{"device": ""}], "id": "libvirt-7"}') == [{"device": ""}]


@pytest.mark.parametrize("name", ["a/b", "..", ".", "", "web\n01", "web*", "web?", "x\x00", "-" * 201, "web\u2028",
                                  "wëb"])
def test_a_domain_name_kvmtune_would_not_put_into_a_path_is_refused(name: str) -> None:
    with pytest.raises(KvmtuneError) as exc:
        log_path(name)
    assert "nothing captured" in str(exc.value) and "\n" not in str(exc.value).replace(repr(name), "")


def test_a_plain_domain_name_gives_its_log() -> None:
    assert log_path("web-01.example_2") == "/var/log/libvirt/qemu/web-01.example_2.log"


def test_a_capture_of_a_badly_named_domain_refuses_before_it_changes_anything(tmp_path: Path) -> None:
    cap = Capture(HostRoot(), os.getpid(), tmp_path, seconds=1, trace=True, libvirt=LibvirtGuest(
        "qemu:///system", UUID, "../../etc/x"))
    with pytest.raises(KvmtuneError, match="does not put into a path"):
        cap.run()
    assert list(tmp_path.iterdir()) == []  # no marker: nothing was switched on


@pytest.mark.parametrize("libvirt", [
    {"uri": "qemu+ssh://evil/system", "uuid": UUID, "name": "g"},
    {"uri": "qemu:///system", "uuid": "../../x", "name": "g"},
    {"uri": "qemu:///system", "uuid": UUID, "name": "../g"},
    {"uri": "qemu:///system", "uuid": UUID},
    "qemu:///system",
])
def test_a_marker_naming_libvirt_out_of_pattern_is_removed_not_obeyed(tmp_path: Path, libvirt: Any) -> None:
    (tmp_path / "capture-active-7.json").write_text(json.dumps({
        **identity(HostRoot(), os.getpid()), "events": ["virtio_blk_rw_complete"], "histograms": [], "libvirt": libvirt}))
    (line,) = restore_leftovers(HostRoot(), tmp_path)
    assert "unreadable capture marker; removed" in line and list(tmp_path.iterdir()) == []


def test_a_good_marker_comes_back_as_the_same_guest() -> None:
    g = LibvirtGuest("qemu:///system", UUID, "web01")
    assert LibvirtGuest.from_marker(json.loads(json.dumps(g.marker()))) == g


LOG = "/var/log/libvirt/qemu/g.log"


def test_the_log_is_followed_from_its_end_across_a_rotation_with_a_line_cut_in_two(tmp_path: Path) -> None:
    d = tmp_path / "var/log/libvirt/qemu"
    d.mkdir(parents=True)
    log = d / "g.log"
    log.write_bytes(b"before the capture\n")
    f = LogFollower(HostRoot(str(tmp_path)), LOG)
    with open(log, "ab") as w:
        w.write(b"line one\nline tw")
    got = f.read(1 << 20)
    with open(log, "ab") as w:
        w.write(b"o, cut\n")
    log.rename(d / "g.log.0")  # virtlogd's rotation: the old file renamed, a new one at the path
    log.write_bytes(b"line three\n")
    while chunk := f.read(1 << 20):
        got += chunk
    assert got == b"line one\nline two, cut\nline three\n" and f.rotations == 1
    with open(log, "ab") as w:
        w.write(b"four\n")
    assert f.read(1 << 20) == b"four\n" and f.read(1 << 20) == b""
    log.unlink()  # between virtlogd's rename and its new file: nothing, not an error
    assert f.read(1 << 20) == b""
    f.close()


def test_a_log_that_is_a_symlink_or_not_a_file_is_refused(tmp_path: Path) -> None:
    d = tmp_path / "var/log/libvirt/qemu"
    d.mkdir(parents=True)
    (tmp_path / "elsewhere").write_bytes(b"x\n")
    (d / "g.log").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(HostReadError, match="symbolic link"):
        LogFollower(HostRoot(str(tmp_path)), LOG)
    (d / "g.log").unlink()
    os.mkfifo(d / "g.log")
    with pytest.raises(HostReadError, match="not a regular file"):
        LogFollower(HostRoot(str(tmp_path)), LOG)


def test_a_log_replaced_by_a_symlink_at_rotation_is_not_followed(tmp_path: Path) -> None:
    d = tmp_path / "var/log/libvirt/qemu"
    d.mkdir(parents=True)
    (d / "g.log").write_bytes(b"")
    f = LogFollower(HostRoot(str(tmp_path)), LOG)
    (d / "g.log").rename(d / "g.log.0")
    (tmp_path / "elsewhere").write_bytes(b"secret\n")
    (d / "g.log").symlink_to(tmp_path / "elsewhere")
    assert f.read(1 << 20) == b"" and f.rotations == 0
    f.close()


def test_a_marker_whose_domain_no_longer_runs_that_qemu_is_kept_and_nothing_is_sent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The QEMU the capture changed still runs (pid and start time match: here this test's own process), but the
    domain's pid file names another (or none): a restarted domain. Nothing is sent to the domain's new QEMU and the
    marker stays for the next try."""
    sent: list[str] = []

    class Monitor:
        def execute(self, cmd: str, **args: Any) -> Any:
            sent.append(cmd)

        def close(self) -> None:
            sent.append("close")

    monkeypatch.setattr(LibvirtGuest, "open", lambda self: (Monitor(), {}))
    name = f"kvmtune-no-such-domain-{os.getpid()}"
    marker = tmp_path / "capture-active-9.json"
    marker.write_text(json.dumps({**identity(HostRoot(), os.getpid()), "events": ["virtio_blk_rw_complete"],
                                  "histograms": [], "libvirt": LibvirtGuest("qemu:///system", UUID, name).marker()}))
    (line,) = restore_leftovers(HostRoot(), tmp_path)
    assert f"libvirt domain {name} is no longer QEMU pid {os.getpid()}" in line and "marker kept" in line
    assert sent == ["close"] and marker.exists()


def _rotate(d: Path, keep: int = 3) -> None:
    """virtlogd's rollover: g.log.(n-1) -> g.log.n (the last dropped), g.log -> g.log.0, a new empty g.log."""
    (d / f"g.log.{keep - 1}").unlink(missing_ok=True)
    for n in range(keep - 1, 0, -1):
        if (d / f"g.log.{n - 1}").exists():
            (d / f"g.log.{n - 1}").rename(d / f"g.log.{n}")
    (d / "g.log").rename(d / "g.log.0")
    (d / "g.log").write_bytes(b"")
    (d / "g.log").chmod(0o600)


def _followed(tmp_path: Path, first: bytes) -> tuple[Path, LogFollower, bytes]:
    """A log followed from its end, then ``first`` appended and read: (its directory, the follower, what it read)."""
    d = tmp_path / "var/log/libvirt/qemu"
    d.mkdir(parents=True)
    (d / "g.log").write_bytes(b"before the capture\n")
    f = LogFollower(HostRoot(str(tmp_path)), LOG)
    with open(d / "g.log", "ab") as w:
        w.write(first)
    return d, f, f.read(1 << 20)


def test_two_rotations_between_reads_lose_no_line_and_keep_their_order(tmp_path: Path) -> None:
    """A fast guest's events fill virtlogd's 2 MiB log in less than a read's interval: the log is renamed away twice
    between two reads. Before, the follower went from the file it held straight to the one now at the path, and the
    file in between (g.log.0 by then) was never read: its requests missing, the capture refused."""
    d, f, got = _followed(tmp_path, b"one\n")
    with open(d / "g.log", "ab") as w:
        w.write(b"two\n")
    _rotate(d)
    (d / "g.log").write_bytes(b"three\n")
    _rotate(d)
    (d / "g.log").write_bytes(b"four\n")
    while chunk := f.read(1 << 20):
        got += chunk
    assert got == b"one\ntwo\nthree\nfour\n" and f.lost == 0
    f.close()


def test_a_log_rotated_past_the_last_backup_is_counted_lost_and_the_rest_read_in_order(tmp_path: Path) -> None:
    d, f, got = _followed(tmp_path, b"held\n")
    for n in range(4):  # the held file goes .0, .1, .2 and is then dropped (3 backups); four files came after it
        _rotate(d)
        (d / "g.log").write_bytes(f"after {n}\n".encode())
    while chunk := f.read(1 << 20):
        got += chunk
    # the held file was dropped with the fourth rotation (read through its descriptor all the same); .2, .1, .0
    # and the path hold the four that came after it
    assert got == b"held\nafter 0\nafter 1\nafter 2\nafter 3\n", got
    assert f.lost == 1  # the follower cannot know that nothing was dropped between: counted
    f.close()


@pytest.mark.parametrize("plant", ["link", "writable"])
def test_a_backup_that_is_a_link_or_others_may_write_is_never_read(tmp_path: Path, plant: str) -> None:
    """The backups are found by name (``g.log.0``, …): one that is a symbolic link (to another guest's log, or any
    file) or that others may write is not read; the follower stops looking there and counts the held file lost."""
    d, f, got = _followed(tmp_path, b"held\n")
    (d / "g.log").rename(d / "g.log.1")  # the held file, renamed away twice
    planted = tmp_path / "planted"
    planted.write_bytes(b"planted line\n")
    if plant == "link":
        (d / "g.log.0").symlink_to(planted)
    else:
        (d / "g.log.0").write_bytes(b"planted line\n")
        (d / "g.log.0").chmod(0o666)
    (d / "g.log").write_bytes(b"now\n")
    while chunk := f.read(1 << 20):
        got += chunk
    assert b"planted" not in got and got.endswith(b"now\n") and f.lost == 1, got
    f.close()
