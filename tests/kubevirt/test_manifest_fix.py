"""``kvmtune fix FILE|DIR`` on KubeVirt manifests: a surgical edit (every byte outside the edited value kept), through
the journal, byte-exact ``undo``; the edited manifests re-audit clean for the rules fixed; what cannot be edited safely
is refused in one line naming the file and line. Manifests are hostile input: each shape below is one a foreign
repository may hold."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from kvmtune.cli import main
from kvmtune.errors import InputError
from kvmtune.kubevirt.edit import EditRefused, edit_bytes

FIX = Path(__file__).resolve().parent / "fixtures"
DOMAIN = "spec.template.spec.domain"


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def audit_rules(*args: str) -> dict[str, set[str]]:
    _code, out, _ = run("audit", "--no-images", "--format", "json", *args)
    out_doc: dict[str, Any] = json.loads(out)
    found: dict[str, set[str]] = {}
    for f in out_doc["findings"]:
        found.setdefault(f["target"]["domain"], set()).add(f["rule"])
    return found


FIXED_RULES = {"KVM-STO-001", "KVM-NET-001", "KVM-STO-009", "KVM-KUB-001", "KVM-NET-008", "KVM-SEC-001"}


@pytest.mark.parametrize("tree", ["examples", "tree"])
def test_fix_apply_then_undo_is_byte_exact_and_the_fixed_manifests_re_audit_clean(tmp_path: Path, tree: str) -> None:
    work = tmp_path / tree
    shutil.copytree(FIX / tree, work)
    before = snapshot(work)
    found = audit_rules("--recursive", str(work))
    assert any(FIXED_RULES & rules for rules in found.values())
    journals = tmp_path / "journals"
    code, out, err = run("fix", "--recursive", "--allow-bus-change", "--apply", "--yes", "--journal-dir",
                         str(journals), str(work))
    assert code == 0, err + out
    assert "Applied" in out
    changed = snapshot(work)
    assert changed != before
    after = audit_rules("--recursive", str(work))
    for guest, rules in after.items():
        left = FIXED_RULES & rules
        assert not left, f"{guest} still has {left} after fix"
    # a second plan has nothing left to set
    code, out, _ = run("fix", "--recursive", "--allow-bus-change", str(work))
    assert "Nothing to change." in out
    journal = json.loads(next(journals.glob("*.json")).read_text())
    assert {c["kind"] for c in journal["changes"]} == {"file"}
    assert all(c["takes_effect"] == "restart" for c in journal["changes"])
    code, out, err = run("undo", "--journal-dir", str(journals), journal["id"])
    assert code == 0, err
    assert snapshot(work) == before


def test_the_plan_is_a_diff_that_says_when_each_change_takes_effect_and_changes_nothing(tmp_path: Path) -> None:
    shutil.copytree(FIX / "tree", tmp_path / "tree")
    before = snapshot(tmp_path)
    code, out, _ = run("fix", "--recursive", str(tmp_path / "tree"))
    assert code == 0
    assert "+  ioThreadsPolicy: auto" in out  # in the instancetype web1 takes its vCPUs from
    assert "VirtualMachineInstancetype web/cmedium is used by kubevirt:web/web1: new revision: at the next restart " \
           "of each VM that picks it up" in out
    assert "#  takes effect: restart" in out
    assert "changes what the guest sees (--allow-bus-change)" in out  # web2's sata disk, without the flag
    assert snapshot(tmp_path) == before
    code, out, _ = run("fix", "--recursive", "--format", "json", str(tmp_path / "tree"))
    doc = json.loads(out)
    assert doc["changes"] and all(c["takes_effect"] == "restart" for c in doc["changes"])


def test_a_tuned_vm_has_nothing_to_change_and_advice_is_said(tmp_path: Path) -> None:
    code, out, _ = run("fix", str(FIX / "tuned" / "tuned-vm.yaml"))
    assert code == 0 and "Nothing to change." in out
    assert "KVM-KUB-007 is advice only (no value kvmtune can set: an odd count" in out


def test_a_file_changed_between_plan_and_apply_is_not_written(tmp_path: Path) -> None:
    from kvmtune.audit.engine import select_rules
    from kvmtune.fix.apply import apply_plan
    from kvmtune.fix.kubevirt import plan_manifests
    from kvmtune.fix.plan import Plan
    from kvmtune.fix.registry import FixOptions

    manifest = tmp_path / "vm.yaml"
    shutil.copy(FIX / "examples" / "labs-testvm.yaml", manifest)
    plan = Plan()
    plan_manifests([str(manifest)], False, select_rules([], []), FixOptions(), plan)
    assert plan.changes
    manifest.write_bytes(manifest.read_bytes() + b"# edited by someone else\n")
    theirs = manifest.read_bytes()
    with pytest.raises(Exception, match="changed since the plan was made"):
        apply_plan(plan, tmp_path / "j")
    assert manifest.read_bytes() == theirs


def test_a_symlinked_manifest_is_read_but_never_written_through(tmp_path: Path) -> None:
    real = tmp_path / "real.yaml"
    shutil.copy(FIX / "examples" / "labs-testvm.yaml", real)
    (tmp_path / "d").mkdir()
    link = tmp_path / "d" / "vm.yaml"
    link.symlink_to(real)
    data = real.read_bytes()
    code, out, err = run("fix", "--apply", "--yes", "--journal-dir", str(tmp_path / "j"), str(link))
    assert code == 3 and "1 manifest(s) or value(s) refused" in err
    assert "is a symbolic link; kvmtune does not replace links; not edited" in out
    assert real.read_bytes() == data and link.is_symlink()


# --------------------------------------------------------------------------- the editor, shape by shape

VM = """\
# a comment kept
apiVersion: kubevirt.io/v1
kind: VirtualMachine   # trailing comment kept
metadata:
  name: 'quoted'
spec:
  template:
    spec:
      domain:
        devices:
          disks:
          - name: root
            disk:
              bus: "sata"   # why sata
"""


def edit(text: str | bytes, *edits: tuple[str, Any], where: str = "vm.yaml", number: int = 0) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return edit_bytes(where, data, [(number, path, value) for path, value in edits])


def test_only_the_edited_value_changes_comments_quoting_and_order_stay() -> None:
    out = edit(VM, (f"{DOMAIN}.devices.disks[0].disk.bus", "virtio"), (f"{DOMAIN}.ioThreadsPolicy", "auto"))
    assert out.decode() == VM.replace('bus: "sata"', "bus: virtio") + "        ioThreadsPolicy: auto\n"


def test_crlf_and_a_bom_are_kept() -> None:
    data = b"\xef\xbb\xbf" + VM.replace("\n", "\r\n").encode()
    out = edit(data, (f"{DOMAIN}.devices.blockMultiQueue", True), (f"{DOMAIN}.features.hyperv",
                                                                       {"relaxed": {}, "spinlocks": {"spinlocks": 8191}}))
    assert out.startswith(b"\xef\xbb\xbf") and out.startswith(data[:-2])
    assert b"\n" not in out.replace(b"\r\n", b"")
    assert b"          blockMultiQueue: true\r\n" in out
    assert b"        features:\r\n          hyperv:\r\n            relaxed: {}\r\n" in out


def test_old_mac_cr_line_endings_are_kept() -> None:
    data = VM.replace("\n", "\r").encode()
    out = edit(data, (f"{DOMAIN}.ioThreadsPolicy", "auto"))
    assert out == data + b"        ioThreadsPolicy: auto\r"


def test_json_and_flow_mappings_get_the_key_after_their_brace() -> None:
    doc = {"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "j"},
           "spec": {"template": {"spec": {"domain": {"devices": {"disks": [{"name": "r", "disk": {"bus": "sata"}}]}}}}}}
    text = json.dumps(doc, indent=4)
    out = edit(text, (f"{DOMAIN}.devices.disks[0].disk.bus", "virtio"), (f"{DOMAIN}.ioThreadsPolicy", "auto"),
               where="vm.json")
    assert json.loads(out)["spec"]["template"]["spec"]["domain"]["ioThreadsPolicy"] == "auto"
    added = ', "ioThreadsPolicy": "auto"'
    assert out.decode().count(added) == 1  # after the last entry of domain, every other byte as it was
    assert out.decode().replace(added, "") == text.replace('"sata"', '"virtio"')
    empty = edit('{"kind": "VirtualMachine", "spec": {}}', ("spec.running", False), where="vm.json")
    assert empty == b'{"kind": "VirtualMachine", "spec": {"running": false}}'


def test_a_multi_document_file_and_a_list_edit_only_their_object() -> None:
    two = VM + "---\n" + VM.replace("'quoted'", "second")
    out = edit(two, (f"{DOMAIN}.devices.disks[0].disk.bus", "virtio"), number=1).decode()
    first, second = out.split("---\n")
    assert first == VM and 'bus: virtio' in second
    listed = "kind: List\nitems:\n- kind: VirtualMachine\n  spec:\n    template:\n      spec:\n        domain: {}\n"
    out = edit(listed, (f"items[0].{DOMAIN}.devices.rng", {})).decode()
    assert out == listed.replace("domain: {}", "domain: {devices: {rng: {}}}")


@pytest.mark.parametrize(("text", "path", "said"), [
    ("a: &x\n  b: 1\nc: *x\n", "a.b", "inside an anchor that aliases share"),
    ("a: !!str sata\n", "a", "carries a tag or an anchor"),
    ("a: &y sata\n", "a", "carries a tag or an anchor"),
    ("a: |\n  text\n", "a", "is a multi-line value"),
    ("a:\n  b: |\n    text\n", "a.c", "end in a block scalar"),
    ("a: [1, 2]\n", "a[5]", "is not an item of a list"),
    ("a: 3\n", "a.b", "is not a mapping"),
    ("a:\n  b: 1\n", "a", "is a mapping, not a value kvmtune replaces"),
    ("x: &x 1\na:\n  b: 2\n  c: *x\n", "a.d", "end in an alias"),
])
def test_what_cannot_be_edited_safely_is_refused_naming_the_line(text: str, path: str, said: str) -> None:
    with pytest.raises(EditRefused) as exc:
        edit(text, (path, "virtio"))
    assert said in str(exc.value) and str(exc.value).startswith("vm.yaml:")


@pytest.mark.parametrize(("text", "said"), [
    ("a: 1\na: 2\n", "duplicate key"),
    ("a: !custom 1\n", "is not a plain YAML type"),
    ("a: 1\u2028b: 2\n", r"U\+2028"),
    ("a: b\x85c\n", r"U\+0085"),
])
def test_manifests_the_reader_refuses_are_not_edited(text: str, said: str) -> None:
    with pytest.raises(InputError, match=said):
        edit(text, ("a", "x"))


def test_hostile_names_are_printed_terminal_safe_and_the_file_still_fixed(tmp_path: Path) -> None:
    manifest = tmp_path / "evil.yaml"
    manifest.write_text(VM.replace("'quoted'", '"vm\\x1b[31m\\nline\\twith\\u202etricks"')
                        .replace("metadata:\n", "metadata:\n  namespace: ns\n"))
    code, out, _ = run("fix", "--allow-bus-change", str(manifest))
    assert code == 0
    assert "\x1b" not in out and "\u202e" not in out
    title = next(x for x in out.splitlines() if x.startswith("## 1."))
    assert "ns/vm\\x1b[31m\\x0aline\\x09with\\u202etricks" in title
    assert "+              bus: virtio" in out


def test_a_duplicate_key_file_in_a_directory_is_one_line_and_the_rest_is_fixed(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text(VM + "kind: VirtualMachine\n")
    shutil.copy(FIX / "examples" / "labs-testvm.yaml", tmp_path / "good.yaml")
    code, out, _ = run("fix", str(tmp_path))
    assert code == 3  # planned for good.yaml, refused for bad.yaml
    lines = [x for x in out.splitlines() if "bad.yaml" in x]
    assert len(lines) == 1 and "duplicate key 'kind'" in lines[0]
    assert "edit " + str(tmp_path / "good.yaml") in out


def test_a_huge_manifest_is_refused_in_one_line(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_bytes(VM.encode() + b"#" * (9 * 1024 * 1024) + b"\n")
    code, out, err = run("fix", str(big))
    assert code == 3
    assert str(big) in out + err and "larger than" in out + err
    assert big.stat().st_size > 9 * 1024 * 1024  # untouched


def test_a_manifest_in_a_world_writable_place_is_written_atomically_with_its_mode(tmp_path: Path) -> None:
    manifest = tmp_path / "vm.yaml"
    shutil.copy(FIX / "examples" / "labs-testvm.yaml", manifest)
    os.chmod(manifest, 0o640)
    code, _, err = run("fix", "--apply", "--yes", "--journal-dir", str(tmp_path / "j"), str(manifest))
    assert code == 0, err
    assert manifest.stat().st_mode & 0o777 == 0o640
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".vm.yaml.kvmtune")]


def test_a_value_inside_a_shared_anchor_is_refused_in_one_line_naming_file_and_line(tmp_path: Path) -> None:
    one = ("- apiVersion: kubevirt.io/v1\n  kind: VirtualMachine\n  metadata: {{name: {name}, namespace: n}}\n"
           "  spec:\n    template:\n      spec:\n        domain:\n          cpu: {{cores: 4}}\n"
           "          devices: {devices}\n")
    manifest = tmp_path / "anchored.yaml"
    manifest.write_text("kind: List\nitems:\n" + one.format(name="a", devices="&devs\n            disks: []")
                        + one.format(name="b", devices="*devs"))
    before = manifest.read_bytes()
    code, out, err = run("fix", "--only", "KVM-SEC-001", str(manifest))
    assert code == 3 and "refused" in err
    lines = [x for x in out.splitlines() if x.startswith("skipped:") and "anchor" in x]
    assert lines and f"{manifest}:11: " in lines[0] and "inside an anchor that aliases share" in lines[0]
    assert manifest.read_bytes() == before


# --------------------------------------------------------------------------- every rule with a settable form

RULES = Path(__file__).resolve().parents[1] / "rules"


def _settable() -> list[Any]:
    from kvmtune.audit.rule import all_rules

    return [r for r in all_rules() if getattr(r, "kubevirt", None) is not None and r.kubevirt.settable]


@pytest.mark.parametrize("rule", _settable(), ids=lambda r: r.id)
def test_a_settable_forms_doc_says_when_it_takes_effect_on_kubevirt(rule: Any) -> None:
    refs = rule.doc_path().read_text(encoding="utf-8").split("## References", 1)[1]
    lines = [x for x in refs.splitlines() if x.startswith("- When it takes effect:")]
    assert len(lines) == 1 and "RestartRequired" in lines[0] and "vm_rollout_strategies" in lines[0]


BAD_MANIFESTS = [p for r in _settable() for p in sorted((RULES / r.id / "bad").glob("*.yaml"))]


@pytest.mark.parametrize("bad", BAD_MANIFESTS, ids=lambda p: f"{p.parent.parent.name}/{p.name}")
def test_fix_removes_the_finding_from_each_rules_bad_manifest(tmp_path: Path, bad: Path) -> None:
    rule = bad.parent.parent.name
    work = tmp_path / bad.name
    shutil.copy(bad, work)
    assert any(rule in rules for rules in audit_rules(str(work)).values())
    code, out, err = run("fix", "--only", rule, "--allow-bus-change", "--apply", "--yes", "--journal-dir",
                         str(tmp_path / "j"), str(work))
    assert code == 0, out + err
    assert not any(rule in rules for rules in audit_rules(str(work)).values()), work.read_text()
    journal = json.loads(next((tmp_path / "j").glob("*.json")).read_text())
    assert run("undo", "--journal-dir", str(tmp_path / "j"), journal["id"])[0] == 0
    assert work.read_bytes() == bad.read_bytes()


def test_fix_patch_gives_a_gitops_repository_a_patch_git_applies(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    repo = tmp_path / "repo"
    shutil.copytree(FIX / "tree", repo / "clusters")
    monkeypatch.chdir(repo)
    code, out, _ = run("fix", "--patch", "--recursive", "clusters")
    assert code == 0 and "--- a/clusters/web.yaml" in out and "+++ b/clusters/base/instancetype.yaml" in out
    (tmp_path / "fix.patch").write_text(out)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "apply", str(tmp_path / "fix.patch")], check=True)
    assert "Nothing to change." in run("fix", "--recursive", "clusters")[1]


def test_a_fix_that_belongs_to_an_instancetype_not_given_is_named_never_guessed(tmp_path: Path) -> None:
    manifest = tmp_path / "vm.yaml"
    manifest.write_text(
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata: {name: db, namespace: prod}\nspec:\n"
        "  instancetype: {kind: VirtualMachineInstancetype, name: missing}\n  template:\n    spec:\n      domain:\n"
        "        cpu: {dedicatedCpuPlacement: true}\n        devices: {}\n")
    before = manifest.read_bytes()
    code, out, _ = run("fix", "--only", "KVM-KUB-002", str(manifest))
    assert code == 0
    assert "kubevirt:prod/db: KVM-KUB-002: the VM takes this from an instancetype that was not given; the fix belongs " \
           "there (spec.cpu.isolateEmulatorThread)" in out
    assert "Nothing to change." in out and manifest.read_bytes() == before


def test_a_waived_finding_is_left_alone_unless_its_rule_is_named(tmp_path: Path) -> None:
    import subprocess
    import sys

    manifest = tmp_path / "vm.yaml"
    shutil.copy(FIX / "examples" / "labs-testvm.yaml", manifest)
    config = tmp_path / "kvmtune.toml"
    config.write_text('[[waiver]]\nrule = "KVM-SEC-001"\nguest = "kubevirt:labs/*"\nreason = "entropy from the host"\n')
    config.chmod(0o644)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}
    env.pop("KVMTUNE_CONFIG", None)

    def fix(*args: str) -> str:
        return subprocess.run([sys.executable, "-m", "kvmtune", "fix", "--config", str(config), *args, str(manifest)],
                              capture_output=True, text=True, env=env, timeout=120, check=True).stdout

    out = fix()
    assert "+          rng: {}" not in out and "+          blockMultiQueue: true" in out
    assert "skipped: kubevirt:labs/testvm rng: KVM-SEC-001: not fixed: waived (entropy from the host;" in out
    assert "+          rng: {}" in fix("--only", "KVM-SEC-001")
    assert "+          rng: {}" in fix("--no-waivers")
