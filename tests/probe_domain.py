"""What the tests that run the probe guest as a libvirt domain share (and bench/capture/cost.py's ``--libvirt``): its
definition (the probe guest's kernel and initrd booted directly, its job handed over by fw_cfg, its console into a
file, QEMU as root without relabelling), transient domains started from it, destroyed on leaving, and one running a
disk job."""

from __future__ import annotations

import contextlib
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kvmtune.lab.guest import GuestBuilder, ProbeGuest
from kvmtune.lab.loadguest import load_job, parse_job
from kvmtune.runner import Runner

DOMAIN = """<domain type='qemu'>
  <name>{name}</name>
  <memory unit='MiB'>{memory_mib}</memory>
  <vcpu>1</vcpu>{cputune}
  <os><type arch='x86_64' machine='pc'>hvm</type>
    <kernel>{kernel}</kernel><initrd>{initrd}</initrd><cmdline>console=ttyS0 quiet panic=-1</cmdline></os>
  <features><acpi/></features>
  <sysinfo type='fwcfg'><entry name='opt/kvmtune/job' file='{job}'/></sysinfo>
  <on_poweroff>destroy</on_poweroff>
  <devices>{devices}
    <serial type='file'><source path='{serial}'/></serial>
    <memballoon model='none'/>
  </devices>
  <seclabel type='static' model='dac' relabel='no'><label>+0:+0</label></seclabel>
</domain>"""


def probe_domain_xml(name: str, guest: ProbeGuest, job: Path, serial: Path, *, memory_mib: int = 384,
                     devices: str = "", cputune: str = "") -> str:
    """The probe guest ``guest`` as the libvirt domain ``name``, running the job script ``job``, its console written
    to ``serial``; ``devices`` (XML) beside its console, ``cputune`` (XML) after its <vcpu>."""
    return DOMAIN.format(name=name, memory_mib=memory_mib, cputune=cputune, kernel=guest.vmlinux or guest.kernel,
                         initrd=guest.initrd, job=job, devices=devices, serial=serial)


@contextlib.contextmanager
def transient_domains(uri: str) -> Iterator[Callable[[str], Any]]:
    """``create(xml)``: a transient domain started from ``xml`` on the libvirtd at ``uri``; each one destroyed (where it
    still runs) and the connection closed on leaving."""
    import libvirt

    conn = libvirt.open(uri)
    domains: list[Any] = []

    def create(xml: str) -> Any:
        dom = conn.createXML(xml, 0)
        domains.append(dom)
        return dom

    try:
        yield create
    finally:
        for dom in domains:
            try:
                dom.destroy()
            except libvirt.libvirtError:
                pass
        conn.close()


@contextlib.contextmanager
def running_probe_domain(work: Path, libvirt_uri: str, disks: str, busy: str, idle: str, job_options: str, *,
                         iops: int | None = 600, prefix: str = "kvmtune-capture") -> Iterator[tuple[str, Any, Path]]:
    """A libvirt domain of the probe guest with ``disks`` (XML, ``{work}`` for ``work``), fio's ``job_options`` on
    ``busy`` (throttled to ``iops`` through libvirt unless None; its target and its name in the guest), once the
    guest also sees ``idle`` (its name in the guest, which libvirt's target need not be: the guest names its virtio
    disks in the order it finds them). Yields (name, domain, work); ``work`` and the domain's log removed on
    leaving."""
    guest = GuestBuilder(work, Runner()).build()
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    job = work / "job.sh"
    wait = "while [ ! -b /dev/vda ]; do sleep 0.1; done\n"
    text = load_job(guest, "disk", 1, job=parse_job(job_options))
    assert wait in text
    # every disk there and scanned for partitions (late under TCG) before fio starts on the busy one
    job.write_text(text.replace(wait, f"while [ ! -b /dev/{busy} ] || [ ! -b /dev/{idle} ]; do sleep 0.1; done\nsleep 2\n")
                   .replace("/dev/vda", f"/dev/{busy}"))
    for image in ("vda.raw", "vdb.raw", "sda.raw"):
        with open(work / image, "wb") as fh:
            fh.truncate(256 << 20)
    serial = work / "serial.log"
    try:
        with transient_domains(libvirt_uri) as create:
            dom = create(probe_domain_xml(name, guest, job, serial, memory_mib=512, devices=disks.format(work=work)))
            deadline = time.monotonic() + 120
            while b"KVMTUNE-JOB-START" not in (console := serial.read_bytes() if serial.exists() else b""):
                assert time.monotonic() < deadline and b"KVMTUNE-POWEROFF" not in console, \
                    f"the guest's job never started: {console[-400:]!r}"
                time.sleep(0.5)
            if iops is not None:
                dom.setBlockIoTune(busy, {"total_iops_sec": iops}, 0)
            yield name, dom, work
    finally:
        Path(f"/var/log/libvirt/qemu/{name}.log").unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)
