"""What one ``bench storage`` run measures, before anything runs: :class:`StorageSpec`, every default filled in,
and its configurations and workloads per tier (:meth:`StorageSpec.configs`).

The CLI turns its arguments into a spec (:func:`kvmtune.cli.bench.storage_spec`); from there on the storage tiers
need nothing of the CLI. A value that cannot be used is an :class:`~kvmtune.errors.InputError` naming the option.
"""

from __future__ import annotations

import dataclasses
import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvmtune.bench.storage.block import RAMP_S, block_configs, block_preset
from kvmtune.bench.storage.matrix import DIMENSIONS, SWEEP, StorageConfig, block_default_aio, build_matrix, preset
from kvmtune.bench.storage.quick import quick_configs
from kvmtune.errors import InputError
from kvmtune.lab.storage import fio as fiomod
from kvmtune.lab.storage.replay import Replay

TIERS = ("auto", "guest", "block")
# the guest tier's settings and their defaults (a spec field each; stored with the run)
GUEST_DEFAULTS: dict[str, Any] = {"cycle_mib": 64, "cycle_idle": 3.0, "boot_timeout": 60.0, "memory": 512, "smp": 1,
                                  "accel": "auto"}
DEFAULT_WORKLOADS = ("randread-4k", "randwrite-4k")


def csv_list(values: Sequence[str] | None) -> list[str] | None:
    """Repeated comma lists (``--cache none,writeback --cache directsync``) as one list; None when none was given."""
    if not values:
        return None
    out: list[str] = []
    for v in values:
        out.extend(x.strip() for x in v.split(",") if x.strip())
    return out


def filter_workloads(workloads: Sequence[fiomod.Workload], patterns: Sequence[str]) -> list[fiomod.Workload]:
    """A preset's workloads whose names match one of the shell globs; none matching is an error."""
    out = [w for w in workloads if any(fnmatch.fnmatchcase(w.name, p) for p in patterns)]
    if not out:
        raise InputError("--workload", f"{', '.join(patterns)} matches none of the preset's workloads")
    return out


@dataclass(frozen=True)
class StorageSpec:
    """What ``bench storage`` runs, with every default filled in.

    ``tier`` is ``auto`` until probing KVM decides it (:meth:`for_tier`), and ``repeat`` ``None`` until the tier is
    known. ``workloads`` are the names (or, with a preset, shell globs) given, ``None`` when none was (a given but
    empty list filters a preset's workloads down to none, an error)."""

    tier: str
    dims: dict[str, list[str] | None]  # by StorageConfig field: the comma lists given (--image-format and old --format)
    threads: tuple[int, ...]
    runtime: float
    quick_cap: float
    disk_size: int
    repeat: int | None
    cycle_mib: int
    cycle_idle: float
    boot_timeout: float
    memory: int
    smp: int
    accel: str
    preset: str | None = None
    workloads: tuple[str, ...] | None = None
    device: str | None = None
    ramp: float = RAMP_S
    replay: Replay | None = None  # --replay FILE: the block tier runs the captured workload instead of generic jobs

    def given(self, field: str) -> bool:
        return bool(self.dims.get(field))

    def for_tier(self, tier: str) -> StorageSpec:
        """This spec on a decided tier; the block tier's rounds default to 3, the others' to 1."""
        repeat = (3 if tier == "block" else 1) if self.repeat is None else self.repeat
        return dataclasses.replace(self, tier=tier, repeat=repeat)

    @property
    def host_fs(self) -> list[str]:
        return self.dims.get("host_fs") or ["workdir"]

    def recorded(self, given: Mapping[str, Any], db: str) -> dict[str, Any]:
        """The run's arguments as stored with it: what was given, and the defaults this run used."""
        replay = None if self.replay is None else {**self.replay.record(), "file": given.get("replay")}
        return {**given, "db": db, "replay": replay, "tier": self.tier, "repeat": self.repeat, "runtime": self.runtime,
                "disk_size": self.disk_size, **{k: getattr(self, k) for k in GUEST_DEFAULTS}}

    def configs(self) -> tuple[list[StorageConfig], list[fiomod.Workload]]:
        """The configurations and workloads of this spec's tier (quick: no workloads; auto: the guest tier's)."""
        if self.tier == "quick":
            return quick_configs(self.dims["cache"], self.dims["aio"], self.dims["fmt"], self.dims["prealloc"]), []
        if self.tier == "block":
            return self._block_matrix()
        return self._guest_matrix()

    def _workloads(self) -> list[fiomod.Workload]:
        return list(fiomod.lookup(list(self.workloads or DEFAULT_WORKLOADS)))

    def _guest_matrix(self) -> tuple[list[StorageConfig], list[fiomod.Workload]]:
        if self.preset:
            pr = preset(self.preset, self.threads, self.cycle_mib, self.cycle_idle)
            dims = dict(pr.dims)
            workloads = list(pr.workloads)
            if self.workloads is not None:
                workloads = filter_workloads(workloads, self.workloads)
        else:
            dims = {}
            workloads = self._workloads()
        for d in DIMENSIONS:
            given = self.dims[d.field] if d.field in SWEEP else None
            if given:
                dims[d.field] = tuple(given)
        if self.device:
            dims.setdefault("target", ("device",))
        configs = build_matrix(dims)
        if any(c.target == "device" for c in configs) and not self.device:
            raise InputError("--target", "target=device needs --device PATH --destroy-data")
        return configs, workloads

    def _block_matrix(self) -> tuple[list[StorageConfig], list[fiomod.Workload]]:
        """The block tier's configurations: a preset's, or the dimensions given (the floor always comes first)."""
        if self.preset:
            if self.preset == "ffsb":
                raise InputError("--preset", "ffsb runs FFSB's file operations inside a guest file system: use --tier guest")
            configs, names = block_preset(self.preset)
            workloads = list(fiomod.lookup(names))
            if self.workloads is not None:
                workloads = filter_workloads(workloads, self.workloads)
            if any(self.given(d) for d in ("cache", "aio", "fmt", "prealloc", "target")):
                raise InputError("--preset", f"{self.preset} fixes its block-tier configurations; drop the dimension "
                                             "flags or drop --preset")
            return configs, workloads
        workloads = self._workloads()
        targets = self.dims["target"] or (["device"] if self.device else ["file"])
        for t in targets:
            if t not in ("file", "block", "device"):
                raise InputError("--target", f"{t!r}: the block tier's targets are file, block and device "
                                             "(the bare-metal floor is always measured)")
        if "device" in targets and not self.device:
            raise InputError("--target", "target=device needs --device PATH --destroy-data")
        grid = build_matrix({"cache": self.dims["cache"] or ["none"], "aio": self.dims["aio"] or ["native"],
                             "fmt": self.dims["fmt"] or ["raw"], "prealloc": self.dims["prealloc"] or ["off"],
                             "target": targets})
        images = list(dict.fromkeys((c.fmt, c.prealloc) for c in grid))
        # no --aio: each cache mode with the backend it can have (an asked-for impossible pair is still reported)
        modes = list(dict.fromkeys((c.cache, c.aio if self.dims["aio"] else block_default_aio(c.cache))
                                   for c in grid))
        return block_configs(images, modes, targets), workloads
