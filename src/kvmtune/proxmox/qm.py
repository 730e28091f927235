"""A running Proxmox VE node through its own CLI: ``qm list`` and the ``qm set`` arguments that change a VM's
config, every command through the one :class:`~kvmtune.runner.Runner`; the values PVE holds are read as JSON
through its API (:mod:`kvmtune.proxmox.pvesh`), never from ``qm config``'s lines.

``qm set --digest D`` is refused by PVE when the config file's digest is no longer ``D`` (the API's, read with
the values), so a config changed since it was read is not overwritten. On a running VM, PVE keeps a change it
cannot hotplug in the ``[PENDING]`` section; ``qm set --revert KEY`` drops that pending change.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from kvmtune.errors import KvmtuneError
from kvmtune.proxmox.config import DISK_KEY, NET_KEY, split_property_string
from kvmtune.runner import Runner

QM = "qm"
TIMEOUT_S = 60.0
_VMID = re.compile(r"^[1-9][0-9]{2,8}$")
# the config keys kvmtune's qm set forms change (and so the only keys a journal may set or revert)
SETTABLE = frozenset({"scsihw", "rng0", "balloon", "cpu", "boot", "bootdisk"})


class QmError(KvmtuneError):
    """``qm`` failed or printed something kvmtune cannot read; one line."""


def settable(key: str) -> bool:
    return key in SETTABLE or bool(DISK_KEY.match(key) or NET_KEY.match(key))


def valid_vmid(vmid: str) -> bool:
    return bool(_VMID.match(vmid))


@dataclass(frozen=True)
class QmVm:
    vmid: str
    name: str
    status: str  # running | stopped | …

    @property
    def running(self) -> bool:
        return self.status == "running"


@dataclass
class QmConfig:
    """A VM's config as PVE's API gave it (:func:`kvmtune.proxmox.pvesh.config`): the values (``description`` kept
    as one value) and the digest."""

    values: dict[str, str] = field(default_factory=dict)
    digest: str = ""

    def as_config_text(self) -> str:
        """The values as a ``qm.conf(5)`` current section (no description, no digest), for the config reader."""
        return "".join(f"{k}: {v}\n" for k, v in self.values.items() if k != "description" and "\n" not in v)


MAX_OUTPUT_BYTES = 8 * 1024 * 1024  # qm's and pvesh's answer held at most (pmxcfs files are at most 1 MiB)


def run_bounded(runner: Runner, argv: list[str], too_large: str = "") -> str:
    """A PVE tool's (``qm``, ``pvesh``) answer, at most :data:`MAX_OUTPUT_BYTES` of it held: one that prints more is
    stopped there, not read whole until the time-out; :class:`QmError` with ``too_large`` (else the runner's line)
    or with why it failed."""
    result = runner.run(argv, timeout=TIMEOUT_S, max_output=MAX_OUTPUT_BYTES)
    if result.too_large and too_large:
        raise QmError(too_large)
    if not result.ok:
        raise QmError(result.describe_failure())
    return result.stdout


def parse_list(text: str) -> list[QmVm]:
    """``qm list``: a header, then ``VMID NAME STATUS MEM(MB) BOOTDISK(GB) PID`` per VM."""
    out: list[QmVm] = []
    for line in text.split("\n"):
        words = line.split()
        if len(words) >= 3 and valid_vmid(words[0]):
            out.append(QmVm(words[0], words[1], words[2]))
    return out


def list_vms(runner: Runner) -> list[QmVm]:
    return parse_list(run_bounded(runner, [QM, "list"]))


def set_argv(vmid: str, values: dict[str, str | None], *, digest: str | None = None,
             revert: list[str] | None = None) -> list[str]:
    """``qm set VMID [--digest D] --KEY VALUE … [--delete K,…] [--revert K,…]``."""
    argv = [QM, "set", vmid]
    if digest:
        argv += ["--digest", digest]
    for key, value in values.items():
        if value is not None:
            argv += [f"--{key}", value]
    deleted = [k for k, v in values.items() if v is None]
    if deleted:
        argv += ["--delete", ",".join(deleted)]
    if revert:
        argv += ["--revert", ",".join(revert)]
    return argv


def shell_line(argv: list[str]) -> str:
    return shlex.join(argv)


def run_set(runner: Runner, argv: list[str]) -> None:
    run_bounded(runner, argv)


def same_value(a: str | None, b: str | None) -> bool:
    """Two values of one key are the same setting: a property string's items compared as a set, since PVE
    prints them in its own order."""
    if a is None or b is None:
        return a is b
    if a == b:
        return True
    items_a, items_b = split_property_string(a), split_property_string(b)
    return bool(items_a) and items_a[0] == items_b[0] and sorted(items_a[1:], key=str) == sorted(items_b[1:], key=str)
