"""What the tests that run the probe guest as a libvirt domain share: its definition (the probe guest's kernel and
initrd booted directly, its job handed over by fw_cfg, its console into a file, QEMU as root without relabelling) and
transient domains started from it, destroyed on leaving."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kvmtune.lab.guest import ProbeGuest

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
