"""The guest tier without booting: QEMU options per knob (the side's spec through the launcher's qemu_argv), sides
built from example and hand-written domains (side B from the rule's own fixer on a copy), the "needs KVM" line and
the emulation labels."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvmtune.audit.context import AuditContext
from kvmtune.audit.engine import run_rules, select_rules
from kvmtune.audit.verifyplan import IOTHREAD_JOB, FioJob, GuestExperiment
from kvmtune.domain.xml import guest_from_tree, parse_xml_bytes
from kvmtune.host.root import HostRoot
from kvmtune.lab.accel import AccelChoice
from kvmtune.lab.probe.kernel import FETCH_SCRIPT, cache_dir
from kvmtune.lab.probe.pair import (
    Unbootable,
    missing_driver_line,
    side_modules,
)
from kvmtune.lab.probe.side import ExecResult, GuestSide
from kvmtune.lab.qemu import IOTHREAD_ID
from kvmtune.lab.store import CellRow
from kvmtune.lab.vocabulary import HELPS, NOT_COMPARABLE
from kvmtune.runner import Runner
from kvmtune.verify.engine import Planned, VerifyResult, execute_one, plan_all, render_text, subjects
from kvmtune.verify.experiments import Outcome, VerifyContext
from kvmtune.verify.guest.accel import EMULATION
from kvmtune.verify.guest.disk import FioProbe, GuestDiskExperiment, guest_disk
from kvmtune.verify.measure import Judgement, Metric
from probe_helpers import qemu_args

EXAMPLES = Path(__file__).resolve().parents[2] / "src" / "kvmtune" / "examples"


def devices(args: list[str]) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == "-device"]


def option(args: list[str], name: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args) if a == name]


# --------------------------------------------------------------------------- qemu_args, knob by knob


@pytest.mark.parametrize(("side", "expect"), [
    (GuestSide(disk_bus="ide"), ["ide-hd,drive=kvmtune-scratch,id=kvmtune-disk,bus=ide.0,serial=kvmtune0"]),
    (GuestSide(disk_bus="sata"), ["ahci,id=kvmtune-ahci",
                                  "ide-hd,drive=kvmtune-scratch,id=kvmtune-disk,bus=kvmtune-ahci.0,serial=kvmtune0"]),
    (GuestSide(disk_bus="virtio"), ["virtio-blk-pci,drive=kvmtune-scratch,id=kvmtune-disk,serial=kvmtune0"]),
    (GuestSide(disk_bus="virtio", disk_queues=4, disk_queue_size=128, disk_iothread=True),
     [f"virtio-blk-pci,drive=kvmtune-scratch,id=kvmtune-disk,serial=kvmtune0,iothread={IOTHREAD_ID},num-queues=4,"
      "queue-size=128"]),
    (GuestSide(disk_bus="scsi", scsi_model="virtio-scsi", disk_iothread=True),
     [f"virtio-scsi-pci,id=kvmtune-scsi,iothread={IOTHREAD_ID}",
      "scsi-hd,drive=kvmtune-scratch,id=kvmtune-disk,bus=kvmtune-scsi.0,serial=kvmtune0"]),
    (GuestSide(disk_bus="scsi", scsi_model="lsilogic"),
     ["lsi53c895a,id=kvmtune-scsi", "scsi-hd,drive=kvmtune-scratch,id=kvmtune-disk,bus=kvmtune-scsi.0,serial=kvmtune0"]),
    (GuestSide(disk_bus="scsi", scsi_model="megasas"),
     ["megasas,id=kvmtune-scsi", "scsi-hd,drive=kvmtune-scratch,id=kvmtune-disk,bus=kvmtune-scsi.0,serial=kvmtune0"]),
    (GuestSide(disk_bus="nvme"), ["nvme,drive=kvmtune-scratch,id=kvmtune-disk,serial=kvmtune0"]),
], ids=["ide", "sata", "virtio", "virtio-knobs", "virtio-scsi-iothread", "lsilogic", "megasas", "nvme"])
def test_each_bus_is_the_device_qemu_is_given(side: GuestSide, expect: list[str]) -> None:
    args = qemu_args(side, "/scratch/disk-A.raw")
    assert devices(args) == expect
    (drive,) = option(args, "-drive")
    assert drive == "file=/scratch/disk-A.raw,format=raw,if=none,id=kvmtune-scratch,cache=none,aio=threads"
    assert (f"iothread,id={IOTHREAD_ID}" in option(args, "-object")) == side.disk_iothread


def test_the_replica_layout_reaches_the_drive() -> None:
    side = GuestSide(disk_bus="virtio", disk_format="qcow2", disk_cache="default", disk_io="native")
    (drive,) = option(qemu_args(side, "/s/d.qcow2"), "-drive")
    assert "format=qcow2" in drive and "cache=writeback" in drive and "aio=native" in drive  # default: QEMU's writeback


def test_machine_vcpus_topology_and_hugepages() -> None:
    side = GuestSide(vcpus=4, topology=(1, 2, 2), machine="pc-q35-5.1", hugepages=True, memory_mb=1024)
    args = qemu_args(side, None, hugetlbfs="/dev/hugepages")
    assert option(args, "-machine") == ["pc-q35-5.1", "memory-backend=kvmtune-mem"]
    assert option(args, "-smp") == ["4,sockets=1,cores=2,threads=2"]
    assert option(args, "-object") == ["memory-backend-file,id=kvmtune-mem,size=1024M,mem-path=/dev/hugepages,"
                                       "share=off,prealloc=on"]
    assert devices(args) == []  # no disk and no NIC in this side
    with pytest.raises(Unbootable, match="hugetlbfs"):
        qemu_args(side, None)


def test_nic_model_vhost_queues_and_rings() -> None:
    side = GuestSide(nic_model="virtio", vhost=True, nic_queues=4, rx_queue_size=1024, tx_queue_size=512)
    args = qemu_args(side, None, tap="kvt-a0", mac="52:54:00:00:00:01")
    assert option(args, "-netdev") == ["tap,id=kvmtune-net,ifname=kvt-a0,script=no,downscript=no,vhost=on,queues=4"]
    assert devices(args) == ["virtio-net-pci,netdev=kvmtune-net,id=kvmtune-nic,mac=52:54:00:00:00:01,mq=on,vectors=10,"
                             "rx_queue_size=1024,tx_queue_size=512"]
    plain = qemu_args(GuestSide(nic_model="e1000"), None, netdev="n0")  # the plumbing defines the -netdev
    assert option(plain, "-netdev") == [] and devices(plain)[0].startswith("e1000,netdev=n0,")
    off = qemu_args(GuestSide(nic_model="virtio"), None, tap="t")
    assert option(off, "-netdev") == ["tap,id=kvmtune-net,ifname=t,script=no,downscript=no,vhost=off"]


@pytest.mark.parametrize(("side", "why"), [
    (GuestSide(disk_bus="ide", disk_iothread=True), "IOThread serves virtio-blk and virtio-scsi only"),
    (GuestSide(disk_bus="sata", disk_queues=2), "queues are a virtio-blk"),
    (GuestSide(disk_bus="usb"), "no usb disk"),
    (GuestSide(disk_bus="scsi", scsi_model="buslogic"), "no SCSI controller model 'buslogic'"),
    (GuestSide(nic_model="e1000", nic_queues=2), "virtio-net settings"),
    (GuestSide(nic_model="virtio"), "nothing to attach it to"),
    (GuestSide(nic_model="ne2k_pci"), "no NIC model"),
])
def test_what_the_probe_guest_cannot_be_is_one_line(side: GuestSide, why: str) -> None:
    with pytest.raises(Unbootable, match=why) as err:
        qemu_args(side, "/s/d.raw")
    assert "\n" not in str(err.value)


def test_the_drivers_each_side_loads() -> None:
    assert side_modules(GuestSide(disk_bus="ide")) == ("ata_piix", "sd_mod")
    assert side_modules(GuestSide(disk_bus="ide", machine="q35")) == ("ahci", "sd_mod")  # q35's IDE is its AHCI
    assert side_modules(GuestSide(disk_bus="scsi", scsi_model="lsilogic")) == ("sym53c8xx", "sd_mod")
    assert side_modules(GuestSide(disk_bus="virtio", nic_model="e1000")) == ("virtio_pci", "virtio_blk", "e1000")
    line = missing_driver_line("A", GuestSide(disk_bus="sata"), "6.1.0-56-cloud-amd64", ["ahci"])
    assert "ahci" in line and "6.1.0-56-cloud-amd64" in line and "--guest-kernel" in line and "\n" not in line


# --------------------------------------------------------------------------- sides from domains


def _ctx(tmp_path: Path, allow_tcg: bool = True, **kw: object) -> VerifyContext:
    ctx = VerifyContext(runner=Runner(), host=HostRoot("/"), root="/", workdir=tmp_path, allow_tcg=allow_tcg,
                        inputs_hint="--examples", **kw)  # type: ignore[arg-type]
    ctx.guest_accel = AccelChoice("tcg", "/dev/kvm is absent", 0.0)  # decided: no probe boots in a unit test
    return ctx


def _planned(xml: Path, rule: str, ctx: VerifyContext) -> list[Planned]:
    actx = AuditContext(host=HostRoot("/"))
    guest = guest_from_tree(parse_xml_bytes(xml.read_bytes(), str(xml)), str(xml), "xml")
    findings = run_rules(actx, [guest], [], False, select_rules([rule], []))
    assert findings, f"{rule} finds nothing in {xml.name}"
    return plan_all(subjects(findings, [guest], []), ctx)


def _experiment(p: Planned) -> GuestDiskExperiment:
    assert isinstance(p.experiment, GuestDiskExperiment), p.result.reason
    return p.experiment


def test_sto001_ide_to_virtio_from_the_example(tmp_path: Path) -> None:
    (p,) = _planned(EXAMPLES / "web01-legacy.xml", "KVM-STO-001", _ctx(tmp_path))
    exp = _experiment(p)
    assert (exp.a.disk_bus, exp.b.disk_bus) == ("ide", "virtio")
    assert exp.a.machine == exp.b.machine == "pc-i440fx-2.11"  # the guest's own machine type, QEMU's compat with it
    assert exp.a.disk_format == "qcow2" and exp.a.disk_cache == exp.b.disk_cache
    assert exp.layout.format == "qcow2" and exp.layout.cache == "writethrough"  # the block tier's replica of hda
    assert exp.change == "disk bus ide → virtio" and p.result.tier == "guest"
    assert exp.workload == "fio randwrite 4k QD16 in the probe guest on its raw disk"


def test_sto009_and_sto011_from_the_examples(tmp_path: Path) -> None:
    planned = _planned(EXAMPLES / "app02-clone.xml", "KVM-STO-009", _ctx(tmp_path))
    assert [(_experiment(p).a.disk_iothread, _experiment(p).b.disk_iothread) for p in planned] == [(False, True)] * 2
    (p,) = _planned(EXAMPLES / "hpc01-pinned.xml", "KVM-STO-011", _ctx(tmp_path))
    exp = _experiment(p)  # a "machine" finding: measured on the first virtio disk
    assert exp.a.machine == "pc-q35-5.1" and exp.a.disk_queues is None and exp.b.disk_queues == 8
    assert exp.job.numjobs > 1 and "jobs" in exp.workload


DOMAIN = """<domain type='kvm'><name>{name}</name><memory unit='MiB'>1024</memory><vcpu>{vcpus}</vcpu>
  <os><type arch='x86_64' machine='pc-q35-8.2'>hvm</type></os>
  <devices>{devices}</devices></domain>"""


def _domain(tmp_path: Path, name: str, devices: str, vcpus: int = 4) -> Path:
    path = tmp_path / f"{name}.xml"
    path.write_text(DOMAIN.format(name=name, vcpus=vcpus, devices=devices))
    return path


def test_scsi_controller_iothread_and_model_from_hand_written_xml(tmp_path: Path) -> None:
    scsi = ("<controller type='scsi' index='0' model='{model}'/>"
            "<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='/nowhere/d.img'/>"
            "<target dev='sda' bus='scsi'/><address type='drive' controller='0' bus='0' target='0' unit='0'/></disk>")
    xml = _domain(tmp_path, "vscsi", scsi.format(model="virtio-scsi"))
    (p,) = _planned(xml, "KVM-STO-015", _ctx(tmp_path))  # a controller finding: its first disk is measured
    exp = _experiment(p)
    assert (exp.a.scsi_model, exp.a.disk_iothread, exp.b.disk_iothread) == ("virtio-scsi", False, True)
    assert exp.job == IOTHREAD_JOB and exp.change == "disk iothread off → on"
    assert devices(qemu_args(exp.b, "/s"))[0] == f"virtio-scsi-pci,id=kvmtune-scsi,iothread={IOTHREAD_ID}"
    xml = _domain(tmp_path, "lsi", scsi.format(model="lsilogic"))
    (p,) = _planned(xml, "KVM-STO-012", _ctx(tmp_path))
    if p.experiment is None:  # this kernel has no sym53c8xx: one line naming the driver and how to get one
        assert "sym53c8xx" in (p.result.reason or "") and "--guest-kernel" in (p.result.reason or "")
    else:
        assert (p.experiment.a.scsi_model, p.experiment.b.scsi_model) == ("lsilogic", "virtio-scsi")  # type: ignore[attr-defined]


def test_a_missing_driver_names_it_and_the_way_out(tmp_path: Path) -> None:
    """A probe kernel without AHCI (a cloud kernel): a SATA disk's side cannot boot, said in one line."""
    kernel = tmp_path / "vmlinuz-6.1.0-test"
    kernel.write_bytes(b"\0" * 1024)
    mods = tmp_path / "modules"
    mods.mkdir()
    (mods / "modules.dep").write_text("kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio_pci.ko\n"
                                      "kernel/drivers/virtio/virtio_pci.ko:\nkernel/drivers/scsi/sd_mod.ko:\n")
    disk = ("<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='/nowhere/d.img'/>"
            "<target dev='sda' bus='sata'/></disk>")
    ctx = _ctx(tmp_path, guest_kernel=str(kernel), guest_modules=str(mods))
    (p,) = _planned(_domain(tmp_path, "sata", disk), "KVM-STO-001", ctx)
    assert p.experiment is None
    assert p.result.reason == ("side A (sata) needs the guest driver ahci, which the probe guest's kernel 6.1.0-test "
                               "(--guest-kernel) lacks: pass --guest-kernel PATH --guest-modules DIR with a kernel that "
                               "has it (a generic distribution kernel)")


def test_a_missing_driver_of_bench_s_kernel_names_the_script_and_the_option(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """No --guest-kernel and no cached generic kernel: /boot's (a cloud kernel, here without AHCI); the line names
    scripts/guest-kernel.sh as well as --guest-kernel, as the NIC experiments' does."""
    import kvmtune.verify.guest.disk as guestdisk

    def lacks(_host: HostRoot, names: tuple[str, ...], kernel: str | None, modules_dir: str | None) -> tuple[str, list[str]]:
        assert (kernel, modules_dir) == (None, None)  # bench's default kernel was asked about
        return "6.1.0-56-cloud-amd64", [n for n in names if n == "ahci"]

    monkeypatch.setattr(guestdisk, "kernel_lacks", lacks)
    disk = ("<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='/nowhere/d.img'/>"
            "<target dev='sda' bus='sata'/></disk>")
    (p,) = _planned(_domain(tmp_path, "sata", disk), "KVM-STO-001", _ctx(tmp_path))
    assert p.experiment is None
    assert p.result.reason == ("side A (sata) needs the guest driver ahci, which the probe guest's kernel "
                               "6.1.0-56-cloud-amd64 (/boot's newest kernel (what bench uses)) lacks: run "
                               f"{FETCH_SCRIPT} (a generic Debian kernel into {cache_dir()}, /boot untouched) or pass "
                               "--guest-kernel PATH --guest-modules DIR")


def test_queues_from_hand_written_xml(tmp_path: Path) -> None:
    disk = ("<disk type='file' device='disk'><driver name='qemu' type='raw' queues='1' queue_size='128'/>"
            "<source file='/nowhere/d.img'/><target dev='vda' bus='virtio'/></disk>")
    (p,) = _planned(_domain(tmp_path, "q", disk), "KVM-STO-022", _ctx(tmp_path))
    exp = _experiment(p)
    assert (exp.a.disk_queues, exp.a.disk_queue_size, exp.b.disk_queues, exp.b.disk_queue_size) == (1, 128, 4, 256)
    assert exp.a.vcpus == exp.b.vcpus


def test_without_allow_tcg_the_finding_needs_kvm_and_names_the_command(tmp_path: Path) -> None:
    (p,) = _planned(EXAMPLES / "web01-legacy.xml", "KVM-STO-001", _ctx(tmp_path, allow_tcg=False))
    assert p.experiment is None
    reason = p.result.reason or ""
    assert reason.startswith("needs KVM: the guest tier boots two probe guests, and KVM does not boot guests here "
                             "(/dev/kvm is absent)")
    assert reason.endswith("to measure it under emulation: kvmtune verify --examples --only KVM-STO-001 --allow-tcg")


# --------------------------------------------------------------------------- emulation in results


def test_a_tcg_result_says_emulation_and_is_never_counted_as_helps(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    (p,) = _planned(EXAMPLES / "web01-legacy.xml", "KVM-STO-001", ctx)
    metric = Metric("iops", "IOPS", True)

    class Ran:
        tier, change, workload = "guest", "disk bus ide → virtio", "fio"

        def run(self, ctx: VerifyContext) -> Outcome:
            j = Judgement(metric, 400.0, 2400.0, 6.0, (5.0, 7.2), NOT_COMPARABLE, 3)
            return Outcome(j, "nothing changed", [], {"accel": "tcg", "verdict_under_emulation": HELPS})

    p.experiment = Ran()
    execute_one(p, ctx)
    text = render_text([p.result], ctx, 1.0)
    line = next(ln for ln in text.splitlines() if ln.startswith("KVM-STO-001"))
    assert EMULATION in line and "NOT COMPARABLE" in line and "ratio 6.00 [5.00, 7.20]" in line
    assert "under TCG (emulation: not evidence for a KVM host" in text
    assert text.rstrip().endswith("0 help, 0 no measurable effect, 0 hurt, 0 inconclusive, 1 not comparable (emulation)")
    doc = p.result.to_json()
    assert doc["accel"] == "tcg" and doc["emulation"] == EMULATION and doc["verdict"] == NOT_COMPARABLE
    assert doc["measurement"]["interval_95"] == [5.0, 7.2]
    json.dumps(doc)
    assert isinstance(p.result, VerifyResult)


# --------------------------------------------------------------------------- what the guest prints


class _Pair:
    """exec answers from a script (what a hostile or slow guest could print)."""

    def __init__(self, answers: list[ExecResult]) -> None:
        self.answers = answers
        self.calls: list[list[str]] = []

    def exec(self, side: str, argv: list[str], timeout: float) -> ExecResult:
        self.calls.append(argv)
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def _out(text: str, rc: int | None = 0) -> ExecResult:
    return ExecResult(rc, text, "", 0.1)


def test_the_guests_disk_is_named_strictly() -> None:
    assert guest_disk(_Pair([_out("loop0\nram0\nsr0\nvda\n")]), "B") == "vda"  # type: ignore[arg-type]
    assert guest_disk(_Pair([_out(""), _out("sda\n")]), "A") == "sda"  # type: ignore[arg-type]
    with pytest.raises(Exception, match="2 disks"):
        guest_disk(_Pair([_out("sda\nsdb\n")]), "A")  # type: ignore[arg-type]
    with pytest.raises(Exception, match="shows no disk"):  # escape sequences and paths are no disk names
        guest_disk(_Pair([_out("\x1b[2Jvda\n../../etc\nvda;reboot\n")]), "A", attempts=2)  # type: ignore[arg-type]


def test_fio_runs_the_plans_job_and_its_json_is_parsed_strictly() -> None:
    job = FioJob("queues", "randread", "4k", 32, numjobs=4)
    fio = json.dumps({"jobs": [{"jobname": "queues", "error": 0, "read": {"iops": 1234.5, "total_ios": 99,
                                                                             "io_bytes": 4096}}]})
    pair = _Pair([_out("vda\n"), _out(fio)])
    probe = FioProbe(pair, job, 0.5)  # type: ignore[arg-type]
    assert probe.sample("A") == 1234.5
    argv = pair.calls[-1]
    assert argv[0] == "/usr/bin/fio" and "--filename=/dev/vda" in argv and "--numjobs=4" in argv
    assert "--runtime=500ms" in argv and "--output-format=json" in argv and "--direct=1" in argv
    for bad, match in ((_out("\x1b]0;pwned\x07 not json"), "no JSON"), (_out(fio, rc=1), "exited 1"),
                       (_out("", rc=None), "did not finish")):
        probe = FioProbe(_Pair([_out("vda\n"), bad]), job, 0.5)  # type: ignore[arg-type]
        with pytest.raises(Exception, match=match):
            probe.sample("A")


def test_plan_part_nic_waits_for_its_module(tmp_path: Path) -> None:
    from kvmtune.audit.finding import Target
    from kvmtune.audit.rule import rule_by_id
    from kvmtune.verify.experiments import Subject, Unmeasurable
    from kvmtune.verify.planner import plan_guest

    rule = rule_by_id("KVM-STO-001")
    assert rule is not None
    f = rule().finding(target=Target("localhost", "g", "net:0"), actual="a", expected="b", evidence="/x")
    try:
        import kvmtune.verify.guest.nic  # noqa: F401
    except ModuleNotFoundError:
        with pytest.raises(Unmeasurable, match="not built yet"):
            plan_guest(Subject(f), _ctx(tmp_path), GuestExperiment("nic", IOTHREAD_JOB))
    with pytest.raises(Unmeasurable, match="does not measure a cpu change yet"):
        plan_guest(Subject(f), _ctx(tmp_path), GuestExperiment("cpu", IOTHREAD_JOB))


def test_the_stored_cell_and_the_report_line_keep_the_accelerator(tmp_path: Path) -> None:
    from kvmtune.bench.report import verified_fix_lines
    from kvmtune.verify.engine import to_cell

    ctx = _ctx(tmp_path)
    (p,) = _planned(EXAMPLES / "web01-legacy.xml", "KVM-STO-001", ctx)
    j = Judgement(Metric("iops", "IOPS", True), 400.0, 2400.0, 6.0, (5.0, 7.2), NOT_COMPARABLE, 3)
    p.result.judgement, p.result.verdict, p.result.accel, p.result.action = j, NOT_COMPARABLE, "tcg", "nothing changed"
    cell = to_cell(p.result)
    assert cell.config["accel"] == "tcg" and cell.config["tier"] == "guest"
    stored = CellRow(1, 7, cell.key, cell.config, cell.workload, 0, cell.status, cell.error, None, 0.0, cell.metrics)
    line, seed = verified_fix_lines([stored])  # the fix, then the seed claim it answers (tests/verify/test_guest_tier_seeds.py)
    assert line.endswith("; not comparable; nothing changed (guest tier, TCG emulation)"), line
    assert seed.startswith("seed:000: not comparable") and "[verify run 7, guest tier, accelerator tcg]" in seed, seed


def test_what_guest_exec_returns_is_bounded_and_decoded_strictly() -> None:
    import base64

    from kvmtune.lab.probe.agent import MAX_OUTPUT, _data

    assert _data({"out-data": base64.b64encode(b"ok\xff\n").decode()}, "out-data") == "ok\ufffd\n"
    assert _data({"out-data": "not base64 at all!"}, "out-data") == ""
    assert _data({"out-data": 12}, "out-data") == "" and _data({}, "err-data") == ""
    huge = base64.b64encode(b"x" * (3 * MAX_OUTPUT)).decode()
    assert len(_data({"out-data": huge}, "out-data")) == MAX_OUTPUT
