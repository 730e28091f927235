"""Security review, round five, of the KubeVirt surfaces: each test here failed on the code before it (said per test)
and goes through the real code path (the CLI, or the real planner and ``apply_plan``; the kubectl stand-in on PATH).

- a resource quantity no float holds (``1e99999999999``, ``.inf``, a 400-digit integer) or a CPU count of 4,000
  digits in a manifest: the audit hung (``10 ** 99999999999``) or ended in a traceback (the count: a rule could not be
  evaluated);
- a long key above many values: every value's spec path repeats it (a 1.4 MiB file asked for 200 GB of paths);
- a directory above a manifest swapped for a link between the plan, the snapshot and the write: ``fix --apply`` wrote
  the edited manifest, with its old owner, into the directory the link named;
- ``fix --recursive`` edited files that a directory link inside the tree led to, outside it;
- a virt-launcher pod answering ``virsh dumpxml`` without end: all of it was held in memory before its size was
  checked."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubectl_standin import standin_env
from kvmtune.runner import Runner

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
FIX = HERE / "fixtures"
LAUNCHER = HERE / "launcher"

VM = """apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: {name}
  namespace: ns
spec:
  template:
    spec:
      domain:
{domain}        devices:
          disks:
          - name: root
            disk:
              bus: sata
"""


def kvmtune(*argv: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvmtune", *argv], capture_output=True, text=True, timeout=timeout,
                          env=env or {**os.environ, "PYTHONPATH": str(SRC)}, check=False)


# --------------------------------------------------------------------------- quantities and counts


@pytest.mark.parametrize(("domain", "field"), [
    ("        memory:\n          guest: 1e99999999999\n", "a power of ten Python computes for ever"),
    ("        memory:\n          guest: .inf\n", "int(inf)"),
    ("        memory:\n          guest: 1" + "0" * 400 + "\n", "float() of a 400-digit int"),
    ("        resources:\n          limits:\n            cpu: .inf\n", "math.ceil(inf)"),
    ("        memory:\n          guest: 1Gi\n          hugepages:\n            pageSize: 1e400\n", "10**400 * 1.0"),
    ("        cpu:\n          sockets: 1" + "0" * 4000 + "\n        resources:\n          requests:\n            cpu: 100m\n",
     "a vCPU count no float holds: KVM-KUB-005 could not be evaluated"),
])
def test_a_quantity_or_count_no_float_holds_is_none_and_the_audit_ends(tmp_path: Path, domain: str,
                                                                        field: str) -> None:
    """Before: ``1e99999999999`` hung the audit (this test's 60 s time-out), the others ended in a traceback."""
    manifest = tmp_path / "vm.yaml"
    manifest.write_text(VM.format(name="odd", domain=domain))
    start = time.monotonic()
    proc = kvmtune("audit", "--no-images", "--format", "json", str(manifest))
    assert "Traceback" not in proc.stderr and "could not be evaluated" not in proc.stderr, \
        f"{field}: {proc.stderr[-800:]}"
    doc = json.loads(proc.stdout)
    assert "kubevirt:ns/odd" in {f["target"]["domain"] for f in doc["findings"]}, field
    assert time.monotonic() - start < 30


def test_a_quantity_parses_as_kubernetes_writes_it_and_nothing_past_a_float() -> None:
    from kvmtune.kubevirt.guest import quantity

    assert quantity("2Gi") == 2 * 2**30 and quantity("500m") == 0.5 and quantity("1e3") == 1000.0
    assert quantity("1.5e20") == 1.5e20 and quantity("8Ei") == 8 * 2.0**60
    for odd in ("1e30", "1e31", "1e99999999999", float("inf"), float("nan"), 10**400, "9" * 39 + "Ei"):
        assert quantity(odd) is None, odd


# --------------------------------------------------------------------------- long paths


def test_a_long_key_above_many_values_is_refused_with_bounded_memory(tmp_path: Path) -> None:
    """Each value's spec path repeats its keys: a 1 MiB key above 199,990 values asked for 200 GB of path strings
    (before: MemoryError under this test's 2 GiB address-space limit, or the time-out)."""
    p = tmp_path / "long.yaml"
    p.write_text("? " + "k" * (1 << 20) + "\n: [" + ",".join(["0"] * 199_990) + "]\n")  # an explicit key: any length
    code = ("import resource, sys\nresource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
            "from kvmtune.errors import InputError\nfrom kvmtune.kubevirt.load import read_file\n"
            "try:\n    read_file(sys.argv[1])\nexcept InputError as exc:\n    print(exc)\n")
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(SRC)}, check=False)
    assert proc.returncode == 0, proc.stderr[-500:]
    assert f"{p}:2: " in proc.stdout and "characters in all" in proc.stdout
    assert time.monotonic() - start < 60


# --------------------------------------------------------------------------- the directory above a manifest


def _plan(manifest: Path) -> Any:
    from kvmtune.audit.engine import select_rules
    from kvmtune.fix.kubevirt import plan_manifests
    from kvmtune.fix.plan import Plan
    from kvmtune.fix.registry import FixOptions

    plan = Plan()
    plan_manifests([str(manifest)], False, select_rules([], []), FixOptions(allow_bus_change=True), plan)
    assert plan.changes, plan.skipped
    return plan


@pytest.mark.parametrize("when", ["before the snapshot", "after the snapshot"])
def test_a_directory_swapped_for_a_link_never_gets_the_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             when: str) -> None:
    """The manifest's directory (``repo/vms``, which its owner may change) is renamed away and a link to another
    directory put in its place: after the plan, while the operator reads it (with the same bytes there, or the
    snapshot would see the change), or between the snapshot and the write, while the journal is saved (the race an
    owner of ``repo`` can win by watching the file with inotify). Before: the edited manifest was written into the
    linked directory, with the old file's owner and mode."""
    from kvmtune.fix.apply import apply_plan
    from kvmtune.fix.journal import Journal

    vms = tmp_path / "repo" / "vms"
    vms.mkdir(parents=True)
    manifest = vms / "vm.yaml"
    shutil.copy(FIX / "examples" / "template-sata-e1000e.yaml", manifest)
    data = manifest.read_bytes()
    elsewhere = tmp_path / "elsewhere"  # a directory the owner of repo/ must never make root write in
    elsewhere.mkdir()
    plan = _plan(manifest)

    def swap() -> None:
        vms.rename(tmp_path / "repo" / "vms.old")
        vms.symlink_to(elsewhere)

    if when == "before the snapshot":
        (elsewhere / "vm.yaml").write_bytes(data)
        swap()
        with pytest.raises(Exception, match="not the directory the plan read it in"):
            apply_plan(plan, tmp_path / "j")
        assert (elsewhere / "vm.yaml").read_bytes() == data
        assert (tmp_path / "repo" / "vms.old" / "vm.yaml").read_bytes() == data
        return
    save = Journal.save
    swapped: list[bool] = []

    def save_and_swap(self: Journal) -> None:  # the attacker acts while the journal is written
        if not swapped:
            swapped.append(True)
            swap()
        save(self)

    monkeypatch.setattr(Journal, "save", save_and_swap)
    apply_plan(plan, tmp_path / "j")
    assert swapped
    assert list(elsewhere.iterdir()) == []  # nothing written through the link
    edited = (tmp_path / "repo" / "vms.old" / "vm.yaml").read_bytes()
    assert edited != data and b"virtio" in edited  # the directory the plan read got the edit


def test_fix_recursive_never_edits_a_file_a_directory_link_leads_to(tmp_path: Path) -> None:
    """A link inside the named tree to a directory outside it (another user's tree, root's own manifests): before,
    ``fix --recursive --apply`` edited the files there as if they were the tree's."""
    tree = tmp_path / "tree"
    tree.mkdir()
    shutil.copy(FIX / "examples" / "template-sata-e1000e.yaml", tree / "mine.yaml")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "theirs.yaml").write_text(VM.format(name="theirs", domain=""))
    theirs = (outside / "theirs.yaml").read_bytes()
    (tree / "link").symlink_to(outside)
    proc = kvmtune("fix", "--recursive", "--allow-bus-change", "--apply", "--yes", "--journal-dir",
                   str(tmp_path / "j"), str(tree))
    assert (outside / "theirs.yaml").read_bytes() == theirs, proc.stdout
    assert f"{tree / 'link' / 'theirs.yaml'}: reached through a symbolic link below {tree}" in proc.stdout
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert b"virtio" in (tree / "mine.yaml").read_bytes()  # the tree's own file is still fixed


# --------------------------------------------------------------------------- a virt-launcher pod that floods


def _cluster(tmp: Path) -> dict[str, str]:
    answers = tmp / "answers"
    shutil.copytree(LAUNCHER, answers)
    vms = [obj for manifest in sorted((FIX / "examples").glob("*.yaml"))
           for obj in yaml.safe_load_all(manifest.read_text())]
    (answers / "virtualmachines.kubevirt.io.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List",
                                                                          "items": vms}))
    shutil.copy(LAUNCHER / "vmis.json", answers / "virtualmachineinstances.kubevirt.io.json")
    return standin_env(tmp, answers, tmp / "kubectl.log")


def test_a_virt_launcher_that_answers_without_end_costs_bounded_memory(tmp_path: Path) -> None:
    """``virsh dumpxml`` in the tenant's pod answers 400 MiB (a tenant's fake virtqemud can answer anything). Before:
    kvmtune held all of it (bytes, then text) before checking its size, a peak above 800 MiB; an endless answer held
    whatever arrived within kubectl's 60 s. Now it stops at 16 MiB, kills kubectl, and says so in one line."""
    env = {**_cluster(tmp_path), "KVMTUNE_KUBECTL_FLOOD": str(400 << 20)}
    code = ("import sys\nfrom kvmtune.cli import main\n"
            "rc = main(['audit', '--no-images', '--format', 'json', '--kubevirt', 'kind-kubevirt'])\n"
            "hwm = next(line for line in open('/proc/self/status') if line.startswith('VmHWM:')).split()[1]\n"
            "print('HWM', hwm, rc, file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                          check=False)
    _, hwm, _rc = proc.stderr.strip().splitlines()[-1].split()
    doc = json.loads(proc.stdout)
    assert [e for e in doc["errors"] if "virsh dumpxml answered more than 16 MiB; refused" in e], doc["errors"]
    assert int(hwm) < 300 * 1024, f"peak RSS {int(hwm) // 1024} MiB"


def test_a_bounded_command_is_killed_at_its_limit_and_says_so() -> None:
    runner = Runner()
    start = time.monotonic()
    code = "import sys\nwhile True: sys.stdout.write('x' * 65536)\n"
    result = runner.run([sys.executable, "-c", code], timeout=30, max_output=1000)
    assert result.too_large and not result.ok and not result.timed_out
    assert len(result.stdout) == 1001 and time.monotonic() - start < 20
    assert "printed more than kvmtune reads of it" in result.describe_failure()
    assert runner.history[-1].stdout == "" and runner.history[-1].too_large  # answers do not pile up in the record
    small = runner.run([sys.executable, "-c", "import sys; print('ok'); print('bad', file=sys.stderr); sys.exit(3)"],
                       timeout=30, max_output=1000)
    assert (small.returncode, small.stdout, small.stderr, small.too_large) == (3, "ok\n", "bad\n", False)
    slow = runner.run([sys.executable, "-c", "import time; time.sleep(30)"], timeout=1, max_output=1000)
    assert slow.timed_out and slow.duration_s < 10


@pytest.mark.parametrize("force", [False, True])
def test_undo_never_writes_through_a_directory_swapped_since_the_fix(tmp_path: Path, force: bool) -> None:
    """Days after the fix, the owner of ``repo`` renames ``repo/vms`` away and puts a link to another directory in
    its place (holding a file under the manifest's name, with the bytes kvmtune wrote, so no content check stops
    it). Before: ``undo`` (as root) restored the old manifest, with its old owner and mode, into the linked
    directory. Now the journal records the directory the file was written in and undo restores there or nowhere;
    ``--force`` (for a file changed since) does not override it."""
    from kvmtune.fix.apply import apply_plan
    from kvmtune.fix.undo import undo_journal

    vms = tmp_path / "repo" / "vms"
    vms.mkdir(parents=True)
    manifest = vms / "vm.yaml"
    shutil.copy(FIX / "examples" / "template-sata-e1000e.yaml", manifest)
    data = manifest.read_bytes()
    journal = apply_plan(_plan(manifest), tmp_path / "j")
    written = manifest.read_bytes()
    assert written != data
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "vm.yaml").write_bytes(written)
    vms.rename(tmp_path / "repo" / "vms.old")
    vms.symlink_to(elsewhere)
    done, problems = undo_journal(journal, force=force)
    assert any("is not the directory kvmtune wrote it in" in p for p in problems), (done, problems)
    assert (elsewhere / "vm.yaml").read_bytes() == written  # nothing restored through the link
    assert (tmp_path / "repo" / "vms.old" / "vm.yaml").read_bytes() == written
    vms.unlink()
    (tmp_path / "repo" / "vms.old").rename(vms)  # the directory back where it was: undo restores it
    done, problems = undo_journal(journal)
    assert problems == [] and manifest.read_bytes() == data, (done, problems)


def test_undo_of_a_file_in_a_directory_the_fix_created_restores_in_that_directory(tmp_path: Path) -> None:
    """A file kvmtune created in a directory it created: the directory is recorded once made; undo removes the file
    and the directory, and refuses when a link stands there instead."""
    from kvmtune.fix.apply import apply_plan
    from kvmtune.fix.files import FileState
    from kvmtune.fix.plan import FileChange, Plan
    from kvmtune.fix.undo import undo_journal

    class NewFile(FileChange):
        def title(self) -> str:
            return f"create {self.shown}"

    target = tmp_path / "etc" / "new.d" / "kvmtune.conf"
    plan = Plan()
    plan.changes.append(NewFile(path=target, shown=str(target), before=FileState(None), after=b"x = 1\n"))
    journal = apply_plan(plan, tmp_path / "j")
    entry = journal.entries[0]
    assert target.read_bytes() == b"x = 1\n" and entry.dir_ino == target.parent.stat().st_ino  # type: ignore[union-attr]
    other = tmp_path / "other"
    other.mkdir()
    (other / "kvmtune.conf").write_bytes(b"x = 1\n")
    target.parent.rename(tmp_path / "etc" / "moved.d")
    target.parent.symlink_to(other)
    done, problems = undo_journal(journal)
    assert any("is not the directory kvmtune wrote it in" in p for p in problems) and (other / "kvmtune.conf").exists()
    target.parent.unlink()
    (tmp_path / "etc" / "moved.d").rename(target.parent)
    done, problems = undo_journal(journal)
    assert problems == [] and not target.parent.exists(), (done, problems)
