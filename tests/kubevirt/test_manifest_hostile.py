"""KubeVirt manifests are hostile input: each problem is one line naming the file (and the line where it is known),
the rest of the audit goes on, nothing is built from a tag, and an alias bomb costs a bounded amount of work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from kvmtune.cli import main
from kvmtune.errors import InputError
from kvmtune.kubevirt.guest import guests_from_objects
from kvmtune.kubevirt.load import MAX_MANIFEST_BYTES, read_file, read_paths

VM = """apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata:
  name: {name}
  namespace: ns
spec:
  template:
    spec:
      domain:
        cpu:
          cores: 2
        devices:
          disks:
          - name: root
            disk:
              bus: sata
"""


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(text if isinstance(text, bytes) else text.encode())
    return p


def refused(path: Path) -> str:
    with pytest.raises(InputError) as exc:
        read_file(str(path))
    line = str(exc.value)
    assert "\n" not in line and line.startswith(str(path))
    return line


def test_duplicate_keys_are_refused_with_their_line(tmp_path: Path) -> None:
    p = write(tmp_path, "dup.yaml", VM.format(name="a") + "            disk:\n              bus: virtio\n")
    line = refused(p)
    assert "duplicate key 'disk'" in line and f"{p}:17:" in line


def test_duplicate_keys_in_json_too(tmp_path: Path) -> None:
    p = write(tmp_path, "dup.json", '{"kind": "VirtualMachine",\t"kind": "List"}')
    assert "duplicate key 'kind'" in refused(p)


def test_an_alias_bomb_is_bounded(tmp_path: Path) -> None:
    rows = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 10):
        rows.append(f"{chr(97 + i)}: &{chr(97 + i)} [{', '.join(['*' + chr(96 + i)] * 10)}]")
    p = write(tmp_path, "bomb.yaml", "\n".join(rows) + "\n")
    start = time.monotonic()
    assert "alias bomb" in refused(p)
    assert time.monotonic() - start < 10


def test_a_recursive_alias_is_refused(tmp_path: Path) -> None:
    p = write(tmp_path, "loop.yaml", "a: &x\n  b: *x\n")
    assert "recursive" in refused(p)


@pytest.mark.parametrize("tag", ["!!python/object:os.system", "!!python/object/apply:os.system", "!custom",
                                 "!!python/name:os.system", "!!set"])
def test_tags_build_nothing(tmp_path: Path, tag: str) -> None:
    p = write(tmp_path, "tag.yaml", f"kind: VirtualMachine\nx: {tag} {{}}\n")
    assert "is not a plain YAML type" in refused(p)


def test_merge_keys_are_refused(tmp_path: Path) -> None:
    p = write(tmp_path, "merge.yaml", "base: &b {cores: 2}\ncpu:\n  <<: *b\n")
    assert "merge key" in refused(p)


def test_a_huge_file_is_refused_unread(tmp_path: Path) -> None:
    p = tmp_path / "huge.yaml"
    with p.open("wb") as f:
        f.truncate(MAX_MANIFEST_BYTES + 1)
    line = refused(p)
    assert "MiB" in line or "larger" in line or "limit" in line


def test_deep_nesting_is_refused(tmp_path: Path) -> None:
    p = write(tmp_path, "deep.yaml", "a: " + "[" * 5000 + "]" * 5000 + "\n")
    line = refused(p)
    assert "nested" in line or "deep" in line


def test_non_utf8_is_refused_with_its_offset(tmp_path: Path) -> None:
    p = write(tmp_path, "latin1.yaml", VM.format(name="caf\xe9").encode("latin-1"))
    assert "not UTF-8" in refused(p)


@pytest.mark.parametrize("brk", ["\u2028", "\u2029", "\x85"])
def test_line_breaks_editors_do_not_count_are_refused(tmp_path: Path, brk: str) -> None:
    p = write(tmp_path, "odd.yaml", VM.format(name="a").replace("namespace: ns\n", f"namespace: ns{brk}x: 1\n"))
    line = refused(p)
    assert "line break" in line and f"{p}:5:" in line


@pytest.mark.parametrize("eol", ["\r\n", "\r"])
def test_crlf_and_cr_lines_count_as_editors_count_them(tmp_path: Path, eol: str) -> None:
    p = write(tmp_path, "crlf.yaml", VM.format(name="a").replace("\n", eol))
    objs = read_file(str(p))
    assert objs[0].doc.at("spec.template.spec.domain.devices.disks[0].disk.bus") == (16, 15)


def test_a_helm_template_is_refused_as_one(tmp_path: Path) -> None:
    p = write(tmp_path, "helm.yaml", VM.format(name="{{ .Release.Name }}"))
    assert "a template (Helm" in refused(p)
    q = write(tmp_path, "helm2.yaml", VM.format(name="x").replace("cores: 2", "cores: {{ .Values.cores }}"))
    assert "a template (Helm" in refused(q)


def test_jinja_in_cloud_init_user_data_is_not_a_template(tmp_path: Path) -> None:
    text = VM.format(name="a") + "      volumes:\n      - name: root\n        cloudInitNoCloud:\n" \
        "          userData: |\n            #cloud-config\n            hostname: {{ ds.meta_data.name }}\n"
    assert read_file(str(write(tmp_path, "ci.yaml", text)))


def test_a_kustomization_is_refused(tmp_path: Path) -> None:
    p = write(tmp_path, "kustomization.yaml", "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
              "resources: [vm.yaml]\n")
    assert "kustomize build" in refused(p)


def test_a_vm_without_a_name_is_refused(tmp_path: Path) -> None:
    p = write(tmp_path, "noname.yaml", "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata: {}\n")
    assert "without metadata.name" in refused(p)


def test_wrong_types_everywhere_do_not_raise(tmp_path: Path) -> None:
    """Every field of the wrong type: the reader takes what it can and never raises past its guard."""
    text = ("apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata: {name: w, namespace: [1]}\n"
            "spec:\n  instancetype: {name: [x]}\n  template:\n    spec:\n      domain:\n        cpu: {cores: x, sockets: -3}\n"
            "        memory: {guest: 9999999999999999999999Ei, hugepages: 3}\n"
            "        devices: {disks: [1, {name: 2, disk: {bus: [x]}}, {lun: {}}], interfaces: {a: 1}}\n"
            "      volumes: [1, {name: x}]\n")
    guests, _ = guests_from_objects(read_file(str(write(tmp_path, "types.yaml", text))))
    assert guests[0].name == "kubevirt:default/w"


def test_a_tree_with_symlink_loops_dangling_links_and_a_fifo(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub", "vm.yaml", VM.format(name="deep"))
    os.symlink("..", tmp_path / "sub" / "loop")
    os.symlink("nowhere.yaml", tmp_path / "dangling.yaml")
    os.mkfifo(tmp_path / "fifo.yaml")
    write(tmp_path, "top.yaml", VM.format(name="top"))
    read = read_paths([str(tmp_path)], recursive=True)
    assert sorted(o.name for o in read.objects) == ["deep", "top"]
    text = "\n".join(read.errors)
    assert "symbolic link loop" in text and "dangling" in text and "fifo.yaml: not a regular file" in text
    flat = read_paths([str(tmp_path)])  # one level: the FIFO is still refused, never opened
    assert [o.name for o in flat.objects] == ["top"]
    assert any("fifo.yaml" in e for e in flat.errors)


def test_one_bad_file_costs_one_line_and_the_audit_goes_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(tmp_path, "a-good.yaml", VM.format(name="good"))
    write(tmp_path, "b-bad.yaml", "kind: VirtualMachine\nx: !!python/object:os.system {}\n")
    rc = main(["audit", "--no-images", "--format", "json", str(tmp_path)])
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert rc != 0 or doc["errors"]
    assert [e for e in doc["errors"] if "b-bad.yaml:2:" in e and "not a plain YAML type" in e]
    assert {f["target"]["domain"] for f in doc["findings"]} == {"kubevirt:ns/good"}


def test_multi_document_and_list_and_json(tmp_path: Path) -> None:
    multi = write(tmp_path, "multi.yaml", "---\n" + VM.format(name="one") + "---\n" + VM.format(name="two") + "---\n")
    items = [json.loads(json.dumps({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
                                    "metadata": {"name": n, "namespace": "ns"}})) for n in ("x", "y")]
    lst = write(tmp_path, "list.json", json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=1))
    assert [o.name for o in read_file(str(multi))] == ["one", "two"]
    objs = read_file(str(lst))
    assert [o.name for o in objs] == ["x", "y"]
    assert objs[1].doc.at("metadata.name")[0] > objs[0].doc.at("metadata.name")[0]  # type: ignore[index]


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_million_levels_do_not_crash_the_c_composer(tmp_path: Path, suffix: str) -> None:
    """libyaml's composer recurses in C: a million nested brackets crashed the process (SIGSEGV) before the depth
    was checked from the parser's events. A subprocess, so a regression fails this test instead of the run."""
    p = tmp_path / f"deep{suffix}"
    p.write_text('{"a": ' + "[" * 1_000_000 + "]" * 1_000_000 + "}\n")
    code = ("import sys\nfrom kvmtune.errors import InputError\nfrom kvmtune.kubevirt.load import read_file\n"
            "try:\n    read_file(sys.argv[1])\nexcept InputError as exc:\n    print(exc)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(p)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")},
                          check=False)
    assert proc.returncode == 0, proc.stderr[-500:]
    assert "nested" in proc.stdout and str(p) in proc.stdout
