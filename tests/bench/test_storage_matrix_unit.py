"""Configurations, impossible combinations, presets."""

from __future__ import annotations

import pytest

from kvmtune.bench.storage.matrix import StorageConfig, build_matrix, preset
from kvmtune.errors import InputError


@pytest.mark.parametrize(
    ("cfg", "words"),
    [
        (StorageConfig(cache="writeback", aio="native"), "aio=native needs O_DIRECT"),
        (StorageConfig(cache="writethrough", aio="native"), "cache=writethrough"),
        (StorageConfig(fmt="raw", prealloc="metadata"), "metadata exists only for qcow2"),
        (StorageConfig(fmt="qcow2", target="block"), "block target"),
    ],
)
def test_impossible_combinations_say_why(cfg: StorageConfig, words: str) -> None:
    problem = cfg.problem()
    assert problem is not None and words in problem and "\n" not in problem


@pytest.mark.parametrize(
    "cfg",
    [StorageConfig(cache="none", aio="native"), StorageConfig(cache="directsync", aio="native"),
     StorageConfig(fmt="qcow2", prealloc="metadata", cache="writethrough"), StorageConfig(target="block")],
)  # fmt: skip
def test_possible_combinations_pass(cfg: StorageConfig) -> None:
    assert cfg.problem() is None


def test_unknown_value_names_the_flag_and_the_choices() -> None:
    with pytest.raises(InputError, match=r"--cache: unknown cache 'fast' \(choose from none, writeback"):
        build_matrix(["virtio-blk"], ["fast"], ["threads"], ["raw"], ["off"])


def test_explicit_impossible_combination_stays_in_the_matrix() -> None:
    cfgs = build_matrix(["virtio-blk"], ["writeback", "none"], ["native"], ["raw"], ["off"])
    assert [c.problem() is None for c in cfgs] == [False, True]


def test_seed003_preset_is_24_configurations() -> None:
    pr = preset("seed-003")
    cfgs = build_matrix(pr.dims["bus"], pr.dims["cache"], pr.dims["aio"], pr.dims["format"], pr.dims["prealloc"])
    assert len(cfgs) == 24
    assert all(c.problem() is None for c in cfgs)
    images = {(c.fmt, c.prealloc) for c in cfgs}
    assert images == {("raw", "off"), ("raw", "full"), ("qcow2", "off"), ("qcow2", "metadata")}


def test_presets_carry_their_workloads() -> None:
    assert any(w.is_cycle for w in preset("seed-001").workloads)
    assert len(preset("ffsb", (1, 8)).workloads) == 5 * 2 * 2
    assert preset("file-vs-block").dims["target"] == ("host", "file", "block")
    with pytest.raises(InputError, match="unknown preset"):
        preset("seed-999")


def test_keys_are_unique_and_readable() -> None:
    cfgs = build_matrix(["virtio-blk", "ide"], ["none"], ["threads"], ["raw"], ["off"], ["file", "host"])
    keys = [c.key for c in cfgs]
    assert keys == ["virtio-blk/raw-off/none/threads", "ide/raw-off/none/threads", "host/bare-metal"]


def test_preallocation_lists_pair_with_their_format() -> None:
    def images(formats: list[str], preallocs: list[str]) -> set[tuple[str, str]]:
        return {(c.fmt, c.prealloc) for c in build_matrix(["ide"], ["none"], ["threads"], formats, preallocs)}

    assert images(["qcow2"], ["off", "metadata", "full"]) == {("qcow2", "off"), ("qcow2", "metadata")}
    assert images(["raw"], ["off", "metadata", "full"]) == {("raw", "off"), ("raw", "full")}
    assert images(["raw"], ["off", "metadata"]) == {("raw", "off"), ("raw", "metadata")}  # reported, not dropped
    assert images(["qcow2"], ["off", "full"]) == {("qcow2", "off"), ("qcow2", "full")}
