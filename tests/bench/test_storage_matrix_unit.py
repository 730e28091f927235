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
)
def test_possible_combinations_pass(cfg: StorageConfig) -> None:
    assert cfg.problem() is None


def test_unknown_value_names_the_flag_and_the_choices() -> None:
    with pytest.raises(InputError, match=r"--cache: unknown cache 'fast' \(choose from none, writeback"):
        build_matrix({"cache": ["fast"]})


def test_explicit_impossible_combination_stays_in_the_matrix() -> None:
    cfgs = build_matrix({"cache": ["writeback", "none"], "aio": ["native"]})
    assert [c.problem() is None for c in cfgs] == [False, True]


def test_seed003_preset_is_24_configurations() -> None:
    pr = preset("seed-003")
    cfgs = build_matrix(pr.dims)
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
    cfgs = build_matrix({"bus": ["virtio-blk", "ide"], "target": ["file", "host"]})
    keys = [c.key for c in cfgs]
    assert keys == ["virtio-blk/raw-off/none/threads", "ide/raw-off/none/threads", "host/bare-metal"]


def test_preallocation_lists_pair_with_their_format() -> None:
    def images(formats: list[str], preallocs: list[str]) -> set[tuple[str, str]]:
        return {(c.fmt, c.prealloc) for c in build_matrix({"bus": ["ide"], "fmt": formats, "prealloc": preallocs})}

    assert images(["qcow2"], ["off", "metadata", "full"]) == {("qcow2", "off"), ("qcow2", "metadata")}
    assert images(["raw"], ["off", "metadata", "full"]) == {("raw", "off"), ("raw", "full")}
    assert images(["raw"], ["off", "metadata"]) == {("raw", "off"), ("raw", "metadata")}  # reported, not dropped
    assert images(["qcow2"], ["off", "full"]) == {("qcow2", "off"), ("qcow2", "full")}


def test_every_dimension_is_a_field_an_option_and_part_of_the_key() -> None:
    """One DIMENSIONS list: each row names a StorageConfig field with its default, a `bench storage` option,
    and a value that shows in the cell key (a new dimension left out of the key would merge distinct cells)."""
    import dataclasses

    from kvmtune.bench.storage.matrix import DIMENSIONS
    from kvmtune.cli import build_parser

    fields = {f.name: f.default for f in dataclasses.fields(StorageConfig)}
    parser = build_parser()
    for d in DIMENSIONS:
        assert fields[d.field] == d.default, d.field
        assert d.default in d.values, d.field
        base = StorageConfig(fmt="qcow2", prealloc="metadata") if d.field != "fmt" else StorageConfig()
        other = next(v for v in d.values if v != getattr(base, d.field) and not (d.field == "target" and v == "host"))
        changed = dataclasses.replace(base, **{d.field: other})
        assert changed.key != base.key, f"{d.field}={other} does not show in the cell key"
        args = parser.parse_args(["bench", "storage", f"--{d.option}", other])
        assert getattr(args, d.option.replace("-", "_")) == [other]


def test_storage_cells_are_built_by_name() -> None:
    with pytest.raises(TypeError):
        StorageConfig("virtio-blk", "none")  # type: ignore[misc]
    with pytest.raises(ValueError, match="not a swept dimension"):
        build_matrix({"format": ["raw"]})
