"""Helpers for the reliability tests."""

from __future__ import annotations

from pathlib import Path


def domain_xml(name: str) -> str:
    """A libvirt domain definition ``fix`` changes (its raw disk's cache=writethrough, among others), named ``name``,
    its disk ``/var/lib/libvirt/images/<name>.img``."""
    return f"""<domain type='kvm'>
  <name>{name}</name>
  <memory unit='GiB'>1</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc-q35-8.2'>hvm</type></os>
  <cpu mode='host-passthrough'/>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='raw' cache='writethrough'/>
      <source file='/var/lib/libvirt/images/{name}.img'/>
      <target dev='vda' bus='virtio'/>
    </disk>
  </devices>
</domain>
"""


def fill(directory: Path) -> None:
    """Fill the file system of ``directory`` to the last byte."""
    import os

    for name, chunk in (("filler", 65536), ("filler2", 512), ("filler3", 1)):
        fd = os.open(directory / name, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            while True:
                os.write(fd, b"\0" * chunk)
        except OSError:
            pass
        finally:
            os.close(fd)
