"""Issue 45 (audit accuracy, round three): launchers other than libvirt, templates, Proxmox VE.

Each test runs the real ``kvmtune audit`` (the CLI's ``main``) over real files and reads its JSON report.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

import pytest

from kvmtune.cli import main
from kvmtune.host.root import HostRoot
from kvmtune.model.guest import Guest
from kvmtune.qemu.cmdline import guest_from_text


def audit(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any], str]:
    code = main(["audit", *args, "--format", "json"])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else {}, err


def findings(report: dict[str, Any], rule: str | None = None) -> list[dict[str, Any]]:
    return [f for f in report.get("findings", []) if rule is None or f["rule"] == rule]


def comparable(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """What the findings say, without where the guest came from."""
    return sorted((f["rule"], str(f["target"].get("device")), f["summary"]) for f in findings(report))


# --- item 2: argument lists without the binary ------------------------------------------------------

PACKER_ARGS = ("-m 2048M -smp 2 -display none -machine type=pc,accel=kvm -netdev user,id=user.0,hostfwd=tcp::2222-:22 "
               "-device virtio-net,netdev=user.0 -drive file=output/packer-ubuntu,if=virtio,cache=writeback,"
               "discard=ignore,format=qcow2 -name packer-ubuntu -vnc 127.0.0.1:59\n")
MULTIPASS_ARGS = ("-display none -bios OVMF.fd --enable-kvm -cpu host -nic tap,ifname=tap-1,script=no,downscript=no,"
                  "model=virtio-net-pci,mac=52:54:00:1b:2c:3d -m 1024M -smp 1 -device virtio-scsi-pci,id=scsi0 "
                  "-drive file=/var/snap/multipass/vault/instances/primary/ubuntu.img,if=none,format=qcow2,"
                  "discard=unmap,id=hda -device scsi-hd,drive=hda,bus=scsi0.0 -cdrom cloud-init-config.iso\n")


@pytest.mark.parametrize("args", [PACKER_ARGS, MULTIPASS_ARGS], ids=["starts-with-m", "starts-with-display"])
def test_an_argument_list_without_the_binary_is_audited_as_qemu_system_x86_64s(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], args: str) -> None:
    bare, whole = tmp_path / "bare" / "vm.args", tmp_path / "whole" / "vm.args"
    bare.parent.mkdir()
    whole.parent.mkdir()
    bare.write_text(args)
    whole.write_text("qemu-system-x86_64 " + args)
    code_bare, bare_report, _ = audit(capsys, "--qemu-cmdline", str(bare))
    code_whole, whole_report, _ = audit(capsys, "--qemu-cmdline", str(whole))
    assert (code_bare, code_whole) == (0, 0)
    assert comparable(bare_report) == comparable(whole_report) and findings(bare_report)
    said = [line for line in bare_report["looked_at"] if "without the binary" in line]
    assert said == [f"{bare}: an argument list without the binary, read as qemu-system-x86_64's "
                    "(--qemu-binary NAME to choose another)"]
    assert not any("without the binary" in line for line in whole_report["looked_at"])


def test_qemu_binary_chooses_another_binary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "arm.args"
    f.write_text("-machine virt -m 1G -smp 2\n")
    code, report, _ = audit(capsys, "--qemu-cmdline", str(f), "--qemu-binary", "qemu-system-aarch64")
    assert code == 0
    assert any("read as qemu-system-aarch64's" in line for line in report["looked_at"])
    with pytest.raises(SystemExit):
        main(["audit", "--qemu-cmdline", str(f), "--qemu-binary", "/bin/sh"])
    assert "not a QEMU system emulator" in capsys.readouterr().err


@pytest.mark.parametrize("text", ["-m 2048\n", "-display none\n", "-enable-kvm\n", "-device virtio-net-pci,netdev=n0\n"])
def test_a_single_option_stays_a_refused_fragment(tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str) -> None:
    f = tmp_path / "frag.args"
    f.write_text(text)
    code, report, _ = audit(capsys, "--qemu-cmdline", str(f))
    first = text.split()[0]
    assert code == 2
    assert report["errors"] == [f"{f}: a single option ({first!r}), a fragment of a QEMU command line, "
                                "not an argument list to audit"]
    assert findings(report) == []


def test_a_command_that_is_not_qemu_is_still_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "ls.args"
    f.write_text("ls -l -m 2048\n")
    code, report, _ = audit(capsys, "--qemu-cmdline", str(f))
    assert code == 2 and report["errors"] == [f"{f}: not a QEMU system emulator command line (starts with 'ls')"]


# --- item 1: -readconfig (LXD, Incus) ---------------------------------------------------------------

LXD = Path(__file__).resolve().parents[1] / "fixtures" / "launchers" / "lxd"
LXD_CONF = "/var/snap/lxd/common/lxd/logs/v1/qemu.conf"
ABSENCE_RULES = {"KVM-CPU-003", "KVM-MEM-002", "KVM-SEC-001"}


def rules_of(report: dict[str, Any]) -> set[str]:
    return {f["rule"] for f in findings(report)}


def lxd_guest(root: Path | str, text: str | None = None) -> Guest:
    return guest_from_text(text or (LXD / "v1.args").read_text(), "v1.args", host=HostRoot(str(root)))


def test_the_lxd_argv_with_its_config_file_reads_what_the_file_sets(capsys: pytest.CaptureFixture[str]) -> None:
    code, report, _ = audit(capsys, "--qemu-cmdline", str(LXD / "v1.args"), "--root", str(LXD / "root"))
    assert code == 0 and not rules_of(report) & ABSENCE_RULES
    assert any(f"-readconfig {LXD_CONF} (beneath {LXD / 'root'}): read, 20 section(s)" in line
               for line in report["looked_at"])
    g = lxd_guest(LXD / "root")
    assert (g.machine, g.virt_type, g.memory_kib, g.hugepages, g.vcpus) == ("q35", "kvm", 4096 * 1024, True, 2)
    assert (g.memballoon, [r.backend_source for r in g.rngs], g.name) == ("virtio", ["/dev/urandom"], "lxd:v1")
    (root_disk,) = [d for d in g.disks if d.device == "disk"]
    assert (root_disk.bus, root_disk.cache, root_disk.io, root_disk.scsi_controller_model) == (
        "scsi", "none", "native", "virtio-scsi-pci")
    assert root_disk.where("cache") == 'qemu.conf:112 [drive "lxd_root"] (used by qemu.conf:120 [device "dev-lxd_root"])'


def test_without_its_config_file_the_lxd_argv_says_so_and_judges_no_absence(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, report, _ = audit(capsys, "--qemu-cmdline", str(LXD / "v1.args"), "--root", str(tmp_path))
    assert code == 0 and not rules_of(report) & ABSENCE_RULES
    said = [line for line in report["looked_at"] if "not read" in line]
    assert said == [f"{LXD / 'v1.args'}: -readconfig {LXD_CONF} (beneath {tmp_path}): not read (no such file); "
                    "findings on what the file may hold (no accelerator, no balloon, no RNG, ...) are withheld"]
    g = lxd_guest(tmp_path)
    assert (g.virt_type, g.memballoon, g.unread) == (None, None, (f"-readconfig {LXD_CONF}",))


def test_options_around_readconfig_merge_in_qemus_order(tmp_path: Path) -> None:
    conf = tmp_path / "vm.conf"
    conf.write_text('[machine]\ntype = "q35"\naccel = "kvm"\n\n[memory]\nsize = "2G"\n')
    g = guest_from_text(f"qemu-system-x86_64 -machine pc,accel=tcg -readconfig {conf} -m 8G", "x",
                        host=HostRoot("/"))
    assert (g.machine, g.virt_type, g.memory_kib) == ("q35", "kvm", 8 * 1024 * 1024)
    assert g.where("machine") == "vm.conf:1 [machine]"


def test_a_relative_readconfig_path_is_read_against_the_current_directory_and_said(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "vm.conf").write_text('[accel]\naccel = "kvm"\n')
    (tmp_path / "vm.args").write_text("qemu-system-x86_64 -m 1G -readconfig vm.conf\n")
    monkeypatch.chdir(tmp_path)
    _, report, _ = audit(capsys, "--qemu-cmdline", "vm.args")
    assert "KVM-CPU-003" not in rules_of(report)
    assert (f"vm.args: -readconfig vm.conf: a relative path, read against the current directory ({tmp_path}); "
            "QEMU's own working directory is unknown") in report["looked_at"]


def test_a_config_file_given_alone_is_audited_as_a_fragment(capsys: pytest.CaptureFixture[str]) -> None:
    conf = LXD / "root" / LXD_CONF.lstrip("/")
    code, report, _ = audit(capsys, "--qemu-cmdline", str(conf))
    assert code == 0 and report["errors"] == [] and not rules_of(report) & ABSENCE_RULES
    assert (f"{conf}: a QEMU configuration file (-readconfig format), not a command line: audited as a fragment "
            "of a guest; what only the command line can say is not judged") in report["looked_at"]
    assert "KVM-NET-008" in rules_of(report)  # judged on what the file holds


def test_an_unknown_section_is_a_note_and_a_key_given_twice_counts_last(tmp_path: Path) -> None:
    conf = tmp_path / "vm.conf"
    conf.write_text('[spice]\nport = "5900"\n[memory]\nsize = "1G"\nsize = "3G"\n'
                    '[drive "d,0"]\nfile = "/v/a,b.raw"\nif = "virtio"\ncache = "none"\n')
    g = guest_from_text(f"qemu-system-x86_64 -enable-kvm -readconfig {conf}", "x", host=HostRoot("/"))
    assert g.memory_kib == 3 * 1024 * 1024
    assert [(d.target, d.source, d.cache) for d in g.disks] == [("d,0", "/v/a,b.raw", "none")]
    assert f"{conf}:1: section [spice] not read (kvmtune does not know it)" in g.derived["notes"]


@pytest.mark.parametrize(("content", "problem"), [
    ('[machine]\ntype = q35\n', ':2: not read (not a QEMU configuration line (expected [section] or key = "value"))'),
    ('type = "q35"\n', ':1: not read (a key = "value" line before any [section])'),
    ('[machine]\ntype = "q35\0"\n', ": not read (a NUL byte in a QEMU configuration file; not read)"),
    ("[machine]\n" + "#" * (1024 * 1024 + 1), ": not read (larger than 1 MiB (a QEMU configuration file), refused)"),
])
def test_a_hostile_config_file_is_not_read_and_said_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, problem: str) -> None:
    conf = tmp_path / "vm.conf"
    conf.write_text(content)
    (tmp_path / "vm.args").write_text(f"qemu-system-x86_64 -m 1G -readconfig {conf}\n")
    code, report, _ = audit(capsys, "--qemu-cmdline", str(tmp_path / "vm.args"))
    assert code == 0 and not rules_of(report) & ABSENCE_RULES
    (said,) = [line for line in report["looked_at"] if "not read (" in line]
    assert said == (f"{tmp_path / 'vm.args'}: -readconfig {conf}{problem}; findings on what the file may hold "
                    "(no accelerator, no balloon, no RNG, ...) are withheld")


def test_a_fifo_or_a_link_out_of_the_tree_is_not_opened(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "run" / "incus" / "v1").mkdir(parents=True)
    os.mkfifo(root / "run" / "incus" / "v1" / "qemu.conf")
    outside = tmp_path / "secret.conf"
    outside.write_text('[accel]\naccel = "kvm"\n')
    (root / "run" / "incus" / "v2").mkdir()
    (root / "run" / "incus" / "v2" / "qemu.conf").symlink_to(outside)
    for inst, problem in (("v1", "not a regular file (a FIFO); not opened"), ("v2", "leads out of the host root")):
        g = guest_from_text(f"qemu-system-x86_64 -name {inst} -readconfig /run/incus/{inst}/qemu.conf", "x",
                            host=HostRoot(str(root)))
        assert g.virt_type is None and g.unread and g.name == f"incus:{inst}"
        assert any(problem in n for n in g.derived["notes"]), g.derived["notes"]


def test_incus_fixes_use_incus_keys_and_name_raw_qemu_elsewhere(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    inst = tmp_path / "var" / "log" / "incus" / "web"
    inst.mkdir(parents=True)
    (inst / "qemu.conf").write_text(
        '[machine]\ntype = "q35"\naccel = "kvm"\n[memory]\nsize = "2G"\n[smp-opts]\ncpus = "4"\n'
        '[drive "incus_root"]\nfile = "/v/root.img"\nformat = "raw"\nif = "none"\ncache = "writeback"\n'
        '[device "dev-incus_root"]\ndriver = "virtio-blk-pci"\ndrive = "incus_root"\n')
    (tmp_path / "web.args").write_text("qemu-system-x86_64 -name web -readconfig /var/log/incus/web/qemu.conf\n")
    _, report, _ = audit(capsys, "--qemu-cmdline", str(tmp_path / "web.args"), "--root", str(tmp_path))
    by_rule = {f["rule"]: f for f in findings(report)}
    assert by_rule["KVM-STO-005"]["target"]["domain"] == "incus:web"
    assert by_rule["KVM-STO-005"]["fix"]["description"].startswith(
        "incus config device set web root io.cache=none")
    assert by_rule["KVM-STO-009"]["fix"]["description"].startswith(
        "Incus has no key for this; only raw.qemu or raw.qemu.conf (incus config set web raw.qemu.conf=...)")


# --- item 4: memory devices, KVM-NET-008 on command lines -------------------------------------------

def test_nvdimm_is_device_memory_and_dimms_are_hotplugged_ram() -> None:
    g = guest_from_text(
        "qemu-system-x86_64 -enable-kvm -machine pc,nvdimm=on -m 2G,slots=4,maxmem=32G "
        "-object memory-backend-file,id=nv0,mem-path=/v/nvdimm.img,size=8G -device nvdimm,memdev=nv0,id=nvd0 "
        "-object memory-backend-ram,id=d0,size=1G -device pc-dimm,memdev=d0,id=dimm0 "
        "-object memory-backend-ram,id=vm0,size=4G -device virtio-mem-pci,memdev=vm0,requested-size=512M,id=vmem0",
        "x")
    assert g.memory_kib == (2048 + 1024 + 512) * 1024
    assert g.device_memory_kib == 8 * 1024 * 1024
    assert g.where("memory") == "-m #2 + hotplugged memory devices"


def test_nvdimm_in_a_domain_is_not_ram(tmp_path: Path) -> None:
    from kvmtune.domain.xml import load_guest_file

    f = tmp_path / "nv.xml"
    f.write_text("<domain type='kvm'><name>nv</name><memory unit='GiB'>12</memory><vcpu>2</vcpu><devices>"
                 "<memory model='nvdimm'><source><path>/v/nv.img</path></source><target><size unit='GiB'>8</size>"
                 "</target></memory></devices></domain>")
    g = load_guest_file(f)
    assert (g.memory_kib, g.device_memory_kib) == (4 * 1024 * 1024, 8 * 1024 * 1024)


@pytest.mark.parametrize("net", [
    "-nic tap,ifname=tap0,script=no,model=virtio-net-pci",
    "-netdev tap,id=n0,ifname=tap0,script=no -device virtio-net-pci,netdev=n0",
    "-netdev tap,id=n0,ifname=tap0,script=no,vhost=on -device virtio-net-pci,netdev=n0",
])
def test_net_008_judges_command_line_nics(tmp_path: Path, capsys: pytest.CaptureFixture[str], net: str) -> None:
    f = tmp_path / "vm.args"
    f.write_text(f"qemu-system-x86_64 -enable-kvm -smp 4 -m 4G {net}\n")
    _, report, _ = audit(capsys, "--qemu-cmdline", str(f))
    (finding,) = findings(report, "KVM-NET-008")
    assert finding["actual"] == "1 queue, 4 vCPUs"


# --- item 3: templates ------------------------------------------------------------------------------

MINIKUBE = Path(__file__).resolve().parents[1] / "fixtures" / "launchers" / "templates" / "minikube.xml"


def test_the_minikube_template_is_refused_with_the_placeholders_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, report, _ = audit(capsys, str(MINIKUBE))
    assert code == 2 and findings(report) == []
    assert report["errors"] == [f"{MINIKUBE}:3: a template: placeholder {{{{.Memory}}}} in <memory> stands for a "
                                "value the rules judge; not audited (--template audits it with those values not "
                                "stated)"]


def test_with_template_it_is_audited_with_those_values_not_stated(capsys: pytest.CaptureFixture[str]) -> None:
    code, report, _ = audit(capsys, str(MINIKUBE), "--template")
    assert code == 0 and report["errors"] == []
    assert any(line.startswith(f"{MINIKUBE}: a template, not a guest definition") for line in report["looked_at"])
    assert not any("{{" in f"{f['actual']} {f['evidence']}" for f in findings(report))
    assert not findings(report, "KVM-MEM-004")  # no memory stated: no judgement on its size
    g = guest_of(MINIKUBE)
    assert (g.memory_kib, g.vcpus, len(g.nics)) == (None, None, 2)


def guest_of(path: Path) -> Guest:
    from kvmtune.domain.xml import load_guest_file

    return load_guest_file(path)


@pytest.mark.parametrize(("text", "line", "placeholder", "where"), [
    ("qemu-system-x86_64 -accel kvm \\\n  -m @MEM@ -smp 2\n", 2, "@MEM@", "-m #1 size="),
    ("qemu-system-x86_64 -accel kvm -m 2G \\\n -drive 'file=/v/a.raw,if=virtio,cache=<%= cache %>'\n", 2,
     "<%= cache %>", "-drive #2 cache="),
    ("qemu-system-x86_64 -accel kvm -smp ${CPUS} -m 2G\n", 1, "${CPUS}", "-smp #1 cpus="),
])
def test_a_command_line_template_is_refused_with_its_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, line: int, placeholder: str, where: str) -> None:
    f = tmp_path / "t.args"
    f.write_text(text)
    code, report, _ = audit(capsys, "--qemu-cmdline", str(f))
    assert code == 2 and report["errors"] == [
        f"{f}:{line}: a template: placeholder {placeholder} in {where} stands for a value the rules judge; not "
        "audited (--template audits it with those values not stated)"]
    code, report, _ = audit(capsys, "--qemu-cmdline", str(f), "--template")
    assert code == 0 and report["errors"] == []


def test_a_placeholder_mac_keeps_its_nic(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    xml = tmp_path / "t.xml"
    xml.write_text("<domain type='kvm'><name>{{ name }}</name><memory unit='GiB'>2</memory><vcpu>2</vcpu><devices>"
                   "<interface type='bridge'><mac address='{{ mac }}'/><source bridge='@BRIDGE@'/>"
                   "<model type='e1000'/></interface></devices></domain>")
    args = tmp_path / "t.args"
    args.write_text("qemu-system-x86_64 -accel kvm -m 2G -smp 2 -netdev tap,id=n0,ifname=%(tap)s "
                    "-device e1000,netdev=n0,mac=${MAC}\n")
    code, report, _ = audit(capsys, str(xml), "--qemu-cmdline", str(args))  # names only: no --template needed
    assert code == 0
    emulated = findings(report, "KVM-NET-001")
    assert sorted(f["source"] for f in emulated) == sorted([str(xml), str(args)])
    assert {f["target"]["device"] for f in emulated} == {"net:0"}  # the NIC, its placeholder MAC not a label


# --- item 5: Proxmox VE, the operator's tree (etc/pve only) -------------------------------------------

OPERATOR = Path(__file__).resolve().parents[1] / "fixtures" / "proxmox" / "operator"


def operator_tree(tmp_path: Path) -> Path:
    import shutil

    tree = tmp_path / "tree"
    shutil.copytree(OPERATOR, tree)
    return tree


def fix(capsys: pytest.CaptureFixture[str], tree: Path, *flags: str) -> tuple[int, str]:
    code = main(["fix", "--root", str(tree), "--journal-dir", str(tree.parent / "journal"), *flags])
    out, err = capsys.readouterr()
    return code, out + err


def conf(tree: Path, vmid: int) -> dict[str, str]:
    text = (tree / "etc" / "pve" / "qemu-server" / f"{vmid}.conf").read_text()
    return dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)


def test_one_fix_apply_leaves_no_fixable_finding_and_planning_again_says_nothing_to_change(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tree = operator_tree(tmp_path)
    code, _ = fix(capsys, tree, "--allow-bus-change", "--allow-cpu-change", "--apply", "--yes")
    assert code == 0
    code, out = fix(capsys, tree, "--allow-bus-change", "--allow-cpu-change")
    assert code == 0 and out.strip().splitlines()[-1] == "Nothing to change."
    legacy, win = conf(tree, 100), conf(tree, 101)
    assert (legacy["scsihw"], legacy["cpu"], legacy["net0"]) == (
        "virtio-scsi-single", "x86-64-v3", "virtio=BC:24:11:A0:01:00,bridge=vmbr0,queues=2")
    assert "cache=none" in legacy["scsi0"] and "cache=none" in legacy["scsi1"] and "iothread=1" in legacy["scsi1"]
    assert (win["cpu"], "sata0" in win, win["virtio1"]) == ("x86-64-v3", False, "local-lvm:vm-101-disk-1,iothread=1,size=100G")
    _, report, _ = audit(capsys, "--root", str(tree))
    # nothing left: queues=4 on 101 gets rx_queue_size=1024 from qemu-server itself (machine 7.1 on), no KVM-NET-021
    assert findings(report) == []


def test_allow_bus_change_alone_leaves_cpu_unchanged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tree = operator_tree(tmp_path)
    code, out = fix(capsys, tree, "--allow-bus-change", "--apply", "--yes")
    assert code == 0
    assert "pve:101 (win) cpu: KVM-CPU-001 changes the guest's CPU model (--allow-cpu-change)" in out
    assert "cpu" not in conf(tree, 100) and conf(tree, 101)["cpu"] == "x86-64-v2-AES"


def test_no_plan_proposes_a_vms_current_cpu_value(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tree = operator_tree(tmp_path)
    _, out = fix(capsys, tree, "--allow-bus-change", "--allow-cpu-change")
    assert "--cpu x86-64-v3" in out and "--cpu x86-64-v2-AES" not in out
    assert "the current x86-64-v2-AES is PVE's default, an accepted migration baseline" in out
    (tree / "etc" / "pve" / "qemu-server" / "101.conf").write_text(
        (OPERATOR / "etc" / "pve" / "qemu-server" / "101.conf").read_text().replace("x86-64-v2-AES", "x86-64-v3"))
    _, out = fix(capsys, tree, "--allow-cpu-change")
    assert "qm set 101 --cpu" not in out and "pve:100 (legacy): on a running node the same change is: qm set 100" in out


def test_audit_of_a_tree_holding_only_etc_pve_gives_no_host_finding(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tree = operator_tree(tmp_path)
    _, report, _ = audit(capsys, "--root", str(tree))
    assert [f for f in findings(report) if f["target"]["domain"] is None] == []
    assert f"host {tree}: the tree holds no proc/, sys/ or dev/: host rules skipped" in report["looked_at"]


def test_audit_shows_the_vms_one_combined_qm_set(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tree = operator_tree(tmp_path)
    _, report, _ = audit(capsys, "--root", str(tree))
    lines = {f["fix"]["description"].split(" (this VM's")[0]
             for f in findings(report) if f["target"]["domain"] == "pve:100 (legacy)"}
    (line,) = lines
    assert line.startswith("qm set 100 ")
    for part in ("--scsihw virtio-scsi-single", "cache=none,iothread=1,size=32G", "cache=none,iothread=1,size=64G",
                 "--net0 virtio=BC:24:11:A0:01:00,bridge=vmbr0,queues=2", "--cpu x86-64-v3", "--rng0 source=/dev/urandom"):
        assert part in line


def test_pve_evidence_cites_config_lines_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tree = operator_tree(tmp_path)
    _, report, _ = audit(capsys, "--root", str(tree))
    evidence = {(f["target"]["domain"], f["rule"]): f["evidence"] for f in findings(report)}
    assert not [e for e in evidence.values() if "/domain" in e]
    q = tree / "etc" / "pve" / "qemu-server"
    assert evidence[("pve:101 (win)", "KVM-CPU-001")] == f"{q / '101.conf'}:3 cpu"
    assert evidence[("pve:100 (legacy)", "KVM-CPU-001")] == f"{q / '100.conf'} (cpu not set)"
    assert evidence[("pve:100 (legacy)", "KVM-SEC-001")] == f"{q / '100.conf'} (rng0 not set)"


def test_a_fix_pve_has_no_form_for_says_so_and_gives_args_only_as_a_last_resort(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tree = operator_tree(tmp_path)
    win = tree / "etc" / "pve" / "qemu-server" / "101.conf"
    win.write_text(win.read_text() + "machine: pc-i440fx-7.0\n")  # pinned below 7.1: qemu-server sets no rx ring size
    fix(capsys, tree, "--allow-bus-change", "--allow-cpu-change", "--apply", "--yes")
    _, report, _ = audit(capsys, "--root", str(tree))
    (ring,) = [f for f in findings(report, "KVM-NET-021") if f["target"]["domain"] == "pve:101 (win)"]
    assert ring["fix"]["kind"] == "manual"
    assert ring["fix"]["description"].startswith(
        "No qm set or web UI form: Proxmox VE has no option for this. Last resort, unsupported by PVE (it passes "
        "args: to QEMU unchecked and may override it): qm set 101 --args '-global virtio-net-pci.rx_queue_size=1024'")


# --- item 5: config and command line agree per device (the pinned-machine class) ----------------------

PVE_CLASSES = Path(__file__).resolve().parents[1] / "fixtures" / "proxmox" / "classes"
PVE_STORAGE = Path(__file__).resolve().parents[1] / "fixtures" / "proxmox" / "cluster" / "etc" / "pve" / "storage.cfg"
RULES_HOST = Path(__file__).resolve().parents[1] / "fixtures" / "hosts" / "rules-default"


@pytest.mark.parametrize("vmid", ["9101"])
def test_a_pinned_machine_config_and_its_command_line_agree_per_device(vmid: str) -> None:
    from kvmtune.audit.context import AuditContext
    from kvmtune.audit.engine import run_rules
    from kvmtune.proxmox.load import read_files, storage_file

    read = read_files([str(PVE_CLASSES / f"{vmid}.conf")], storage_file(str(PVE_STORAGE)))
    assert read.errors == []
    config = read.guests[0]
    cmdline = guest_from_text((PVE_CLASSES / f"{vmid}.args").read_text(), f"{vmid}.args")
    ctx = AuditContext(host=HostRoot(str(RULES_HOST)))

    def judged(guest: Guest) -> set[tuple[str, str]]:
        guest.on_audited_host = True
        return {(f.rule, f.target.device or "") for f in run_rules(ctx, [guest], [], False)
                if (f.target.device or "").startswith(("disk:", "net:"))}  # the rules that read disks and NICs

    assert config.machine == cmdline.machine == "pc-i440fx-6.1+pve0"
    # qemu-server adds free-page-reporting=on only from machine 6.2 on
    assert config.balloon_free_page_reporting is cmdline.balloon_free_page_reporting is False
    assert judged(config) == judged(cmdline) == {("KVM-NET-021", "net:bc:24:11:00:91:01")}


@pytest.mark.parametrize(("flags", "proposed"), [("fpu sse4_2 aes avx avx2", "x86-64-v3"),
                                                 ("fpu sse4_2 aes", "host")])
def test_kvm_cpu_001_proposes_what_this_hosts_cpus_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: str, proposed: str) -> None:
    tree = operator_tree(tmp_path)
    (tree / "proc").mkdir()
    (tree / "proc" / "cpuinfo").write_text(f"processor\t: 0\nflags\t\t: {flags}\n\n")
    _, out = fix(capsys, tree, "--allow-cpu-change")
    assert f"qm set 101 --cpu {proposed}" in out and f"qm set 100 --cpu {proposed}" in out
    if proposed == "host":
        assert "this host's CPUs lack AVX2, so x86-64-v3 would not start: 'host' passes them through" in out


@pytest.mark.parametrize("name", ["web; curl x | sh", "web$(id)", "web\u2028x", "-web", "web web"])
def test_a_name_outside_the_instance_syntax_never_reaches_an_incus_command(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    """Another user's QEMU chooses its -name: an Incus-looking one (SMBIOS product=Incus) whose name is not an
    instance name gets no `incus config …` line built from it; the -readconfig path's instance is used instead."""
    inst = tmp_path / "var" / "log" / "incus" / "web"
    inst.mkdir(parents=True)
    (inst / "qemu.conf").write_text(
        '[machine]\ntype = "q35"\naccel = "kvm"\n[memory]\nsize = "2G"\n[smp-opts]\ncpus = "4"\n'
        '[drive "incus_r;oot"]\nfile = "/v/root.img"\nformat = "raw"\nif = "none"\ncache = "writeback"\n'
        '[device "dev-incus_r;oot"]\ndriver = "virtio-blk-pci"\ndrive = "incus_r;oot"\n')
    args = ["qemu-system-x86_64", "-name", name, "-smbios", "type=1,product=Incus",
            "-readconfig", "/var/log/incus/web/qemu.conf"]
    (tmp_path / "web.args").write_text(" ".join(shlex.quote(a) for a in args) + "\n")
    _, report, _ = audit(capsys, "--qemu-cmdline", str(tmp_path / "web.args"), "--root", str(tmp_path))
    texts = [f["fix"]["description"] for f in findings(report) if f.get("fix")]
    incus = [t for t in texts if "incus config" in t]
    assert incus, texts
    assert all(" web " in t and name not in t and "r;oot" not in t for t in incus), incus
