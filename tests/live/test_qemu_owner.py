"""Issue 43 item 7: any user may start a QEMU and give it any -name, so `top`, `sample` and `why` say who runs a
QEMU that libvirt did not start: its user's name (the host's user database, the tree's under --root), else its uid."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kvmtune.cli.why import render_text
from kvmtune.live.why import Target, WhyReport

from .test_live_unit import make_host, make_qemu, write

REPO = Path(__file__).resolve().parents[2]


def tree(root: Path) -> Path:
    """Two QEMUs both named 'web': one root's, one a local user's (in the tree's /etc/passwd), and one of a uid
    that has no name there."""
    make_host(root)
    make_qemu(root, 100, "web", {0: (0, 0, "0")})
    make_qemu(root, 200, "web", {0: (0, 0, "0")})
    make_qemu(root, 300, "db", {0: (0, 0, "0")})
    write(root, "/proc/200/status", "Name:\tqemu\nUid:\t1000\t1000\t1000\t1000\n")
    write(root, "/proc/300/status", "Name:\tqemu\nUid:\t4242\t4242\t4242\t4242\n")
    write(root, "/etc/passwd", "root:x:0:0:root:/root:/bin/bash\nmallory:x:1000:1000::/home/mallory:/bin/sh\n")
    return root


def kvmtune(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    env.pop("KVMTUNE_CONFIG", None)
    return subprocess.run([sys.executable, "-m", "kvmtune", *argv], capture_output=True, text=True, env=env,
                          timeout=120, check=False)


def test_sample_shows_who_runs_each_qemu_in_every_format(tmp_path: Path) -> None:
    root = str(tree(tmp_path / "root"))
    common = ("sample", "--no-config", "--root", root, "--no-libvirt", "--duration", "0.2", "--interval", "0.1")
    done = kvmtune(*common, "--format", "json")
    assert done.returncode == 0, done.stderr
    owners = {g["source"]: g["owner"] for g in json.loads(done.stdout)["summary"]["guests"]}
    assert owners == {"pid 100": "root", "pid 200": "mallory", "pid 300": "uid 4242"}
    text = kvmtune(*common).stdout
    rows = {line.split()[0] + " " + line.split()[2]: line for line in text.splitlines() if line.startswith(("web", "db"))}
    assert "pid 200 (mallory)" in rows["web 200"] and "pid 100 (root)" in rows["web 100"], text
    assert "pid 300 (uid 4242)" in rows["db 300"]
    prom = kvmtune(*common, "--format", "prometheus").stdout
    assert 'owner="mallory"' in prom and 'owner="uid 4242"' in prom


def test_why_names_the_owners_of_the_qemus_a_name_matches(tmp_path: Path) -> None:
    root = str(tree(tmp_path / "root"))
    done = kvmtune("why", "web", "--no-libvirt", "--seconds", "1", "--root", root)
    assert done.returncode == 2
    assert done.stderr == ("kvmtune: web: names 2 running guests (pid 100 (root), pid 200 (mallory)); "
                           "name it by pid or UUID\n")
    report = WhyReport(Target("web", "pid 200", "pid:200:web", 200, None, False, "mallory"), 1.0, "kvm")
    assert render_text(report).splitlines()[0] == "why web (pid 200, run by mallory): sampled 1.0 s"
    assert report.as_json()["guest"]["owner"] == "mallory"
