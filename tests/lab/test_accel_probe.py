"""The KVM probe reads QEMU's run state over QMP: a guest QEMU stopped in internal-error or guest-panicked ends the
probe at once, with the KVM error and the instruction QEMU printed, instead of waiting out the boot timeout; a kvm_pvm
host is named, by the probe and by doctor (issue 46 item 8). QEMU here is a stand-in script that answers QMP as QEMU
does and prints the register dump QEMU 10 prints on a KVM emulation failure."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from kvmtune.cli.doctor import checks
from kvmtune.host.root import HostRoot
from kvmtune.lab.accel import detect_accel, kvm_probe
from kvmtune.lab.guest import ProbeGuest
from kvmtune.lab.qemu import kvm_error
from kvmtune.runner import Runner

# what QEMU's kvm_cpu_exec and cpu_dump_state print when KVM reports an emulation failure (abridged)
DUMP = """KVM internal error. Suberror: 1
extra data[0]: 0x0000000000000000
extra data[1]: 0x0000000000000030
emulation failure
RAX=0000000000000000 RBX=0000000000000000 RCX=00000000c0000080 RDX=0000000000000000
RIP=ffffffff81000e60 RFL=00010046 [---Z-P-] CPL=0 II=0 A20=1 SMM=0 HLT=0
Code=48 89 e5 41 54 53 <0f> 30 5b 41 5c 5d c3 cc cc cc
"""

FAKE_QEMU = r'''
import json, os, socket, sys, time
argv = sys.argv[1:]
if "--version" in argv:
    print("QEMU emulator version 10.0.2 (stand-in)"); sys.exit(0)
state = os.environ["FAKE_QEMU_STATE"]
qmp = argv[argv.index("-qmp") + 1].removeprefix("unix:").split(",")[0]
serial = argv[argv.index("-serial") + 1].removeprefix("file:")
open(serial, "a").write("[    0.000000] Linux version 6.12.0 (stand-in)\n")
srv = socket.socket(socket.AF_UNIX); srv.bind(qmp); srv.listen(4)
t0 = time.monotonic()
stopped = False
while True:
    conn, _ = srv.accept()
    f = conn.makefile("rw")
    f.write(json.dumps({"QMP": {"version": {}, "capabilities": []}}) + "\n"); f.flush()
    for line in f:
        cmd = json.loads(line)["execute"]
        now = "running" if time.monotonic() - t0 < 0.3 else state
        if now != "running" and not stopped and state == "internal-error":
            sys.stderr.write(os.environ["FAKE_QEMU_DUMP"]); sys.stderr.flush(); stopped = True
        reply = {"status": now, "running": now == "running"} if cmd == "query-status" else {}
        f.write(json.dumps({"return": reply}) + "\n"); f.flush()
    conn.close()
'''


@pytest.fixture
def fake_qemu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "qemu-system-x86_64"
    script.write_text(f"#!{sys.executable}\n{FAKE_QEMU}")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_QEMU_DUMP", DUMP)
    return bindir


def probe_guest(tmp_path: Path) -> ProbeGuest:
    for name in ("vmlinuz", "initrd"):
        (tmp_path / name).write_bytes(b"")
    return ProbeGuest(kernel=tmp_path / "vmlinuz", initrd=tmp_path / "initrd", key="stand-in", release="6.12.0",
                      modules=(), missing_optional=(), tools=(), size=0, cached=False)


def test_kvm_error_names_the_error_its_meaning_rip_and_the_instruction() -> None:
    assert kvm_error(DUMP) == ("KVM internal error. Suberror: 1, emulation failure, at RIP=ffffffff81000e60, "
                               "instruction bytes <0f> 30 5b 41 5c 5d")
    assert kvm_error("qemu-system-x86_64: -accel kvm: Could not access KVM kernel module") == ""


@pytest.mark.parametrize(("state", "named"), [("internal-error", "KVM internal error. Suberror: 1, emulation failure"),
                                              ("guest-panicked", "guest-panicked")])
def test_the_probe_stops_at_a_stopped_run_state_well_before_its_timeout(
        state: str, named: str, fake_qemu: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_QEMU_STATE", state)
    start = time.monotonic()
    choice = kvm_probe(probe_guest(tmp_path), tmp_path / "work", Runner(), timeout=8.0)
    took = time.monotonic() - start
    assert choice.accel == "tcg"
    assert took < 4.0, took  # not the 8 s boot timeout: QMP said the guest will never go on
    assert f"QEMU stopped the guest in its {state} state" in choice.reason and named in choice.reason
    if state == "internal-error":
        assert "RIP=ffffffff81000e60" in choice.reason and "<0f> 30" in choice.reason


def test_a_guest_that_stays_running_and_silent_still_times_out(fake_qemu: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_QEMU_STATE", "running")
    choice = kvm_probe(probe_guest(tmp_path), tmp_path / "work", Runner(), timeout=1.5)
    assert choice.accel == "tcg" and "did not boot under KVM within 2s" in choice.reason


def kvm_pvm_tree(tmp_path: Path) -> HostRoot:
    tree = tmp_path / "host"
    for d in ("sys/module/kvm", "sys/module/kvm_pvm/parameters", "dev", "proc/sys/kernel"):
        (tree / d).mkdir(parents=True)
    (tree / "dev/kvm").write_text("")
    (tree / "proc/sys/kernel/osrelease").write_text("6.12.0-pvm\n")
    return HostRoot(str(tree))


def test_the_probe_on_a_kvm_pvm_host_says_what_kvm_pvm_means(fake_qemu: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_QEMU_STATE", "internal-error")
    choice = detect_accel(probe_guest(tmp_path), tmp_path / "work", Runner(), host=kvm_pvm_tree(tmp_path),
                          timeout=8.0, use_cache=False)
    assert choice.accel == "tcg" and "emulation failure" in choice.reason
    assert "this host's KVM is kvm_pvm" in choice.reason and "PVM guest" in choice.reason


def test_doctor_names_a_kvm_pvm_host(tmp_path: Path) -> None:
    found = {c.what: c for c in checks(kvm_pvm_tree(tmp_path), Runner(), tmp_path / "work")}
    module = found["KVM module"]
    assert module.ok is False and module.detail.startswith("kvm_pvm loaded: this host's KVM is kvm_pvm")
    assert "stock guest kernels do not boot" in module.costs
    plain = tmp_path / "plain"
    (plain / "sys/module/kvm_intel").mkdir(parents=True)
    (plain / "proc/sys/kernel").mkdir(parents=True)
    other = {c.what: c for c in checks(HostRoot(str(plain)), Runner(), tmp_path / "work")}
    assert other["KVM module"].ok is True and other["KVM module"].detail == "kvm_intel loaded"


def test_guest_run_says_what_it_stopped_and_what_it_left_in_the_cache(fake_qemu: Path, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 46 item 7: `guest run` ends saying what it stopped and removed, and what stays in the cache."""
    from kvmtune.cli.guest import cache_left
    from kvmtune.lab.loadguest import LoadGuest

    monkeypatch.setenv("FAKE_QEMU_STATE", "running")
    work = tmp_path / "work"
    (work / "guest").mkdir(parents=True)
    (work / "guest" / "initrd-x.cpio").write_bytes(b"\0" * 3 * 2**20)
    (work / "accel.json").write_text("{}")
    load = LoadGuest(probe_guest(tmp_path), "disk", "t1", "kvm", work, Runner())
    pid = load.start()
    time.sleep(0.3)
    done = load.close()
    assert done[0] == f"stopped QEMU (pid {pid})"
    assert done[1].startswith(f"removed the scratch disk {work}/run-t1-") and done[1].endswith("disk.raw (1 GiB)")
    assert not list(work.glob("run-t1-*"))
    left = cache_left(work)
    assert left.startswith(f"{work}/guest (the probe guest's kernel and initramfs, 1 file(s), 3 MiB: reused by the next run")
    assert left.endswith(f"{work}/accel.json (the accelerator verdict; kvmtune guest accel --no-cache probes again)")
    assert cache_left(tmp_path / "empty") == "nothing"
