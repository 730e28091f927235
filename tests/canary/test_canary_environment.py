"""The canary's environment: the dpkg status file read as hostile through the host root, and what changed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvmtune.canary.environment import DPKG_LIMIT, DpkgStatusError, changes, parse_dpkg_status, read_packages
from kvmtune.host.root import HostRoot

STANZA = "Package: {name}\nStatus: install ok installed\nArchitecture: amd64\nVersion: {version}\nDescription: x\n y\n"


def status(*pairs: tuple[str, str]) -> str:
    return "\n".join(STANZA.format(name=n, version=v) for n, v in pairs)


def tree(tmp_path: Path, text: str | bytes) -> HostRoot:
    d = tmp_path / "var/lib/dpkg"
    d.mkdir(parents=True)
    (d / "status").write_bytes(text.encode() if isinstance(text, str) else text)
    return HostRoot(str(tmp_path))


def test_watched_packages_and_only_those(tmp_path: Path) -> None:
    host = tree(tmp_path, status(("qemu-system-x86", "1:7.2+dfsg-7"), ("vim", "2:9.0"),
                                 ("linux-image-6.1.0-57-cloud-amd64", "6.1.192-3")))
    assert read_packages(host) == {"qemu-system-x86": "1:7.2+dfsg-7", "linux-image-6.1.0-57-cloud-amd64": "6.1.192-3"}


def test_removed_packages_do_not_count() -> None:
    text = status(("fio", "3.33-3")).replace("install ok installed", "deinstall ok config-files")
    assert parse_dpkg_status(text) == {}


def test_no_dpkg_is_no_packages(tmp_path: Path) -> None:
    assert read_packages(HostRoot(str(tmp_path))) == {}


def test_a_duplicate_stanza_is_refused_not_believed(tmp_path: Path) -> None:
    host = tree(tmp_path, status(("fio", "3.33-3"), ("fio", "9.99-1")))
    with pytest.raises(DpkgStatusError, match="fio is installed twice"):
        read_packages(host)


def test_another_architecture_is_not_a_duplicate() -> None:
    text = status(("libvirt0", "9.0.0-4")) + "\n" + STANZA.format(name="libvirt0", version="9.0.0-4").replace(
        "amd64", "i386")
    assert parse_dpkg_status(text) == {"libvirt0": "9.0.0-4", "libvirt0:i386": "9.0.0-4"}


@pytest.mark.parametrize("sep", ["\u2028", "\u0085", "\x1b[31m"])
def test_other_line_breaks_in_a_version_are_refused(sep: str) -> None:
    with pytest.raises(DpkgStatusError, match="is not a Debian version") as exc:
        parse_dpkg_status(status(("qemu-utils", f"1:7.2{sep}Version: 9")))
    assert "\x1b" not in str(exc.value) and "\u2028" not in str(exc.value)


def test_a_cr_line_ending_file_is_refused_for_watched_packages() -> None:
    with pytest.raises(DpkgStatusError, match="carriage returns"):
        parse_dpkg_status(status(("fio", "3.33-3")).replace("\n", "\r\n"))


def test_a_hostile_name_in_a_watched_stanza_is_named_safely() -> None:
    with pytest.raises(DpkgStatusError, match="not a Debian package name"):
        parse_dpkg_status(status(("fio\u2028evil", "1")))


def test_oversize_is_refused(tmp_path: Path) -> None:
    host = tree(tmp_path, b"Package: a\n" + b"x" * (DPKG_LIMIT + 10))
    with pytest.raises(DpkgStatusError, match="larger than"):
        read_packages(host)


def test_a_link_out_of_the_tree_is_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_text(status(("fio", "3.33-3")))
    root = tmp_path / "root"
    (root / "var/lib/dpkg").mkdir(parents=True)
    os.symlink(outside, root / "var/lib/dpkg/status")
    with pytest.raises(DpkgStatusError, match="leads out of the host root"):
        read_packages(HostRoot(str(root)))


def test_a_fifo_is_not_waited_on(tmp_path: Path) -> None:
    (tmp_path / "var/lib/dpkg").mkdir(parents=True)
    os.mkfifo(tmp_path / "var/lib/dpkg/status")
    with pytest.raises(DpkgStatusError, match="not a regular file"):
        read_packages(HostRoot(str(tmp_path)))


def test_changes_name_packages_and_settings() -> None:
    before = {"packages": {"qemu-system-x86": "1:7.2-1"}, "cgroup_limits": {"cpu.cfs_quota_us": "-1"}, "kernel": "6.1",
              "loadavg": [0.1, 0.1, 0.1]}
    after = {"packages": {"qemu-system-x86": "1:7.2-2"}, "cgroup_limits": {"cpu.cfs_quota_us": "25000"}, "kernel": "6.1",
             "loadavg": [3.0, 1.0, 1.0]}
    assert changes(before, after) == [
        {"what": "qemu-system-x86", "before": "1:7.2-1", "after": "1:7.2-2"},
        {"what": "cgroup_limits cpu.cfs_quota_us", "before": "-1", "after": "25000"},
    ]
    assert changes(after, after) == []
