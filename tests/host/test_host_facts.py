"""HostFacts over fixture trees, and what happens with absent, unreadable and garbled files."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import run_rules
from kvmtune.audit.rule import HostRule, all_rules
from kvmtune.cli import main
from kvmtune.host.facts import HostFacts
from kvmtune.host.root import HostReadError, HostRoot
from kvmtune.qemu.process import running_qemu_guests

HOSTS = Path(__file__).resolve().parents[1] / "fixtures" / "hosts"

HOST_RULES = [r for r in all_rules() if issubclass(r, HostRule)]


def audit(root: Path | HostRoot) -> tuple[set[str], list[str]]:
    host = root if isinstance(root, HostRoot) else HostRoot(str(root))
    ctx = AuditContext(host=host)
    found = run_rules(ctx, audit_host=True, rules=HOST_RULES)
    return {f.rule for f in found}, ctx.errors


def test_facts_of_the_overcommitted_host() -> None:
    f = HostFacts(HostRoot(str(HOSTS / "ksm-overcommit")), guests=running_qemu_guests)
    assert f.kernel_version == (5, 14) and f.cpu_count == 16 and f.cpu_vendor_virt_flag == "vmx"
    assert sorted(f.numa_nodes) == [0, 1] and f.numa_nodes[1] == set(range(8, 16))
    assert len(f.guests) == 12 and f.guest_vcpus == 72 and f.memory_ratio == pytest.approx(1.5)
    assert f.ksm is not None and f.ksm.running and f.ksm.sharing_ratio == 6.0
    assert f.ksmd is not None and f.ksmd.comm == "ksmd"
    assert f.ksmd_cpu_percent() == pytest.approx(12.0, abs=0.1)
    br = f.net_devices["br0"]
    assert br.kind == "bridge" and "vnet3" in br.ports and f.net_devices["vnet3"].kind == "tap"
    assert f.net_devices["vnet3"].master == "br0" and f.net_devices["eno1"].speed_mbps == 10000
    assert {d.name: d.kind for d in f.block_devices} == {"nvme0n1": "nvme", "sda": "ssd"}
    assert f.errors == []


def test_rhel6_specifics() -> None:
    f = HostFacts(HostRoot(str(HOSTS / "rhel6-old")), guests=running_qemu_guests)
    assert f.thp is not None and f.thp.base.endswith("redhat_transparent_hugepage")
    assert f.module_param("kvm", "halt_poll_ns") is None
    assert [g.name for g in f.guests] == ["rhel6guest"] and f.guests[0].virt_type == "kvm"  # /usr/libexec/qemu-kvm
    assert f.block_devices[0].legacy
    assert f.sysctl_origin("net.ipv4.tcp_tw_reuse").startswith("/etc/sysctl.conf:")


def test_macvtap_and_lower(make_variant) -> None:  # type: ignore[no-untyped-def]
    f = HostFacts(HostRoot(str(HOSTS / "nvme-modern")), guests=running_qemu_guests)
    mv = f.net_devices["macvtap0"]
    assert mv.kind == "macvtap" and mv.lower == ["ens1f1"]


GARBAGE = {
    "/sys/kernel/mm/ksm/run": "banana\n",
    "/proc/sys/vm/swappiness": "\x00\x01\x02",
    "/sys/block/nvme0n1/queue/scheduler": "mq-deadline kyber bfq none\n",  # no [current]
    "/proc/meminfo": "this is not meminfo\n",
}


@pytest.mark.parametrize(("path", "content"), GARBAGE.items(), ids=list(GARBAGE))
def test_garbage_is_one_line_naming_the_file(path: str, content: str, make_variant) -> None:  # type: ignore[no-untyped-def]
    root = make_variant("ksm-overcommit", {path: content})
    rules, errors = audit(root)
    assert len(errors) == 1, errors
    assert errors[0].startswith(str(root / path.lstrip("/")) + ": holds ")
    assert "\n" not in errors[0]
    assert "KVM-HST-019" in rules  # the rest of the audit goes on
    assert "KVM-HST-007" in rules or path.startswith("/sys/kernel/mm/ksm")


def test_a_directory_where_a_file_should_be(make_variant) -> None:  # type: ignore[no-untyped-def]
    root = make_variant("ksm-overcommit", {"/proc/sys/vm/swappiness": None})
    (root / "proc/sys/vm/swappiness").mkdir()
    rules, errors = audit(root)
    assert errors == [f"{root}/proc/sys/vm/swappiness: is a directory"]
    assert "KVM-HST-010" not in rules and "KVM-HST-020" in rules


def test_absent_files_are_not_errors(make_variant) -> None:  # type: ignore[no-untyped-def]
    root = make_variant("ksm-overcommit", {"/sys/kernel/mm/ksm": None, "/proc/stat": None, "/proc/net": None,
                                           "/sys/module/kvm": None})
    rules, errors = audit(root)
    assert errors == []
    assert {"KVM-HST-007", "KVM-HST-018", "KVM-HST-023", "KVM-HST-011"}.isdisjoint(rules)
    assert "KVM-HST-006" in rules  # overcommitted and no KSM at all


class Unreadable(HostRoot):
    """A root where some files exist but raise EACCES (as for a non-root user)."""

    denied: tuple[str, ...] = ("/sys/module/kvm/parameters/halt_poll_ns", "/proc/sys/kernel/random/entropy_avail")

    def read_text(self, host_path: str, limit: int = 4 * 1024 * 1024) -> str:
        if host_path in self.denied:
            raise HostReadError(host_path, "not readable (permission denied)")
        return super().read_text(host_path, limit)


def test_unreadable_files_are_one_line_each() -> None:
    rules, errors = audit(Unreadable(str(HOSTS / "ksm-overcommit")))
    assert sorted(errors) == sorted(
        f"{HOSTS / 'ksm-overcommit'}{p}: not readable (permission denied)" for p in Unreadable.denied
    )
    assert "KVM-HST-011" not in rules and "KVM-HST-019" in rules


def test_cli_reports_garbage_without_traceback(make_variant, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    root = make_variant("rhel6-old", {"/sys/kernel/mm/ksm/pages_sharing": "NaN\n"})
    code = main(["audit", "--host", "--root", str(root)])
    out = capsys.readouterr()
    assert code == 2
    assert f"kvmtune: {root}/sys/kernel/mm/ksm/pages_sharing: holds 'NaN', expected an integer" in out.err
    assert "Traceback" not in out.err and "KVM-HST-022" in out.out


def test_root_that_is_not_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:  # --root is argparse's to refuse now (cli/command.py root_option)
        main(["audit", "--host", "--root", str(tmp_path / "nope")])
    assert exc.value.code == 2
    assert "not a directory" in capsys.readouterr().err


@pytest.mark.parametrize("scenario", ["this-machine", "rhel6-old", "nvme-modern", "ksm-overcommit"])
def test_every_fixture_reads_cleanly(scenario: str) -> None:
    f = HostFacts(HostRoot(str(HOSTS / scenario)), guests=running_qemu_guests)
    f.load_all()
    assert f.errors == []
    assert f.cpu_count and f.mem_total_kib and f.kernel_release


def test_live_host_audit_is_fast() -> None:
    """The whole host audit of this machine, in process, well under the 1 s budget."""
    t0 = time.perf_counter()
    _, errors = audit(HostRoot("/"))
    elapsed = time.perf_counter() - t0
    assert elapsed < 1.0, elapsed
    assert errors == []


def test_facts_of_the_pinned_latency_host() -> None:
    f = HostFacts(HostRoot(str(HOSTS / "pinned-latency")), guests=running_qemu_guests)
    assert set(f.cpu_governors.values()) == {"powersave"} and len(f.cpu_governors) == 16
    assert set(f.energy_perf_bias.values()) == {6}
    assert [(s.name, s.latency_us) for s in f.cpuidle_states] == [("POLL", 0), ("C1", 2), ("C1E", 10), ("C6", 133)]
    assert f.pinned_guest_cpus == {6100: {2, 3, 4, 5}, 6101: {6, 7, 8, 9}}  # the emulator thread (0-15) is not pinned
    assert f.process_running("irqbalance") and not f.process_running("tuned")
    assert f.irq_affinity["24"] == {2}
    assert set(f.iommu_groups.values()) == {"DMA-FQ"}
    assert f.errors == []


def test_cpu_lists_on_the_kernel_command_line(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cmdline").write_text("ro isolcpus=managed_irq,domain,2-5,9 nohz_full=2-5 rcu_nocbs=2-5\n")
    f = HostFacts(HostRoot(str(tmp_path)), guests=running_qemu_guests)
    assert f.cmdline_cpus("isolcpus") == {2, 3, 4, 5, 9}
    assert f.cmdline_cpus("isolcpus", "nohz_full") == {2, 3, 4, 5, 9}
    assert f.cmdline_cpus("missing") == set()


def test_format_cpu_list_is_the_inverse_of_parse() -> None:
    from kvmtune.host.parsers import format_cpu_list, parse_cpu_list

    for text in ("0-2,5", "7", "0-15", "1,3,5-6"):
        assert format_cpu_list(parse_cpu_list(text)) == text
    assert format_cpu_list(set()) == ""
