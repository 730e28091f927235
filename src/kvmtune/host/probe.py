"""Live probes: facts no file holds. Only run against the real root ("/")."""

from __future__ import annotations

import errno
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

KVM_GET_API_VERSION = 0xAE00
KVM_CREATE_VM = 0xAE01


@dataclass(frozen=True)
class KvmProbe:
    opened: bool  # /dev/kvm could be opened read-write by this user
    api_version: int | None
    vm_created: bool  # KVM_CREATE_VM succeeded (the VM is destroyed at once)
    detail: str  # one line for the report


@dataclass(frozen=True)
class AccelVerdict:
    """What a booted probe guest (``kvmtune guest accel``) found: the accelerator that works and why.

    bench/ boots the guest and caches this; callers pass it into :class:`~kvmtune.host.facts.HostFacts`."""

    accel: str  # "kvm" | "tcg"
    reason: str
    age_s: float
    path: Path  # the cache file it was read from


def probe_kvm(device: str = "/dev/kvm") -> KvmProbe:
    """Open /dev/kvm, ask its API version and create (and close) an empty VM.

    This changes nothing on the host: the VM file descriptor is closed
    straight away and the kernel frees it.
    """
    try:
        fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        reason = "permission denied" if exc.errno in (errno.EACCES, errno.EPERM) else (exc.strerror or str(exc))
        return KvmProbe(False, None, False, f"open({device}) failed: {reason}")
    try:
        try:
            version = int(fcntl.ioctl(fd, KVM_GET_API_VERSION))
        except OSError as exc:
            return KvmProbe(True, None, False, f"KVM_GET_API_VERSION failed: {exc.strerror}")
        try:
            vm_fd = int(fcntl.ioctl(fd, KVM_CREATE_VM, 0))
        except OSError as exc:
            return KvmProbe(True, version, False, f"API version {version}, but KVM_CREATE_VM failed: {exc.strerror}")
        os.close(vm_fd)
        return KvmProbe(True, version, True, f"API version {version}, KVM_CREATE_VM succeeded")
    finally:
        os.close(fd)
