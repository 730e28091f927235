"""``StorageSpec.configs()``: the storage matrix of each tier, built without the CLI."""

from __future__ import annotations

import pytest

from kvmtune.bench.storage.spec import StorageSpec, csv_list
from kvmtune.errors import InputError


def _spec(tier: str, **kw: object) -> StorageSpec:
    dims: dict[str, list[str] | None] = {f: None for f in ("bus", "cache", "aio", "fmt", "prealloc", "target",
                                                           "sched", "host_fs")}
    dims.update(kw.pop("dims", {}))  # type: ignore[arg-type]
    base = dict(tier=tier, dims=dims, threads=(1, 8, 16), runtime=5.0, quick_cap=2.0, disk_size=1024, repeat=None,
                cycle_mib=64, cycle_idle=3.0, boot_timeout=60.0, memory=512, smp=1, accel="auto")
    base.update(kw)
    return StorageSpec(**base)  # type: ignore[arg-type]


def test_block_tier_puts_the_floor_first_and_rounds_default_to_three() -> None:
    spec = _spec("auto", dims={"cache": ["none", "writethrough"]}).for_tier("block")
    configs, workloads = spec.configs()
    assert spec.repeat == 3 and spec.host_fs == ["workdir"]
    # no --aio: each cache mode with the backend it can have (native needs O_DIRECT)
    assert [c.key for c in configs] == ["host/bare-metal", "nbd/raw-off/none/native", "nbd/raw-off/writethrough/threads"]
    assert [w.name for w in workloads] == ["randread-4k", "randwrite-4k"]


def test_block_tier_keeps_an_asked_for_impossible_pair_to_report_it() -> None:
    spec = _spec("block", dims={"cache": ["none", "writeback"], "aio": ["native"]}).for_tier("block")
    configs, _ = spec.configs()
    assert [c.key for c in configs] == ["host/bare-metal", "nbd/raw-off/none/native", "nbd/raw-off/writeback/native"]
    assert "impossible combination" in (configs[2].problem() or "")


def test_guest_tier_preset_filtered_by_glob_and_an_empty_filter_is_an_error() -> None:
    configs, workloads = _spec("guest", preset="seed-001", workloads=("*write*",)).configs()
    assert workloads and all("write" in w.name for w in workloads)
    assert configs and _spec("guest").for_tier("guest").repeat == 1
    with pytest.raises(InputError, match="matches none"):
        _spec("guest", preset="seed-001", workloads=()).configs()


def test_quick_tier_has_no_workloads_and_block_refuses_what_it_cannot_run() -> None:
    configs, workloads = _spec("quick", dims={"fmt": ["qcow2"], "cache": ["none"], "aio": ["threads"]}).configs()
    assert workloads == [] and [c.key for c in configs] == ["qemu-img/qcow2-off/none/threads",
                                                          "qemu-img/qcow2-metadata/none/threads"]
    with pytest.raises(InputError, match="use --tier guest"):
        _spec("block", preset="ffsb").configs()
    with pytest.raises(InputError, match="needs --device"):
        _spec("block", dims={"target": ["device"]}).configs()
    with pytest.raises(InputError, match="targets are file, block and device"):
        _spec("block", dims={"target": ["host"]}).configs()


def test_csv_list_joins_repeated_comma_lists() -> None:
    assert csv_list(None) is None and csv_list([]) is None
    assert csv_list(["none, writeback", "directsync", " , "]) == ["none", "writeback", "directsync"]
