"""The canary's KVM entry cost: ``KVM_CREATE_VM`` plus one ``KVM_CREATE_VCPU``, then both closed, timed in a loop
(the regression of hyperlight issue 47: ``kvm_create`` 1.87 ms on 5.15, 8.75 ms on 6.9). Labelled with the KVM module
(``kvm_intel``, ``kvm_amd``, ``kvm_pvm``) and compared only within it. No guest exit loop yet."""

from __future__ import annotations

import errno
import fcntl
import os
import time

from kvmtune.errors import KvmtuneError
from kvmtune.host.root import HostRoot

KVM_GET_API_VERSION = 0xAE00
KVM_CREATE_VM = 0xAE01
KVM_CREATE_VCPU = 0xAE41
MODULES = ("kvm_intel", "kvm_amd", "kvm_pvm")
PER_ROUND = 20


def kvm_module(host: HostRoot) -> str | None:
    """The loaded KVM vendor module, by /sys/module."""
    for name in MODULES:
        if host.is_dir(f"/sys/module/{name}"):
            return name
    return None


def create_cost_us(device: str = "/dev/kvm", n: int = PER_ROUND) -> float:
    """The median of ``n`` VM + vCPU creations (and closes), in µs."""
    try:
        kvm = os.open(device, os.O_RDWR | os.O_CLOEXEC)
    except OSError as exc:
        raise KvmtuneError(f"{device}: {exc.strerror}; the KVM entry cost needs a working /dev/kvm") from None
    try:
        if fcntl.ioctl(kvm, KVM_GET_API_VERSION) != 12:
            raise KvmtuneError(f"{device}: not KVM API version 12")
        times = []
        for _ in range(n):
            t0 = time.perf_counter_ns()
            vm = fcntl.ioctl(kvm, KVM_CREATE_VM, 0)
            try:
                vcpu = fcntl.ioctl(vm, KVM_CREATE_VCPU, 0)
                os.close(vcpu)
            finally:
                os.close(vm)
            times.append((time.perf_counter_ns() - t0) / 1000.0)
    except OSError as exc:
        raise KvmtuneError(f"{device}: KVM_CREATE_VM/KVM_CREATE_VCPU failed ({errno.errorcode.get(exc.errno or 0, exc)})"
                           ) from None
    finally:
        os.close(kvm)
    times.sort()
    return times[len(times) // 2]
