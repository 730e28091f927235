"""The live symptoms list: one Signal per symptom, labels made from the numbers, direction as a field."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from kvmtune import cli
from kvmtune.audit.finding import TOPICS
from kvmtune.host.root import HostRoot
from kvmtune.live.diagnose import NO_RULE, Diagnoser
from kvmtune.live.model import GuestSample, HostSample, Snapshot, VcpuCounters
from kvmtune.live.output import prometheus_text, render_table
from kvmtune.live.signals import DiskRates, GuestRates, HostRates, NicRates, Rates
from kvmtune.live.symptoms import SIGNALS, Reading, Signal, Subject, Threshold, thresholds_json


def make_host(root: Path) -> HostRoot:
    for path, text in (("proc/stat", "cpu  1 0 0 1 0 0 0 0 0 0\n"), ("sys/devices/system/cpu/online", "0-1\n"),
                       ("proc/mounts", "/dev/vda1 / ext4 rw 0 0\n"), ("dev/kvm", "")):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    return HostRoot(str(root))


def one_guest(gr: GuestRates) -> tuple[Rates, Snapshot]:
    sample = GuestSample(gr.key, gr.name, gr.source, vcpus={0: VcpuCounters(0, 0, frozenset({0}))})
    return Rates(1.0, HostRates(), [gr], []), Snapshot(1.0, HostSample(), {gr.key: sample})


@pytest.fixture
def extra_signal() -> Iterator[list[Signal]]:
    """Signals appended to SIGNALS for one test, removed after it."""
    added: list[Signal] = []
    yield added
    for signal in added:
        SIGNALS.remove(signal)


def _halt_poll(s: Subject) -> Iterable[Reading]:
    assert s.guest is not None
    if s.guest.halt_poll_success is not None:
        yield Reading(s.guest.halt_poll_success, f"{s.guest.halt_poll_success:.0%} polls succeed")


def test_a_new_signal_in_the_list_is_diagnosed_without_other_edits(tmp_path: Path, extra_signal: list[Signal],
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """One more entry in SIGNALS: diagnosis, its label, the table, Prometheus and the sample's thresholds see it."""
    signal = Signal("halt-poll", "guest", "KVM debugfs halt_poll_success_ns / halt_attempted_poll", _halt_poll,
                    {"": Threshold(0.5, 0.2, "fraction of halt polls that succeed", "a test's value", worse="lower",
                                   scale=100, symbol="%", cite="test")},
                    frozenset({"halt-polling"}))
    SIGNALS.append(signal)
    extra_signal.append(signal)
    gr = GuestRates("src#web", "web", "src", halt_poll_success=0.1)
    r, snap = one_guest(gr)
    found = Diagnoser(make_host(tmp_path)).diagnose(r, snap)
    assert [(d.signal, d.level, d.value, d.threshold, d.explanation) for d in found] == [
        ("halt-poll", "critical", "10% polls succeed", "50 % / 20 % (test)", NO_RULE)]
    assert "critical halt-poll 10% polls succeed" in render_table(r, found, "guest")
    assert 'signal="halt-poll"' in prometheus_text(r, found)
    gr.halt_poll_success = 0.5  # lower is worse: at the warn value it does not warn yet
    assert Diagnoser(make_host(tmp_path)).diagnose(r, snap) == []
    out = tmp_path / "s.json"
    assert cli.main(["sample", "--root", str(tmp_path), "--no-libvirt", "--duration", "0.1", "--interval", "0.1",
                     "--format", "json", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["thresholds"]["halt-poll"]["unit"] == \
        "fraction of halt polls that succeed (lower is worse)"


def _label_numbers(label: str) -> list[float]:
    return [0.0 if x == "any" else float(x) for x in re.findall(r"any|\d+(?:\.\d+)?", label)]


def test_every_label_matches_its_numbers() -> None:
    seen = set()
    for signal in SIGNALS:
        assert signal.topics and signal.topics <= TOPICS, signal.name
        assert signal.rule_ids(), f"{signal.name}: no rule of its topics exists"
        for variant, th in signal.thresholds.items():
            label = th.label()
            warn, critical = _label_numbers(label)[:2]
            assert (warn, critical) == (pytest.approx(th.warn * th.scale), pytest.approx(th.critical * th.scale)), label
            # which way is worse is a field; the unit is not prose about it
            assert th.worse in ("higher", "lower") and "worse" not in th.unit, signal.name
            assert (warn < critical) == (th.worse == "higher") or warn == critical, f"{signal.name}: {label}"
            seen.add(signal.threshold_key(variant))
    assert set(thresholds_json()) == seen


def test_a_changed_number_changes_the_label(tmp_path: Path) -> None:
    """The label is made from the threshold: 5 % → 20 % moves both the verdict and the text."""
    index = next(i for i, s in enumerate(SIGNALS) if s.name == "vcpu-delay")
    old = SIGNALS[index]
    gr = GuestRates("src#web", "web", "src", vcpu_delay={0: 0.15})
    r, snap = one_guest(gr)
    before = Diagnoser(make_host(tmp_path)).diagnose(r, snap)
    assert [(d.level, d.threshold) for d in before] == [("critical", "5 % / 10 % per vCPU (CPU Ready)")]
    SIGNALS[index] = dataclasses.replace(old, thresholds={"": dataclasses.replace(old.thresholds[""], warn=0.1,
                                                                                  critical=0.2)})
    try:
        after = Diagnoser(make_host(tmp_path)).diagnose(r, snap)
    finally:
        SIGNALS[index] = old
    assert [(d.level, d.threshold) for d in after] == [("warn", "10 % / 20 % per vCPU (CPU Ready)")]


# (reading, expected (signal, level, value, label) or None): the labels and boundaries kvmtune has always shown
HOST_CASES = [
    (HostRates(cpu_busy=0.79), []),
    (HostRates(cpu_busy=0.80), [("host-cpu", "warn", "80% busy", "80 % / 95 % (seed:000)")]),
    (HostRates(cpu_busy=0.95), [("host-cpu", "critical", "95% busy", "80 % / 95 % (seed:000)")]),
    (HostRates(psi_some={"memory": 9.9}, psi_full={"memory": 9.9}), []),
    (HostRates(psi_some={"memory": 10.0}), [("psi-memory", "warn", "some 10.0 % full 0.0 %",
                                               "some avg10 10 % / full avg10 10 %")]),
    (HostRates(psi_full={"memory": 10.0}), [("psi-memory", "critical", "some 0.0 % full 10.0 %",
                                               "some avg10 10 % / full avg10 10 %")]),
]


@pytest.mark.parametrize(("host", "expected"), HOST_CASES)
def test_host_signals_at_their_boundaries(tmp_path: Path, host: HostRates, expected: list[tuple[str, ...]]) -> None:
    r = Rates(1.0, host, [], [])
    found = Diagnoser(make_host(tmp_path)).diagnose(r, Snapshot(1.0, HostSample()))
    assert [(d.signal, d.level, d.value, d.threshold) for d in found] == expected


def _disk(ms: float) -> dict[str, DiskRates]:
    return {"vda": DiskRates(1, 1, None, ms, None, 1)}


GUEST_CASES = [
    (GuestRates("k", "g", "s", vcpu_delay={0: 0.049}), []),
    (GuestRates("k", "g", "s", vcpu_delay={0: 0.05}), [("vcpu-delay", "warn", "5% run delay",
                                                      "5 % / 10 % per vCPU (CPU Ready)")]),
    (GuestRates("k", "g", "s", disks=_disk(9.9)), []),
    (GuestRates("k", "g", "s", disks=_disk(10.0)), [("disk-latency vda", "warn", "10.0 ms/op", "10 / 25 ms (hdd)")]),
    (GuestRates("k", "g", "s", disks=_disk(25.0)), [("disk-latency vda", "critical", "25.0 ms/op",
                                                    "10 / 25 ms (hdd)")]),
    (GuestRates("k", "g", "s", nics={"vnet0": NicRates(10, 0, 0.0)}), []),
    (GuestRates("k", "g", "s", nics={"vnet0": NicRates(10, 1, 0.001)}),
     [("net-drops vnet0", "warn", "1 drops (0.10%)", "any / 1 %")]),
    (GuestRates("k", "g", "s", nics={"vnet0": NicRates(10, 10, 0.01)}),
     [("net-drops vnet0", "critical", "10 drops (1.00%)", "any / 1 %")]),
    (GuestRates("k", "g", "s", balloon_fraction=0.9), []),
    (GuestRates("k", "g", "s", balloon_fraction=0.899), [("balloon", "warn", "90% of its memory",
                                                         "90 % / 75 % (kvmtune)")]),
    (GuestRates("k", "g", "s", balloon_fraction=0.749), [("balloon", "critical", "75% of its memory",
                                                         "90 % / 75 % (kvmtune)")]),
]


@pytest.mark.parametrize(("guest", "expected"), GUEST_CASES)
def test_guest_signals_at_their_boundaries(tmp_path: Path, guest: GuestRates, expected: list[tuple[str, ...]]) -> None:
    r, snap = one_guest(guest)
    found = Diagnoser(make_host(tmp_path)).diagnose(r, snap)
    assert [(d.signal, d.level, d.value, d.threshold) for d in found] == expected


def test_sample_json_thresholds_keep_their_shape() -> None:
    doc = thresholds_json()
    assert list(doc) == ["vcpu-delay", "host-cpu", "disk-latency-flash", "disk-latency-hdd", "net-drops", "psi-memory",
                         "balloon"]
    assert doc["balloon"] == {"warn": 0.9, "critical": 0.75, "unit": "balloon size / defined memory (lower is worse)",
                              "source": "kvmtune's own value: a guest ballooned below 90 % of its memory is being squeezed"}
    assert doc["disk-latency-flash"] == {"warn": 2.0, "critical": 10.0, "unit": "ms per operation",
                                         "source": "storage vendors' knowledge-base guidance"}
