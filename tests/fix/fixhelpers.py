"""Helpers shared by the fix tests (imported as a plain module: tests/ is no package)."""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent
GOLDEN = HERE / "golden"
REPO = HERE.parent.parent
FIXTURE_HOST = HERE / "hostroot"


def write(root: Path, host_path: str, text: str) -> None:
    p = root / host_path.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


SEED_ERA_HOST = {
    "/proc/sys/vm/swappiness": "60\n",
    "/proc/sys/vm/dirty_ratio": "20\n",
    "/proc/sys/vm/dirty_bytes": "0\n",
    "/proc/sys/vm/dirty_background_ratio": "10\n",
    "/proc/sys/vm/dirty_background_bytes": "0\n",
    "/proc/sys/net/core/somaxconn": "4096\n",
    "/proc/sys/net/core/netdev_max_backlog": "1000\n",
    "/proc/sys/net/ipv4/tcp_tw_reuse": "1\n",
    "/proc/sys/net/ipv4/tcp_rmem": "4096\t87380\t6291456\n",
    "/proc/sys/net/ipv4/tcp_wmem": "4096\t16384\t4194304\n",
    "/proc/sys/net/ipv4/tcp_notsent_lowat": "4294967295\n",
    "/proc/sys/net/ipv4/tcp_slow_start_after_idle": "1\n",
    "/proc/sys/net/ipv4/tcp_fastopen": "1\n",
    "/proc/sys/net/core/busy_read": "0\n",
    "/proc/sys/net/core/busy_poll": "0\n",
    "/proc/sys/kernel/numa_balancing": "1\n",
    "/proc/sys/kernel/timer_migration": "1\n",
    "/proc/sys/vm/stat_interval": "1\n",
    "/proc/sys/kernel/osrelease": "6.1.0-test\n",
    "/proc/net/softnet_stat": "00000010 00000003 00000000 00000000 00000000 00000000 00000000 00000000 "
    "00000000 00000000 00000000 00000000 00000000\n",
    "/sys/devices/system/cpu/online": "0-3\n",
    "/sys/module/kvm/parameters/halt_poll_ns": "400000\n",
    "/sys/block/nvme0n1/queue/scheduler": "[mq-deadline] kyber none\n",
    "/sys/block/nvme0n1/queue/rotational": "0\n",
    "/sys/block/sda/queue/scheduler": "[none] mq-deadline kyber bfq\n",
    "/sys/block/sda/queue/rotational": "1\n",
    "/sys/block/sdb/queue/scheduler": "mq-deadline kyber [bfq] none\n",
    "/sys/block/sdb/queue/rotational": "1\n",
    "/sys/class/net/vnet0/mtu": "1500\n",
    "/sys/class/net/vnet0/tx_queue_len": "500\n",
    "/sys/class/net/vnet0/tun_flags": "0x1002\n",
    "/sys/class/net/vnet0/operstate": "unknown\n",
    "/sys/class/net/vnet0/statistics/tx_dropped": "12\n",
    "/sys/class/net/vnet1/mtu": "1500\n",
    "/sys/class/net/vnet1/tx_queue_len": "1000\n",
    "/sys/class/net/vnet1/tun_flags": "0x1002\n",
    "/sys/class/net/vnet1/statistics/tx_dropped": "0\n",
    "/etc/sysctl.d/99-local.conf": "# the admin's own file, read after ours\nvm.swappiness = 30\n",
    "/etc/hostname": "fixture\n",
}


def snapshot_tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def tree_dirs(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_dir()}


def undo_argv(out: str) -> list[str]:
    """The arguments of the ``Undo with: kvmtune undo ...`` command ``fix --apply`` printed (for ``main``)."""
    line = next(ln for ln in out.splitlines() if ln.startswith("Undo with: "))
    argv = shlex.split(line.removeprefix("Undo with: "))
    assert argv[:2] == ["kvmtune", "undo"], line
    return argv[1:]


@contextmanager
def running_guest(uri: str, template: str, label: str, make_image: Callable[[Path], Path]) -> Iterator[tuple[Any, str]]:
    """A guest running under the real libvirtd at ``uri``: ``template`` (``{virt}``, ``{name}``, ``{image}``) defined
    as ``kvmtune-test-<random>-<label>`` and started, under KVM where /dev/kvm is, under TCG where KVM does not boot
    (the test is skipped where neither starts). Its disk image is what ``make_image`` makes in a directory the guest's
    QEMU (another user, under libvirtd) can reach. Yields the domain and its name; on leaving, the domain is stopped
    and undefined and the directory removed."""
    import libvirt

    shared = Path(tempfile.mkdtemp(prefix=f"kvmtune-{label}-", dir="/var/tmp"))
    try:
        shared.chmod(0o755)
        image = make_image(shared)
        image.chmod(0o666)
        conn = libvirt.open(uri)
        name = f"kvmtune-test-{uuid.uuid4().hex[:8]}-{label}"
        virt = "kvm" if os.path.exists("/dev/kvm") else "qemu"
        dom = conn.defineXML(template.format(virt=virt, name=name, image=image))
        try:
            try:
                dom.create()
            except libvirt.libvirtError:
                dom.undefine()
                dom = conn.defineXML(template.format(virt="qemu", name=name, image=image))  # TCG where KVM does not boot
                try:
                    dom.create()
                except libvirt.libvirtError as exc:
                    pytest.skip(f"cannot start a guest here: {exc}")
            yield dom, name
        finally:
            if dom.isActive():
                dom.destroy()
            dom.undefine()
            conn.close()
    finally:
        shutil.rmtree(shared)
