"""``kvmtune fix`` on a running Proxmox VE node: each VM's changes as one ``qm set`` through the runner, the
values ``qm config`` showed journaled, ``undo`` sets them back with ``qm set`` (issue 35 item 4, the ``qm`` path).

No real Proxmox VE was used: ``tests/fix/standins/qm.py`` stands in for ``qm`` on ``PATH`` (list, config with
its digest, set with ``--digest``/``--delete``/``--revert``, pending changes of a running VM), over a copy of
the fixture cluster's ``/etc/pve``, recording every call.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kvmtune.audit.engine import select_rules
from kvmtune.errors import KvmtuneError
from kvmtune.fix.apply import apply_plan
from kvmtune.fix.entries import QmEntry
from kvmtune.fix.journal import Journal, refusals
from kvmtune.fix.plan import Plan
from kvmtune.fix.pve import QmSet, plan_pve
from kvmtune.fix.registry import FixOptions
from kvmtune.host.root import HostRoot
from kvmtune.runner import Runner

HERE = Path(__file__).resolve().parent
TREE = HERE.parent / "fixtures" / "proxmox" / "cluster"
SRC = HERE.parents[1] / "src"
STANDIN = HERE / "standins" / "qm.py"
PVESH = HERE / "standins" / "pvesh.py"


class Node:
    """A fake PVE node: the stand-ins ``qm`` and ``pvesh`` on PATH over a copy of the fixture tree; VM 8006 runs."""

    def __init__(self, tmp: Path) -> None:
        self.tree = tmp / "tree"
        shutil.copytree(TREE, self.tree, symlinks=True)
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        qm = bin_dir / "qm"
        qm.write_text(f'#!/bin/sh\nexec {sys.executable} {STANDIN} "$@"\n')
        qm.chmod(0o755)
        pvesh = bin_dir / "pvesh"
        pvesh.write_text(f'#!/bin/sh\nexec {sys.executable} {PVESH} "$@"\n')
        pvesh.chmod(0o755)
        self.log = tmp / "qm.log"
        self.journals = tmp / "journal"
        self.journals.mkdir(mode=0o700)
        self.env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(SRC),
                    "KVMTUNE_QM_TREE": str(self.tree / "etc/pve"), "KVMTUNE_QM_RUNNING": "8006",
                    "KVMTUNE_QM_LOG": str(self.log), "KVMTUNE_JOURNAL_DIR": str(self.journals)}

    def kvmtune(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "kvmtune", *args], capture_output=True, text=True, timeout=120,
                              env=self.env, check=False)

    def qm(self, *args: str) -> str:
        return subprocess.run([sys.executable, str(STANDIN), *args], capture_output=True, text=True, env=self.env,
                              check=True).stdout

    def values(self, vmid: str) -> tuple[str, str]:
        """``qm config`` and ``qm config --current``: the values PVE holds."""
        return self.qm("config", vmid), self.qm("config", vmid, "--current")

    def calls(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Node:
    n = Node(tmp_path)
    for key in ("PATH", "KVMTUNE_QM_TREE", "KVMTUNE_QM_RUNNING", "KVMTUNE_QM_LOG", "KVMTUNE_JOURNAL_DIR"):
        monkeypatch.setenv(key, n.env[key])
    return n


def _sets(calls: list[list[str]]) -> dict[str, list[str]]:
    return {c[2]: c for c in calls if c[:2] == ["qm", "set"]}


def test_fix_on_a_pve_node_plans_one_qm_set_per_vm_and_changes_nothing(node: Node) -> None:
    before = {v: node.values(v) for v in ("101", "102", "8006")}
    seen = len(node.calls())
    plan = node.kvmtune("fix")
    assert plan.returncode == 0, plan.stderr
    assert ("$ qm set 101 --rng0 source=/dev/urandom --virtio0 "
            "cifs-store:101/vm-101-disk-2.qcow2,cache=none,iothread=1,size=40G") in plan.stdout
    assert "-virtio0: cifs-store:101/vm-101-disk-2.qcow2,cache=writethrough,size=40G" in plan.stdout  # the config diff
    assert "--delete balloon" in plan.stdout  # 102: balloon: 0 removed
    # 8006 runs and has pending changes: said, and its change starts from the pending scsi2 (cache=none), not over it
    assert "VM runs: PVE keeps what it cannot hotplug as pending" in plan.stdout
    assert "already pending before this change: memory, scsi2, vmgenid" in plan.stdout
    assert "$ qm set 8006 --rng0 source=/dev/urandom\n" in plan.stdout
    assert {tuple(c[:2]) for c in node.calls()[seen:]} == {("qm", "list"), ("pvesh", "get")}  # planning only reads
    assert {v: node.values(v) for v in before} == before


def test_apply_runs_qm_set_with_the_plans_digest_and_undo_puts_back_the_values(node: Node) -> None:
    before = {v: node.values(v) for v in ("101", "102", "8006")}
    applied = node.kvmtune("fix", "--apply", "--yes")
    assert applied.returncode == 0, applied.stderr
    sets = _sets(node.calls())
    assert sets["101"][3] == "--digest" and len(sets["101"][4]) == 40
    assert node.values("101")[1].count("virtio0: cifs-store:101/vm-101-disk-2.qcow2,cache=none,iothread=1,size=40G") == 1
    assert "balloon" not in node.values("102")[0]
    # the running VM: the change is pending (qm config shows it, --current does not)
    assert "rng0: source=/dev/urandom" in node.values("8006")[0]
    assert "rng0" not in node.values("8006")[1]
    assert "Proxmox VE VM 8006: rng0 pending until its next start (qm pending 8006)." in applied.stdout
    journal = json.loads(next(node.journals.glob("*.json")).read_text())
    entries = {e["vmid"]: e for e in journal["changes"]}
    assert entries["8006"]["kind"] == "qm" and entries["8006"]["pending"] == ["rng0"]
    assert entries["102"]["prior"]["balloon"] == "0" and entries["102"]["new"]["balloon"] is None

    log_before = len(node.calls())
    undo = next(line for line in applied.stdout.splitlines() if line.startswith("Undo with: "))
    undone = node.kvmtune(*undo.removeprefix("Undo with: kvmtune ").split(), "--yes")
    assert undone.returncode == 0, undone.stderr
    assert {v: node.values(v) for v in before} == before
    sets = _sets(node.calls()[log_before:])
    assert sets["8006"] == ["qm", "set", "8006", "--revert", "rng0"]  # only pending: dropped, not set over
    assert sets["102"][-2:] == ["--delete", "rng0"] and "--balloon" in sets["102"]


def test_a_config_changed_after_the_plan_is_refused_by_its_digest(node: Node) -> None:
    plan = Plan()
    runner = Runner()
    plan_pve("/", select_rules([], []), FixOptions(host=HostRoot("/")), plan, runner)
    assert [c.vmid for c in plan.changes if isinstance(c, QmSet)] == ["101", "102", "8006"]
    node.qm("set", "101", "--cores", "8")  # someone else, between plan and apply
    before = {v: node.values(v) for v in ("101", "102", "8006")}
    with pytest.raises(KvmtuneError, match="VM 101: its config changed since the plan was made"):
        apply_plan(plan, node.journals, runner=runner)
    assert {v: node.values(v) for v in before} == before


def test_undo_leaves_a_value_someone_else_changed_unless_forced(node: Node) -> None:
    applied = node.kvmtune("fix", "--apply", "--yes", "--only", "KVM-STO-002")
    assert applied.returncode == 0, applied.stderr
    node.qm("set", "101", "--virtio0", "cifs-store:101/vm-101-disk-2.qcow2,cache=unsafe,size=40G")
    undo = next(line for line in applied.stdout.splitlines() if line.startswith("Undo with: "))
    args = undo.removeprefix("Undo with: kvmtune ").split()
    refused = node.kvmtune(*args, "--yes")
    assert refused.returncode != 0
    assert "virtio0 changed after kvmtune set them; not restored (--force)" in refused.stdout + refused.stderr
    assert "cache=unsafe" in node.values("101")[0]
    forced = node.kvmtune(*args, "--yes", "--force")
    assert forced.returncode == 0, forced.stderr
    assert "virtio0: cifs-store:101/vm-101-disk-2.qcow2,cache=writethrough,size=40G" in node.values("101")[0]


def test_the_stand_in_detaches_a_disk_to_unused_as_pve_does(node: Node) -> None:
    node.qm("set", "101", "--delete", "sata0")
    config = node.values("101")[0]
    assert "sata0" not in config and "unused0: local-zfs:vm-101-disk-1\n" in config and "boot: order=ide0\n" in config


def test_a_bus_change_on_a_stopped_vm_is_one_qm_set_and_undo_puts_the_disk_back(node: Node) -> None:
    before = {v: node.values(v) for v in ("101", "102", "8006")}
    applied = node.kvmtune("fix", "--apply", "--yes", "--only", "KVM-STO-001", "--allow-bus-change")
    assert applied.returncode == 0, applied.stderr
    sets = _sets(node.calls())
    assert sets["101"][5:] == ["--virtio1", "local-zfs:vm-101-disk-1,cache=writeback,discard=on,size=64G",
                               "--boot", "order=virtio1;ide0", "--delete", "sata0"]
    win = node.values("101")[1]
    assert "sata0" not in win and "unused" not in win and "boot: order=virtio1;ide0\n" in win
    assert "virtio1: local-zfs:vm-101-disk-1,cache=writeback,discard=on,size=64G\n" in win
    db = node.values("102")[1]
    assert "ide0:" not in db and "unused" not in db and "virtio2: san-lvm:vm-102-disk-3,size=8G\n" in db
    journal = json.loads(next(node.journals.glob("*.json")).read_text())
    entry = next(e for e in journal["changes"] if e["vmid"] == "101")
    assert entry["prior"]["sata0"] == "local-zfs:vm-101-disk-1,cache=writeback,discard=on,size=64G"
    assert entry["prior"]["virtio1"] is None and entry["new"]["sata0"] is None
    assert refusals(_journal("/", **{k: entry[k] for k in ("vmid", "prior", "prior_current", "new")})) == []

    undo = next(line for line in applied.stdout.splitlines() if line.startswith("Undo with: "))
    undone = node.kvmtune(*undo.removeprefix("Undo with: kvmtune ").split(), "--yes")
    assert undone.returncode == 0, undone.stderr
    after = {v: node.values(v) for v in before}
    assert after == before  # the same values (PVE's own order), no unusedN left behind


def test_a_bus_change_on_a_running_vm_is_refused_with_its_reason(node: Node) -> None:
    node.env["KVMTUNE_QM_RUNNING"] = "8006,101"
    plan = node.kvmtune("fix", "--only", "KVM-STO-001", "--allow-bus-change")
    assert plan.returncode == 0, plan.stderr
    assert ("KVM-STO-001 (sata0 → virtio1) needs the VM stopped: on a running VM PVE would hot-plug the volume a "
            "second time (qm shutdown 101, then kvmtune fix again)") in plan.stdout
    assert "qm set 101" not in plan.stdout and "$ qm set 102 --virtio2 san-lvm:vm-102-disk-3,size=8G" in plan.stdout


def test_undo_of_a_bus_change_never_attaches_a_volume_the_vm_no_longer_has(node: Node) -> None:
    applied = node.kvmtune("fix", "--apply", "--yes", "--only", "KVM-STO-001", "--allow-bus-change")
    assert applied.returncode == 0, applied.stderr
    node.qm("set", "101", "--delete", "virtio1")  # someone detached it
    node.qm("set", "101", "--delete", "unused0")
    undo = next(line for line in applied.stdout.splitlines() if line.startswith("Undo with: "))
    forced = node.kvmtune(*undo.removeprefix("Undo with: kvmtune ").split(), "--yes", "--force")
    assert forced.returncode != 0
    assert "sata0's volume local-zfs:vm-101-disk-1 is no longer attached to the VM" in forced.stdout + forced.stderr
    assert "sata0" not in node.values("101")[0]


def test_a_journal_may_move_a_volume_between_disk_keys_but_not_swap_in_another() -> None:
    vol = "local-lvm:vm-101-disk-1"
    move = {"vmid": "101", "prior": {"sata0": f"{vol},size=8G", "virtio1": None, "boot": "order=sata0"},
            "prior_current": {"sata0": f"{vol},size=8G", "virtio1": None, "boot": "order=sata0"},
            "new": {"sata0": None, "virtio1": f"{vol},size=8G", "boot": "order=virtio1"}}
    assert refusals(_journal("/", **move)) == []
    other = {**move, "new": {"sata0": None, "virtio1": "local-lvm:vm-999-disk-0,size=8G", "boot": "order=virtio1"}}
    assert any("names another volume" in p for p in refusals(_journal("/", **other)))


def _journal(root: str, **entry: object) -> Journal:
    j = Journal(id="20260101T000000Z-abcdef", directory=Path("/nonexistent"), root=root)
    j.entries = [QmEntry(what="qm set", **entry)]  # type: ignore[arg-type]
    return j


DISK = "local:101/vm-101-disk-0.raw"


@pytest.mark.parametrize(("root", "entry", "problem"), [
    ("/", {"vmid": "101", "prior": {"args": "-device x"}, "new": {"args": None}}, "'args' is not a key kvmtune sets"),
    ("/", {"vmid": "101", "prior": {"hookscript": "local:snippets/x.sh"}, "new": {}}, "'hookscript' is not a key"),
    ("/", {"vmid": "101", "prior": {"scsi0": "/dev/sda,cache=none"}, "prior_current": {"scsi0": f"{DISK},cache=none"},
           "new": {"scsi0": f"{DISK},cache=none"}}, "scsi0 names another volume or bridge"),
    ("/", {"vmid": "101", "prior": {"net0": "virtio=AA:BB:CC:DD:EE:FF,bridge=vmbr9"},
           "prior_current": {"net0": "virtio=AA:BB:CC:DD:EE:FF,bridge=vmbr0"},
           "new": {"net0": "virtio=AA:BB:CC:DD:EE:FF,bridge=vmbr0,queues=2"}}, "net0 names another volume or bridge"),
    ("/", {"vmid": "1; reboot", "prior": {}, "new": {}}, "is not a VMID"),
    ("/srv/tree", {"vmid": "101", "prior": {"rng0": None}, "new": {"rng0": "source=/dev/urandom"}}, "may not run qm set"),
])
def test_a_journal_may_only_put_back_what_kvmtune_sets_with_qm(root: str, entry: dict[str, object], problem: str) -> None:
    assert any(problem in p for p in refusals(_journal(root, **entry)))


def test_a_journal_of_kvmtunes_own_qm_changes_is_accepted() -> None:
    entry = {"vmid": "101", "prior": {"scsi0": f"{DISK},cache=writeback", "rng0": None, "balloon": "0"},
             "prior_current": {"scsi0": f"{DISK},cache=writeback", "rng0": None, "balloon": "0"},
             "new": {"scsi0": f"{DISK},cache=none,iothread=1", "rng0": "source=/dev/urandom", "balloon": None}}
    assert refusals(_journal("/", **entry)) == []


# issue 43 item 2: a value is never a key. VM 300's ciuser holds a U+2028 and "scsi5: /dev/sda" after it (one
# line to PVE); VM 310's notes hold "scsi5: /dev/sda" on a line of their own (the description to PVE).
TENANTS = {
    "300": "boot: order=scsi0\nciuser: bob\u2028scsi5: /dev/sda,cache=writeback\ncores: 2\nmemory: 2048\nname: tenant\n"
           "scsi0: local-lvm:vm-300-disk-0,size=8G\nscsihw: virtio-scsi-single\n",
    "310": "#tenant notes\n#scsi5: /dev/sda,cache=writeback\nboot: order=scsi0\ncores: 2\nmemory: 2048\n"
           "name: notes\nscsi0: local-lvm:vm-310-disk-0,size=8G\nscsihw: virtio-scsi-single\n",
}


def _tenants(node: Node) -> None:
    for vmid, text in TENANTS.items():
        (node.tree / f"etc/pve/nodes/pve1/qemu-server/{vmid}.conf").write_text(text, encoding="utf-8")


def test_qm_config_prints_the_description_encoded_on_one_line_and_no_digest(node: Node) -> None:
    _tenants(node)
    assert node.qm("config", "310").split("\n") == [
        "boot: order=scsi0", "cores: 2", "description: tenant notes%0Ascsi5%3A /dev/sda,cache=writeback",
        "memory: 2048", "name: notes", "scsi0: local-lvm:vm-310-disk-0,size=8G", "scsihw: virtio-scsi-single", ""]
    answer = json.loads(subprocess.run([sys.executable, str(PVESH), "get", "/nodes/localhost/qemu/310/config",
                                        "--output-format", "json"], capture_output=True, text=True, env=node.env,
                                       check=True).stdout)
    assert answer["description"] == "tenant notes\nscsi5: /dev/sda,cache=writeback" and answer["cores"] == 2
    assert len(answer["digest"]) == 40 and "scsi5" not in answer


def test_live_fix_apply_attaches_no_disk_from_a_value_or_a_description(node: Node) -> None:
    _tenants(node)
    plan = node.kvmtune("fix")
    assert plan.returncode == 0, plan.stderr
    assert "--scsi5" not in plan.stdout and "/dev/sda" not in plan.stdout.replace("ciuser: bob\\u2028scsi5", "")
    assert "VM 300 config, line 2: ciuser holds a line-break character (\\u2028)" in plan.stdout
    applied = node.kvmtune("fix", "--apply", "--yes")
    assert applied.returncode == 0, applied.stderr
    sets = _sets(node.calls())
    assert sets["300"][3] == "--digest" and sets["310"][3] == "--digest"  # both VMs were fixed, with their digest
    assert "local-lvm:vm-310-disk-0,iothread=1,size=8G" in sets["310"]
    for argv in sets.values():
        assert "--scsi5" not in argv and not any("/dev/sda" in a for a in argv)
    for vmid in TENANTS:
        assert "scsi5" not in node.values(vmid)[0].replace("scsi5%3A", "").replace("\u2028scsi5", "")


@pytest.mark.parametrize(("answer", "problem"), [
    ('{"digest":"%s","scsi0":"local:101/a.raw","scsi0":"/dev/sda"}', "key 'scsi0' appears twice"),
    ('{"digest":"%s","cores":true}', "cores: a bool, not a string or a number"),
    ('{"digest":"%s","scsi5":null}', "scsi5: a NoneType, not a string or a number"),
    ('{"digest":"%s","scsi5":["/dev/sda"]}', "scsi5: a list, not a string or a number"),
    ('{"digest":"%s","scsi5":{"file":"/dev/sda"}}', "scsi5: a dict, not a string or a number"),
    ('[{"digest":"%s"}]', "not a JSON object but list"),
    ('{"digest":"%s","cpulimit":NaN}', "not JSON"),
    ('{"digest":"%s","ciuser":"bob\\nscsi5: /dev/sda"}', "ciuser: a line break or NUL in a value"),
    ('{"digest":"%s","Scsi5":"x"}', "'Scsi5' is not a config key"),
    ('{"digest":"%s","a b":"x"}', "'a b' is not a config key"),
    ('{"digest":"../../x","cores":2}', "digest '../../x' is not 40 hex digits"),
    ('{"cores":2}', "no digest"),
    ('{"digest":"%s","x":"' + "a" * (9 * 1024 * 1024) + '"}', "more than 8 MiB of output"),
    ("[" * 100_000 + "]" * 100_000, "not JSON"),
    ("{" + ",".join(f'"k{n}":1' for n in range(3000)) + ',"digest":"%s"}', "3001 keys, more than a VM config has"),
])
def test_a_hostile_pvesh_answer_is_one_line_naming_the_vm(answer: str, problem: str) -> None:
    from kvmtune.proxmox.pvesh import parse_config_json  # here: a925907 has no pvesh reader, and the other tests run
    from kvmtune.proxmox.qm import QmError

    text = answer.replace("%s", "0" * 40) if '"digest":"%s"' in answer else answer
    with pytest.raises(QmError) as err:
        parse_config_json(text, "101")
    assert str(err.value).startswith("pvesh get /nodes/localhost/qemu/101/config: ") and problem in str(err.value)
    assert "\n" not in str(err.value)


def test_fix_skips_a_vm_whose_pvesh_answer_has_a_key_twice(node: Node, tmp_path: Path) -> None:
    bad = tmp_path / "answer.json"
    bad.write_text('{"digest":"%s","scsi0":"local:101/a.raw,size=8G","scsi0":"/dev/sda,size=8G"}' % ("0" * 40))
    node.env["KVMTUNE_PVESH_ANSWER"] = str(bad)
    plan = node.kvmtune("fix", "--apply", "--yes")
    assert plan.returncode == 0, plan.stderr
    assert ("skipped: VM 101: pvesh get /nodes/localhost/qemu/101/config: key 'scsi0' appears twice\n"
            in plan.stdout)
    assert "qm set" not in plan.stdout and not _sets(node.calls())


def test_live_fix_changes_a_host_device_drive_only_when_named(node: Node) -> None:
    (node.tree / "etc/pve/nodes/pve1/qemu-server/320.conf").write_text(
        "cores: 2\nmemory: 2048\nname: passthrough\nrng0: source=/dev/urandom\nscsihw: virtio-scsi-single\n"
        "scsi0: local-lvm:vm-320-disk-0,iothread=1,size=8G\nscsi1: /dev/sdb,cache=writeback,iothread=1,size=100G\n")
    applied = node.kvmtune("fix", "--apply", "--yes", "--only", "KVM-STO-005")
    assert applied.returncode == 0, applied.stderr
    assert "320" not in _sets(node.calls())
    assert ("skipped: pve:320 (passthrough) disk:scsi1: KVM-STO-005: scsi1 is the host's /dev/sdb (a path or device, "
            "not a storage volume): changed only when named (--pve-volume /dev/sdb)") in applied.stdout
    named = node.kvmtune("fix", "--apply", "--yes", "--only", "KVM-STO-005", "--pve-volume", "/dev/sdb")
    assert named.returncode == 0, named.stderr
    assert _sets(node.calls())["320"][5:] == ["--scsi1", "/dev/sdb,cache=none,iothread=1,size=100G"]


@pytest.mark.parametrize("command", ["pvesh", "qm"])
def test_an_answer_that_never_ends_is_stopped_at_its_bound_not_held(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str) -> None:
    """A ``pvesh`` or ``qm`` that prints without end (a config someone filled through the API, a tool gone wrong):
    kvmtune, as root, held all of it until the 60 s time-out, then refused it. Now it stops reading at 8 MiB (the
    command is killed) and says so in one line naming the VM's path."""
    from kvmtune.proxmox import pvesh, qm
    from kvmtune.runner import Runner

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / command).write_text("#!/bin/sh\nexec yes '{\"k\": \"aaaaaaaaaaaaaaaaaaaaaaaa\"}'\n")
    (bin_dir / command).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    runner = Runner()
    with pytest.raises(qm.QmError) as err:
        if command == "pvesh":
            pvesh.config(runner, "101")
        else:
            qm.list_vms(runner)
    wanted = "pvesh get /nodes/localhost/qemu/101/config: more than 8 MiB of output" if command == "pvesh" else \
        "'qm list' printed more than kvmtune reads of it; stopped"
    assert str(err.value) == wanted
    (ran,) = runner.history
    assert ran.too_large and not ran.timed_out and ran.stdout == ""  # the bound ended it, nothing of it kept
