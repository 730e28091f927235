"""top/sample read the settings file's [thresholds] (issue 33): the verdict, the label and the sample's
thresholds move with them; with none, the cited defaults."""

from __future__ import annotations

import json
from pathlib import Path

from kvmtune import cli
from kvmtune.audit.thresholds import Thresholds
from kvmtune.live.diagnose import Diagnoser
from kvmtune.live.signals import GuestRates

from .test_symptoms import make_host, one_guest


def test_run_delay_thresholds_come_from_the_settings(tmp_path: Path) -> None:
    r, snap = one_guest(GuestRates("src#web", "web", "src", vcpu_delay={0: 0.15}))
    default = Diagnoser(make_host(tmp_path)).diagnose(r, snap)
    assert [(d.level, d.threshold) for d in default] == [("critical", "5 % / 10 % per vCPU (CPU Ready)")]
    site = Diagnoser(make_host(tmp_path), Thresholds(run_delay_warn=0.1, run_delay_critical=0.2)).diagnose(r, snap)
    assert [(d.level, d.threshold) for d in site] == [("warn", "10 % / 20 % per vCPU (CPU Ready)")]
    assert Diagnoser(make_host(tmp_path), Thresholds(run_delay_warn=0.2, run_delay_critical=0.3)).diagnose(r, snap) == []


def test_sample_writes_the_thresholds_it_judged_by(tmp_path: Path) -> None:
    make_host(tmp_path / "root")
    config = tmp_path / "k.toml"
    config.write_text("[thresholds]\ndisk_latency_flash_ms = 4\ncpu_utilization = 0.7\n")
    config.chmod(0o644)
    out = tmp_path / "s.json"
    assert cli.main(["sample", "--config", str(config), "--root", str(tmp_path / "root"), "--no-libvirt", "--duration",
                     "0.1", "--interval", "0.1", "--format", "json", "-o", str(out)]) == 0
    th = json.loads(out.read_text())["thresholds"]
    assert (th["disk-latency-flash"]["warn"], th["disk-latency-flash"]["critical"]) == (4.0, 10.0)
    assert th["host-cpu"]["warn"] == 0.7 and th["disk-latency-hdd"]["warn"] == 10.0
