"""The guest tier's NIC experiments: sides from the interface as it is and as the fixer writes it, the plumbing's QEMU
options, netload's result read strictly, and which kernel the probe guests boot."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import run_rules
from kvmtune.audit.verifyplan import NIC_MQ_JOB, NIC_STREAM_JOB, GuestExperiment
from kvmtune.domain.xml import guest_from_tree, parse_xml_bytes
from kvmtune.errors import KvmtuneError
from kvmtune.host.root import HostRoot
from kvmtune.lab.probe.kernel import BOOT, CACHED, FETCH_SCRIPT, GIVEN, cached_kernel, choose_kernel, lacks_line
from kvmtune.lab.probe.net import VHOST_MISSING, netdev_arg
from kvmtune.lab.probe.pair import NETDEV_ID
from kvmtune.lab.probe.side import GuestSide
from kvmtune.model.guest import Guest
from kvmtune.runner import Runner
from kvmtune.verify.engine import subjects
from kvmtune.verify.experiments import Subject, Unmeasurable, VerifyContext
from kvmtune.verify.guest.nic import build_sides, fixed_nic, knobs_of, parse_netload, workload_name
from kvmtune.verify.planner import plan_for

from .test_guest_tier_sides import qemu_args

EXAMPLES = Path(__file__).resolve().parents[2] / "src" / "kvmtune" / "examples"


def _guest(nic: str, vcpus: int = 1) -> Guest:
    xml = f"""<domain type='kvm'><name>n</name><memory>1048576</memory><vcpu>{vcpus}</vcpu>
      <os><type arch='x86_64' machine='pc-q35-8.2'>hvm</type></os><devices>
      <interface type='bridge'><mac address='52:54:00:00:00:01'/><source bridge='br0'/>{nic}</interface>
      </devices></domain>"""
    return guest_from_tree(parse_xml_bytes(xml.encode(), "n.xml"), "n.xml", "xml")


def _subject(guest: Guest, rule: str) -> Subject:
    findings = [f for f in run_rules(AuditContext(host=HostRoot("/")), [guest]) if f.rule == rule]
    (s,) = subjects(findings, [guest], [])
    assert s.interface is not None, "the engine joins a NIC finding to its interface"
    return s


def _ctx(tmp_path: Path) -> VerifyContext:
    return VerifyContext(runner=Runner(), host=HostRoot("/"), root="/", workdir=tmp_path)


def _sides(nic: str, rule: str, tmp_path: Path, *, vcpus: int = 1, vhost_device: bool = True, cpus: int = 2,
           ) -> tuple[GuestSide, GuestSide, list[str]]:
    guest = _guest(nic, vcpus)
    s = _subject(guest, rule)
    assert s.interface is not None
    after_guest, after = fixed_nic(guest, s.interface, rule, _ctx(tmp_path))
    plan = plan_for(rule)
    assert isinstance(plan, GuestExperiment) and plan.part == "nic"
    assert not isinstance(plan.job, str) and plan.job in (NIC_STREAM_JOB, NIC_MQ_JOB)
    return build_sides(knobs_of(s.interface, guest), knobs_of(after, after_guest), vhost_device=vhost_device, cpus=cpus,
                       guest_vcpus=after_guest.vcpus or 1, job=plan.job)


def test_e1000_against_virtio(tmp_path: Path) -> None:
    a, b, notes = _sides("<model type='e1000'/>", "KVM-NET-001", tmp_path)
    assert (a.nic_model, a.vhost, a.nic_queues) == ("e1000", False, None)
    assert (b.nic_model, b.vhost) == ("virtio", True)  # libvirt's default for virtio on a host with /dev/vhost-net
    assert a.vcpus == b.vcpus == 1 and notes == []
    assert a.changes_to(b) == "nic model e1000 → virtio, vhost off → on"


def test_an_unnamed_model_is_libvirts_rtl8139_on_x86(tmp_path: Path) -> None:
    a, b, _ = _sides("", "KVM-NET-001", tmp_path, vhost_device=False)
    assert a.nic_model == "rtl8139" and b.nic_model == "virtio" and not b.vhost


def test_virtio_without_vhost_against_vhost(tmp_path: Path) -> None:
    a, b, _ = _sides("<model type='virtio'/><driver name='qemu'/>", "KVM-NET-002", tmp_path)
    assert (a.nic_model, a.vhost, b.nic_model, b.vhost) == ("virtio", False, "virtio", True)
    plumbing_b = ["-netdev", netdev_arg("B", b), *qemu_args(b, None, netdev=NETDEV_ID)]
    netdev = plumbing_b[1]
    assert netdev.startswith(f"tap,id={NETDEV_ID},ifname=kvtap-b,script=no,downscript=no") and netdev.endswith(",vhost=on")
    assert f"virtio-net-pci,netdev={NETDEV_ID}," in " ".join(plumbing_b)
    assert netdev_arg("A", a).endswith(",vhost=off")


def test_vhost_is_not_measured_without_dev_vhost_net(tmp_path: Path) -> None:
    with pytest.raises(Unmeasurable) as exc:
        _sides("<model type='virtio'/><driver name='qemu'/>", "KVM-NET-002", tmp_path, vhost_device=False)
    assert str(exc.value) == VHOST_MISSING == "/dev/vhost-net is missing on this host (modprobe vhost_net)"


def test_without_dev_vhost_net_virtio_runs_without_it_and_says_so(tmp_path: Path) -> None:
    a, b, notes = _sides("<model type='e1000'/>", "KVM-NET-001", tmp_path, vhost_device=False)
    assert not a.vhost and not b.vhost and b.nic_model == "virtio"
    assert notes and "/dev/vhost-net is missing" in notes[0]


def test_queues_follow_the_fixer_scaled_to_this_hosts_cpus(tmp_path: Path) -> None:
    a, b, notes = _sides("<model type='virtio'/>", "KVM-NET-008", tmp_path, vcpus=8, cpus=2)
    assert (a.nic_queues, b.nic_queues, a.vcpus, b.vcpus) == (None, 2, 2, 2)  # fixer: queues=8, measured at 2
    assert notes == ["8 vCPUs/queues measured as 2: the probe guests get at most this host's 2 CPUs"]
    netdev = netdev_arg("B", b)
    assert netdev.endswith(",queues=2")
    device = qemu_args(b, None, netdev=NETDEV_ID)
    assert any(",mq=on,vectors=6" in arg for arg in device)
    a4, b4, notes4 = _sides("<model type='virtio'/>", "KVM-NET-008", tmp_path, vcpus=4, cpus=16)
    assert (a4.nic_queues, b4.nic_queues, b4.vcpus, notes4) == (None, 4, 4, [])


def test_ring_sizes(tmp_path: Path) -> None:
    a, b, _ = _sides("<model type='virtio'/><driver queues='4'/>", "KVM-NET-021", tmp_path, vcpus=4, cpus=4)
    assert (a.rx_queue_size, b.rx_queue_size, a.nic_queues, b.nic_queues) == (None, 1024, 4, 4)
    assert any("rx_queue_size=1024" in arg for arg in qemu_args(b, None, netdev=NETDEV_ID))
    assert a.changes_to(b) == "rx queue size default → 1024"


def test_an_unknown_model_is_one_line() -> None:
    guest = _guest("<model type='pcnet'/>")
    with pytest.raises(Unmeasurable, match="the probe guest has no pcnet NIC"):
        knobs_of(guest.nics[0], guest)


def test_the_examples_nic_findings_find_their_interfaces(tmp_path: Path) -> None:
    from kvmtune.audit.collect import add_domain_files
    from kvmtune.audit.engine import AuditResult

    result = AuditResult()
    add_domain_files([str(EXAMPLES)], result)
    findings = [f for f in run_rules(AuditContext(host=HostRoot("/")), result.guests) if f.rule in ("KVM-NET-001", "KVM-NET-008")]
    subs = subjects(findings, result.guests, [])
    assert {(s.finding.rule, s.guest.name if s.guest else None) for s in subs} == {("KVM-NET-001", "web01-legacy"),
                                                                                    ("KVM-NET-008", "hpc01-pinned")}
    for s in subs:
        assert s.interface is not None and s.interface.label == s.finding.target.device


def _doc(**summary: object) -> str:
    base: dict[str, object] = {"throughput_bytes_per_s": 12_500_000.0, "transactions_per_s": 3.0, "bytes": 25_000_000,
                               "transactions": 6, "errors": 0, "duration_s": 2.0}
    return json.dumps({"summary": {**base, **summary}})


def test_netload_result_is_read_strictly() -> None:
    assert parse_netload(_doc(), NIC_STREAM_JOB) == 12.5
    rr = NIC_STREAM_JOB.__class__("rr", "rr")
    assert parse_netload(_doc(), rr) == 3.0
    for text, message in ((
        "not json", "no JSON"), ("[1]", "not an object"), (json.dumps({"error": {"message": "refused"}}), "netload: refused"),
        (json.dumps({"summary": {}}), "lacks its summary"), (_doc(errors=2), "2 errors"),
        (_doc(throughput_bytes_per_s=0.0), "measured nothing"), (_doc(throughput_bytes_per_s="NaN"), "measured nothing"),
    ):
        with pytest.raises(KvmtuneError, match=message):
            parse_netload(text, NIC_STREAM_JOB)


def test_workload_names() -> None:
    assert workload_name(NIC_STREAM_JOB) == "str-writex30k" and workload_name(NIC_MQ_JOB) == "str-writex30k"
    assert workload_name(NIC_STREAM_JOB.__class__("rr", "rr")) == "rr1c-1x1"
    assert workload_name(NIC_STREAM_JOB.__class__("rr", "rr", size=64)) == "rr1c-64x64"


def _release(cache: Path, release: str, complete: bool = True) -> None:
    (cache / release / "boot").mkdir(parents=True)
    (cache / release / "boot" / f"vmlinuz-{release}").write_bytes(b"k")
    (cache / release / "lib" / "modules" / release).mkdir(parents=True)
    if complete:
        (cache / release / "lib" / "modules" / release / "modules.dep").write_text("")


def test_the_cached_generic_kernel_is_chosen_unless_one_is_given(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    assert cached_kernel(cache) is None
    assert choose_kernel(cache=cache).origin == BOOT and choose_kernel(cache=cache).kernel is None
    _release(cache, "6.1.0-9-amd64")
    _release(cache, "6.1.0-56-amd64")
    _release(cache, "6.1.0-60-amd64", complete=False)  # a partial unpack is not used
    (cache / ".partial-x").mkdir()
    chosen = choose_kernel(cache=cache)
    assert chosen.origin == CACHED and chosen.kernel == str(cache / "6.1.0-56-amd64" / "boot" / "vmlinuz-6.1.0-56-amd64")
    assert chosen.modules_dir == str(cache / "6.1.0-56-amd64" / "lib" / "modules" / "6.1.0-56-amd64")
    given = choose_kernel("/k", "/m", cache=cache)
    assert (given.kernel, given.modules_dir, given.origin) == ("/k", "/m", GIVEN)


def test_a_missing_driver_is_one_line_naming_it_and_how_to_get_one(tmp_path: Path) -> None:
    line = lacks_line("side A (e1000 NIC)", ["e1000"], "6.1.0-56-cloud-amd64", choose_kernel(cache=tmp_path))
    assert "\n" not in line
    assert line.startswith("side A (e1000 NIC) needs the guest driver e1000, which the probe guest's kernel "
                           "6.1.0-56-cloud-amd64 (/boot's newest kernel (what bench uses)) lacks")
    assert FETCH_SCRIPT in line and "--guest-kernel PATH --guest-modules DIR" in line


def _fake_kernel(tmp_path: Path, release: str, modules: list[str]) -> tuple[str, str]:
    """A kernel image named by its release (no bzImage header: find_kernel reads the name) and a module tree."""
    kernel = tmp_path / f"vmlinuz-{release}"
    kernel.write_bytes(b"not a bzImage")
    tree = tmp_path / "lib" / "modules" / release
    tree.mkdir(parents=True)
    (tree / "modules.dep").write_text("".join(f"kernel/drivers/net/{m}.ko:\n" for m in modules))
    return str(kernel), str(tree)


def test_plan_says_in_one_line_which_driver_the_chosen_kernel_lacks(tmp_path: Path) -> None:
    from kvmtune.verify.engine import plan_all

    guest = _guest("<model type='e1000'/>")
    ctx = _ctx(tmp_path / "work")
    ctx.guest_kernel, ctx.guest_modules = _fake_kernel(tmp_path, "6.1.0-56-cloud-amd64", ["virtio_net", "net_failover"])
    (p,) = plan_all([_subject(guest, "KVM-NET-001")], ctx)
    assert p.experiment is None and p.result.reason is not None
    assert p.result.reason == (
        "side A (e1000 NIC) needs the guest driver e1000, which the probe guest's kernel 6.1.0-56-cloud-amd64 "
        "(--guest-kernel) lacks: pass --guest-kernel PATH --guest-modules DIR with a kernel that has it (a generic "
        "distribution kernel)")
    assert "not measured: side A (e1000 NIC) needs the guest driver e1000" in p.result.line()


@pytest.mark.skipif(Path("/dev/vhost-net").exists(), reason="this host has /dev/vhost-net: the vhost experiment runs")
def test_the_vhost_fix_is_not_measured_where_dev_vhost_net_is_missing(tmp_path: Path) -> None:
    from kvmtune.verify.engine import plan_all

    guest = _guest("<model type='virtio'/><driver name='qemu'/>")
    (p,) = plan_all([_subject(guest, "KVM-NET-002")], _ctx(tmp_path))
    assert p.experiment is None
    assert p.result.line().endswith("not measured: /dev/vhost-net is missing on this host (modprobe vhost_net)")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--guest-modules", "/lib/modules"], "--guest-modules goes with --guest-kernel"),
        (["--guest-kernel", "/nonexistent/vmlinuz"], "--guest-kernel /nonexistent/vmlinuz: no such kernel image"),
        (["--guest-kernel", "/bin/sh", "--guest-modules", "/nonexistent"], "--guest-modules /nonexistent: no modules.dep"),
    ],
)
def test_bad_guest_kernel_options_are_one_line_and_exit_2(argv: list[str], message: str, tmp_path: Path) -> None:
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "kvmtune", "verify", "--examples", *argv, "--workdir", str(tmp_path),
                          "--no-store"], capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False)
    assert res.returncode == 2 and message in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr and res.stdout == ""


def test_a_given_guest_kernel_reaches_the_plan(tmp_path: Path) -> None:
    """--guest-kernel/--guest-modules replace the cached generic kernel: the NIC plan reads that kernel's modules."""
    import subprocess
    import sys

    kernel, modules = _fake_kernel(tmp_path, "6.1.0-7-cloud-amd64", ["virtio_net"])
    res = subprocess.run([sys.executable, "-m", "kvmtune", "verify", "--examples", "--only", "KVM-NET-001", "--allow-tcg",
                          "--guest-kernel", kernel, "--guest-modules", modules, "--workdir", str(tmp_path / "w"),
                          "--no-store"], capture_output=True, text=True, stdin=subprocess.DEVNULL, check=False, timeout=120)
    assert res.returncode == 0, res.stderr
    assert ("not measured: side A (e1000 NIC) needs the guest driver e1000, which the probe guest's kernel "
            "6.1.0-7-cloud-amd64 (--guest-kernel) lacks") in res.stdout
