"""The KVM entry cost on this host's /dev/kvm, and its module label."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvmtune.canary.kvmcost import create_cost_us, kvm_module
from kvmtune.errors import KvmtuneError
from kvmtune.host.root import HostRoot


def test_the_module_is_read_through_the_host_root(tmp_path: Path) -> None:
    assert kvm_module(HostRoot(str(tmp_path))) is None
    (tmp_path / "sys/module/kvm_amd").mkdir(parents=True)
    assert kvm_module(HostRoot(str(tmp_path))) == "kvm_amd"


def test_a_missing_device_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(KvmtuneError, match="needs a working /dev/kvm"):
        create_cost_us(str(tmp_path / "kvm"))


def test_not_a_kvm_device_is_refused() -> None:
    with pytest.raises(KvmtuneError):
        create_cost_us("/dev/null")


@pytest.mark.skipif(not os.access("/dev/kvm", os.R_OK | os.W_OK), reason="no usable /dev/kvm")
def test_creating_a_vm_and_a_vcpu_costs_something_measurable() -> None:
    us = create_cost_us(n=5)
    assert 1 < us < 1_000_000
