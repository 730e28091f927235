"""verify against definitions that aim its benchmark at someone else's file (issue 43, items 1 and 6).

Real qemu-storage-daemon, qemu-img and fio through ``kvmtune verify``, as tests/integration/test_verify.py runs them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import threading
from pathlib import Path
from xml.sax.saxutils import quoteattr

import pytest

from kvmtune.cli import main

pytestmark = pytest.mark.integration
TOOLS = ("qemu-storage-daemon", "fio", "qemu-img")


def _need() -> None:
    for t in TOOLS:
        if shutil.which(t) is None:
            pytest.skip(f"{t} not installed")


def _definition(path: Path, io: str, source: Path) -> Path:
    path.write_text(f"""<domain type='kvm'><name>victimiser</name><memory>1048576</memory><vcpu>1</vcpu>
      <os><type arch='x86_64' machine='pc'>hvm</type></os><devices>
      <disk type='file' device='disk'>
        <driver name='qemu' type='raw' cache='writethrough' io={quoteattr(io)}/>
        <source file={quoteattr(str(source))}/><target dev='vda' bus='virtio'/>
      </disk></devices></domain>""")
    return path


def _verify(definition: Path, work: Path, capsys: pytest.CaptureFixture[str]) -> dict:  # type: ignore[type-arg]
    code = main(["verify", str(definition), "--only", "KVM-STO-002", "--size", "64M", "--repeat", "1", "--seconds", "1",
                 "--finding-budget", "5", "--no-store", "--workdir", str(work), "--format", "json"])
    out = capsys.readouterr().out
    assert code in (0, 1), out
    (r,) = [r for r in json.loads(out)["results"] if r["rule"] == "KVM-STO-002"]
    return r  # type: ignore[no-any-return]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_an_injected_filename_never_gets_the_benchmark(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The reproduction of issue 43: ``io='threads,filename=FILE'`` made fio's random writes land in FILE."""
    _need()
    victim = tmp_path / "victim.raw"
    victim.write_bytes(os.urandom(64 << 20))
    before = _sha(victim)
    scratch = tmp_path / "scratch.raw"
    scratch.write_bytes(b"")
    work = tmp_path / "work"
    hostile = _verify(_definition(tmp_path / "hostile.xml", f"threads,filename={victim}", scratch), work, capsys)
    assert _sha(victim) == before
    assert hostile["measurement"] is None and hostile["error"] is None
    assert hostile["not_measured"] == f"disk vda: io mode 'threads,filename={victim}' is not one QEMU knows"
    # the same definition without the injected key is measured
    plain = _verify(_definition(tmp_path / "plain.xml", "threads", scratch), work, capsys)
    assert plain["measurement"] is not None and plain["change"].startswith("cache writethrough → none"), plain
    assert _sha(victim) == before


def test_a_missing_source_gets_no_scratch_beside_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Scratch only where kvmtune owns it: a path a definition names but that is no image here is not used."""
    _need()
    elsewhere = tmp_path / "var-log"  # stands for /var/log, /boot: a writable directory that is not kvmtune's
    elsewhere.mkdir()
    work = tmp_path / "work"
    seen: set[str] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.update(p.name for p in elsewhere.iterdir())
            done.wait(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        r = _verify(_definition(tmp_path / "d.xml", "threads", elsewhere / "missing.raw"), work, capsys)
    finally:
        done.set()
        watcher.join()
    assert seen == set() and list(elsewhere.iterdir()) == []
    assert r["measurement"] is not None, r
    assert Path(r["details"]["replica_dir"]).is_relative_to(work)
    assert any(f"the image {elsewhere / 'missing.raw'} does not exist: replicas made in the work directory {work}" in n
               for n in r["notes"]), r["notes"]
