"""The inside of a running guest, read through a real qemu-ga in the probe guest (TCG).

One boot per test: without libvirt (QEMU started here, the agent behind a socket QEMU listens on)
and with libvirt (a libvirt <channel> the daemon connects, asked through virDomainQemuAgentCommand).
A QEMU whose guest never runs an agent stands for an agent that does not answer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvmtune.cli import main
from kvmtune.lab.guest import (
    GUEST_AGENT_BINARY,
    GuestBuilder,
    ProbeGuest,
    guest_agent_file,
    guest_agent_job,
)
from kvmtune.lab.qemu import GuestRun, VmSpec, agent_argv
from kvmtune.runner import Runner
from probe_domain import probe_domain_xml, transient_domains

pytestmark = pytest.mark.integration

AGENT_TIMEOUT = "60"  # TCG: each agent call is emulated; a loaded CI machine is slow


@pytest.fixture(scope="module")
def agent_guest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProbeGuest]:
    if not os.path.isfile(GUEST_AGENT_BINARY):
        pytest.skip("qemu-guest-agent not installed (scripts/install.sh installs it)")
    work = tmp_path_factory.mktemp("agent-guest")
    yield GuestBuilder(work, Runner(), extra=[guest_agent_file()]).build()
    shutil.rmtree(work, ignore_errors=True)


def wait_for_line(path: Path, marker: bytes, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and marker in path.read_bytes():
            return
        time.sleep(0.5)
    raise AssertionError(f"{marker!r} not seen in {path} within {timeout:.0f}s: {path.read_bytes()[-400:]!r}")


def audit_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, object]]:
    code = main(["audit", *args, "--only", "KVM-INS", "--format", "json", "--agent-timeout", AGENT_TIMEOUT])
    return code, json.loads(capsys.readouterr().out)


def test_audit_reads_a_running_qemu_guest_through_its_agent_socket(
    agent_guest: ProbeGuest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """bfq on its virtio disk, a virtio-rng it has no driver for, THP off (512 MiB), discard passed but no
    fstrim timer: each is read from inside the guest and becomes its rule's finding."""
    image = tmp_path / "disk.qcow2"
    subprocess.run(["qemu-img", "create", "-q", "-f", "qcow2", str(image), "64M"], check=True)
    name = f"kvmtune-agent-{uuid.uuid4().hex[:8]}"
    sock = tmp_path / "qga.sock"
    modules = agent_guest.modules_for(["virtio_pci", "virtio_blk", "bfq"])
    insmod = "".join(f"insmod /lib/modules/{m} 2>/dev/null\n" for m in modules)
    job = (insmod + "while [ ! -b /dev/vda ]; do sleep 0.1; done\necho bfq > /sys/block/vda/queue/scheduler\n"
           + guest_agent_job() + "sleep 600\n")
    extra = ["-name", f"guest={name}",
             "-drive", f"file={image},if=none,id=d0,format=qcow2,cache=none,aio=threads,discard=unmap",
             "-device", "virtio-blk-pci,drive=d0", "-device", "virtio-rng-pci"]
    spec = VmSpec(guest=agent_guest, accel="tcg", job=job, extra_args=extra, agent_socket=sock)
    with GuestRun(spec, tmp_path / "run", Runner()) as run:
        run.start()
        wait_for_line(run.serial, b"KVMTUNE-AGENT-STARTED /dev/vport", 120)
        code, doc = audit_json(capsys, "--running")
    mine = {f["rule"]: f for f in doc["findings"] if f["target"]["domain"] == name}  # type: ignore[index, union-attr]
    assert code == 0
    assert mine["KVM-INS-001"]["actual"] == "bfq" and mine["KVM-INS-001"]["target"]["device"] == "guest-disk:vda"
    assert mine["KVM-INS-003"]["actual"].startswith("virtio-rng device given, guest's rng_current: none")
    assert mine["KVM-INS-004"]["actual"] == "never"
    assert "discard=unmap" in mine["KVM-INS-005"]["actual"]
    assert f"agent socket {sock}" in mine["KVM-INS-001"]["evidence"]
    line = next(x for x in doc["looked_at"] if x.startswith(f"guest {name}: inside read"))  # type: ignore[union-attr]
    assert "Linux 6." in line or "Linux " in line, line
    assert "schedulers vda=bfq" in line, line


def test_an_agent_that_never_answers_costs_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """QEMU stopped before its guest runs (-S): the agent socket accepts and never answers. The audit ends
    after the per-guest time-out with one line for that guest, and still audits the rest."""
    binary = shutil.which("qemu-system-x86_64")
    assert binary is not None
    name = f"kvmtune-silent-{uuid.uuid4().hex[:8]}"
    sock = tmp_path / "qga.sock"
    proc = subprocess.Popen([binary, "-name", f"guest={name}", "-S", "-accel", "tcg", "-nodefaults", "-display",
                             "none", "-m", "64", "-machine", "pc", *agent_argv(sock)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        started = time.monotonic()
        code = main(["audit", "--running", "--only", "KVM-INS,KVM-STO", "--format", "json", "--agent-timeout", "1"])
        took = time.monotonic() - started
        doc = json.loads(capsys.readouterr().out)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert code == 0
    (line,) = [x for x in doc["looked_at"] if x.startswith(f"guest {name}: ")]
    assert "did not answer" in line and "no answer within 1 s" in line, line
    assert not [f for f in doc["findings"] if f["target"]["domain"] == name and f["rule"].startswith("KVM-INS")]
    assert took < 30, took  # bounded by the time-out, not by the silent agent (generous: shared CI machine)


AGENT_DEVICES = """
    <channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>
    <rng model='virtio'><backend model='random'>/dev/urandom</backend></rng>"""


def wait_until_libvirt_sees_the_agent(dom: object) -> None:
    """libvirt talks to an agent only once the guest has opened its port (qemu-ga was just started)."""
    import libvirt
    import libvirt_qemu

    deadline = time.monotonic() + 60
    while True:
        try:
            libvirt_qemu.qemuAgentCommand(dom, '{"execute": "guest-ping"}', 5, 0)
            return
        except libvirt.libvirtError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_audit_reads_a_libvirt_guest_through_libvirt(
    agent_guest: ProbeGuest, tmp_path: Path, libvirt_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"kvmtune-agent-test-{uuid.uuid4().hex[:8]}"
    job = tmp_path / "job.sh"
    job.write_text(guest_agent_job() + "sleep 600\n")
    serial = tmp_path / f"{name}.serial"
    with transient_domains(libvirt_uri) as create:
        dom = create(probe_domain_xml(name, agent_guest, job, serial, devices=AGENT_DEVICES))
        wait_for_line(serial, b"KVMTUNE-AGENT-STARTED /dev/vport", 120)
        wait_until_libvirt_sees_the_agent(dom)
        code, doc = audit_json(capsys, "-c", libvirt_uri)
    assert code == 0
    mine = {f["rule"]: f for f in doc["findings"] if f["target"]["domain"] == name}  # type: ignore[index, union-attr]
    assert set(mine) == {"KVM-INS-003", "KVM-INS-004"}, mine
    assert f"libvirt {libvirt_uri}" in mine["KVM-INS-004"]["evidence"]
    assert any(x.startswith(f"guest {name}: inside read through its guest agent (libvirt {libvirt_uri})")
               for x in doc["looked_at"])  # type: ignore[union-attr]
