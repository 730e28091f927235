"""fix --host on fixture trees built in tmp dirs (never this machine's /etc, /proc/sys or /sys)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixhelpers import snapshot_tree, tree_dirs, undo_argv, write

from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import run_rules
from kvmtune.audit.rule import rule_by_id
from kvmtune.cli import main
from kvmtune.fix.host import plan_host
from kvmtune.fix.plan import SysfsWrite, read_value
from kvmtune.host.root import HostRoot

RUNTIME = ("proc/sys/", "sys/")


def value(root: Path, host_path: str) -> str | None:
    # multiple-choice files: the kernel shows "[always] madvise never" after "always" is written
    parse = "bracket" if host_path.endswith("/scheduler") or "transparent_hugepage/" in host_path else "plain"
    return read_value(root / host_path.lstrip("/"), parse)


def values(root: Path) -> dict[str, str | None]:
    return {
        rel: value(root, "/" + rel)
        for rel in snapshot_tree(root)
        if rel.startswith(RUNTIME)
    }


def files(root: Path) -> dict[str, bytes]:
    return {k: v for k, v in snapshot_tree(root).items() if not k.startswith(RUNTIME)}


def test_dry_run_changes_nothing(seed_host: Path, journal_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = snapshot_tree(seed_host)
    assert main(["fix", "--host", "--root", str(seed_host)]) == 0
    out = capsys.readouterr().out
    assert "/proc/sys/vm/swappiness: 60 → 10" in out
    assert "+++ /etc/sysctl.d/90-kvmtune.conf" in out
    assert "99-local.conf:2 sets 30" in out  # a later sysctl.d file would win at boot: said, not touched
    assert snapshot_tree(seed_host) == before
    assert list(journal_dir.iterdir()) == []


def test_virtual_host_apply_fix_again_undo(seed_host: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files_before, values_before, dirs_before = files(seed_host), values(seed_host), tree_dirs(seed_host)
    assert main(["fix", "--host", "--apply", "--yes", "--root", str(seed_host)]) == 0
    undo = undo_argv(capsys.readouterr().out)

    def v(path: str) -> str | None:
        return value(seed_host, path)

    assert v("/proc/sys/vm/swappiness") == "10"
    assert v("/proc/sys/vm/dirty_ratio") == "40"
    assert v("/proc/sys/vm/dirty_background_ratio") == "5"
    assert v("/proc/sys/net/ipv4/tcp_tw_reuse") == "2"  # today's practice, not seed 002's 1
    assert v("/proc/sys/net/core/somaxconn") == "4096"  # already above tuned's minimum: left alone
    assert v("/sys/module/kvm/parameters/halt_poll_ns") == "200000"
    assert v("/sys/block/nvme0n1/queue/scheduler") == "none"
    assert v("/sys/block/sda/queue/scheduler") == "mq-deadline"
    assert v("/sys/block/sdb/queue/scheduler") == "bfq"  # fine for a rotational disk: left alone
    assert v("/sys/class/net/vnet0/tx_queue_len") == "2500"  # it dropped packets
    assert v("/sys/class/net/vnet1/tx_queue_len") == "1000"  # it did not
    assert v("/proc/sys/net/ipv4/tcp_rmem") == "4096 87380 6291456"  # not this profile's business
    sysctl = (seed_host / "etc/sysctl.d/90-kvmtune.conf").read_text()
    assert "vm.swappiness = 10\n" in sysctl and "net.ipv4.tcp_tw_reuse = 2\n" in sysctl
    assert "somaxconn" not in sysctl
    udev = (seed_host / "etc/udev/rules.d/90-kvmtune.rules").read_text()
    assert 'ATTR{queue/scheduler}="none"' in udev and 'ATTR{tx_queue_len}="2500"' in udev
    assert (seed_host / "etc/modprobe.d/kvmtune.conf").read_text().endswith("options kvm halt_poll_ns=200000\n")

    assert main(["fix", "--host", "--root", str(seed_host)]) == 0
    assert "Nothing to change." in capsys.readouterr().out

    assert main(undo) == 0
    capsys.readouterr()
    assert files(seed_host) == files_before  # drop-ins gone, other files byte-identical
    assert values(seed_host) == values_before  # every runtime value as before
    assert tree_dirs(seed_host) == dirs_before  # /etc/udev/rules.d and /etc/modprobe.d it created are gone


def test_host_rules_are_quiet_after_apply(seed_host: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ids = ["KVM-HST-004", "KVM-HST-010", "KVM-HST-011", "KVM-HST-015"]
    rules = [r for r in (rule_by_id(i) for i in ids) if r is not None]
    if not rules:
        pytest.skip("host rules not present")
    write(seed_host, "/sys/module/kvm/parameters/halt_poll_ns", "400000\n")

    def found() -> set[str]:
        ctx = AuditContext(host=HostRoot(str(seed_host)))
        return {f.rule for f in run_rules(ctx, audit_host=True, rules=rules)}

    before = found()
    assert before, "the seed-era tree should trip these rules"
    assert main(["fix", "--host", "--apply", "--yes", "--root", str(seed_host)]) == 0
    capsys.readouterr()
    assert found() == set()


def test_network_throughput_and_storage_profiles(seed_host: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = plan_host(str(seed_host), "network-throughput")
    writes = {c.path: c.new for c in plan.changes if isinstance(c, SysfsWrite)}
    assert writes["/proc/sys/net/ipv4/tcp_rmem"] == "4096 131072 16777216"
    assert writes["/proc/sys/net/ipv4/tcp_wmem"] == "4096 16384 16777216"
    assert writes["/proc/sys/net/core/netdev_max_backlog"] == "10000"  # softnet_stat shows drops
    storage = {c.path for c in plan_host(str(seed_host), "storage").changes if isinstance(c, SysfsWrite)}
    assert "/proc/sys/vm/swappiness" in storage
    assert not any(p.startswith(("/proc/sys/net", "/sys/class/net")) for p in storage)
    latency = {c.path: c.new for c in plan_host(str(seed_host), "network-latency").changes if isinstance(c, SysfsWrite)}
    assert latency["/proc/sys/net/core/busy_poll"] == "50"
    assert latency["/proc/sys/vm/dirty_ratio"] == "40"  # not latency-performance's 10 (an outdated-profile marker)


def test_profile_switch_and_undo_in_reverse(seed_host: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files_before, values_before = files(seed_host), values(seed_host)
    assert main(["fix", "--host", "--apply", "--yes", "--root", str(seed_host)]) == 0
    first = undo_argv(capsys.readouterr().out)
    assert main(["fix", "--profile", "network-throughput", "--apply", "--yes", "--root", str(seed_host)]) == 0
    second = undo_argv(capsys.readouterr().out)
    assert "profile network-throughput" in (seed_host / "etc/sysctl.d/90-kvmtune.conf").read_text()
    assert main(["fix", "--profile", "network-throughput", "--root", str(seed_host)]) == 0
    assert "Nothing to change." in capsys.readouterr().out
    assert main(second) == 0
    assert "profile virtual-host" in (seed_host / "etc/sysctl.d/90-kvmtune.conf").read_text()
    assert main(first) == 0
    capsys.readouterr()
    assert files(seed_host) == files_before
    assert values(seed_host) == values_before


def test_dirty_bytes_is_what_undo_restores(seed_host: Path) -> None:
    """Writing dirty_ratio zeroes dirty_bytes in the kernel: undo must write dirty_bytes back, not ratio 0."""
    write(seed_host, "/proc/sys/vm/dirty_ratio", "0\n")
    write(seed_host, "/proc/sys/vm/dirty_bytes", "268435456\n")
    plan = plan_host(str(seed_host), "virtual-host")
    w = next(c for c in plan.changes if isinstance(c, SysfsWrite) and c.path == "/proc/sys/vm/dirty_ratio")
    assert w.restore == [("/proc/sys/vm/dirty_bytes", "268435456")]


def test_missing_knobs_are_skipped_with_a_reason(seed_host: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (seed_host / "proc/sys/net/core/busy_poll").unlink()
    (seed_host / "sys/module/kvm/parameters/halt_poll_ns").unlink()
    assert main(["fix", "--profile", "network-latency", "--root", str(seed_host)]) == 0
    out = capsys.readouterr().out
    assert "skipped: net.core.busy_poll: not in this host root" in out
    assert "skipped: kvm.halt_poll_ns: kvm is not loaded" in out


def test_kill_between_two_host_changes(seed_host: Path, journal_dir: Path) -> None:
    import os
    import subprocess
    import sys

    files_before, values_before = files(seed_host), values(seed_host)
    env = dict(os.environ, KVMTUNE_TEST_KILL_AFTER_CHANGE="2", KVMTUNE_JOURNAL_DIR=str(journal_dir))
    proc = subprocess.run(
        [sys.executable, "-m", "kvmtune", "fix", "--host", "--apply", "--yes", "--root", str(seed_host)],
        env=env, capture_output=True, text=True, check=False,
    )
    assert proc.returncode == -9
    (jfile,) = journal_dir.glob("*.json")
    doc = json.loads(jfile.read_text())
    assert doc["state"] == "applying"
    assert [e["status"] for e in doc["changes"][:3]] == ["done", "planned", "planned"]
    assert value(seed_host, "/proc/sys/vm/dirty_ratio") == "40"  # change 2 was made, not journaled as done
    assert main(["undo", jfile.stem, "--root", str(seed_host)]) == 0
    assert files(seed_host) == files_before
    assert values(seed_host) == values_before


FIXTURE_HOSTS = sorted(p for p in (Path(__file__).resolve().parents[1] / "fixtures" / "hosts").iterdir() if p.is_dir())


@pytest.mark.parametrize("profile", ["virtual-host", "network-throughput", "network-latency", "storage"])
@pytest.mark.parametrize("fixture", FIXTURE_HOSTS, ids=lambda p: p.name)
def test_captured_hosts_round_trip(fixture: Path, profile: str, tmp_path: Path,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Each captured host tree (copied to a tmp dir first): apply, nothing left to plan, the host rules
    the profile answers are quiet, undo gives back every file byte and every value."""
    import shutil

    root = tmp_path / fixture.name
    shutil.copytree(fixture, root, symlinks=True)
    files_before, values_before = files(root), values(root)
    assert main(["fix", "--profile", profile, "--apply", "--yes", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert main(["fix", "--profile", profile, "--root", str(root)]) == 0
    assert "Nothing to change." in capsys.readouterr().out
    ids = ["KVM-HST-004", "KVM-HST-010", "KVM-HST-011"] + (["KVM-HST-015"] if profile != "storage" else [])
    answered = [r for r in map(rule_by_id, ids) if r]
    ctx = AuditContext(host=HostRoot(str(root)))
    assert [f.rule for f in run_rules(ctx, audit_host=True, rules=answered)] == []
    if "Undo with:" in out:
        assert main(undo_argv(out)) == 0
        capsys.readouterr()
    assert files(root) == files_before
    assert values(root) == values_before
