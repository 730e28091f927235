"""contrib/ansible/canary.yml: each host runs ``kvmtune canary run`` into a fresh root-only directory, its JSON is
fetched to the controller (``collected/canary/HOST.json``, for ``kvmtune canary fleet``), the directory is removed;
exit 1 (a settled regression) is a result, exit 2 fails the host.

The real ansible-playbook runs against this machine (local connection) with a stand-in kvmtune that records its
arguments and where it was told to write, and exits as the test says."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ANSIBLE = REPO / "contrib" / "ansible"

KVMTUNE = """#!/bin/sh
out=""; prev=""
for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done
echo "$out $(stat -c '%a %u' "$(dirname "$out")")" >> "{log}/where"
echo "$*" >> "{log}/argv"
printf '%s\\n' '{{"suite": "1", "verdict": "regression", "metrics": [], "changed": [], "environment": {{}}}}' > "$out"
exit $(cat "{log}/rc")
"""

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the play runs as root (a 0700 root directory is tested)")


def _play(tmp_path: Path, rc: int, args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    if shutil.which("ansible-playbook") is None:
        pytest.skip("ansible-playbook is not installed")
    prefix, log = tmp_path / "venv", tmp_path / "log"
    (prefix / "bin").mkdir(parents=True, exist_ok=True)
    log.mkdir(exist_ok=True)
    (log / "rc").write_text(f"{rc}\n")
    (prefix / "bin" / "kvmtune").write_text(KVMTUNE.format(log=log))
    (prefix / "bin" / "kvmtune").chmod(0o755)
    inv = tmp_path / "inventory.ini"
    inv.write_text("[kvmtune_hosts]\nh1 ansible_connection=local ansible_python_interpreter=/usr/bin/python3 "
                   f"kvmtune_prefix={prefix} kvmtune_collect_dir={tmp_path / 'collected'} "
                   f"kvmtune_canary_args='{args}'\n")
    env = {**os.environ, "ANSIBLE_CONFIG": str(ANSIBLE / "ansible.cfg"), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "al"),
           "ANSIBLE_REMOTE_TEMP": str(tmp_path / "ar")}
    run = subprocess.run(["ansible-playbook", "-i", str(inv), str(ANSIBLE / "canary.yml")], capture_output=True,
                         text=True, env=env, timeout=300, check=False)
    return run, log


def test_the_canary_json_reaches_the_controller_and_its_directory_goes(tmp_path: Path) -> None:
    run, log = _play(tmp_path, 1, "--dir /var/lib/libvirt/images --quick")  # 1: a settled regression, a result
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    (argv,) = (log / "argv").read_text().splitlines()
    assert argv.startswith("canary run --dir /var/lib/libvirt/images --quick --format json -o ")
    ((out, mode, uid),) = [line.split() for line in (log / "where").read_text().splitlines()]
    assert (mode, uid) == ("700", "0") and not os.path.lexists(os.path.dirname(out))
    doc = json.loads((tmp_path / "collected" / "canary" / "h1.json").read_text())
    assert doc["verdict"] == "regression"


def test_an_error_fails_the_host_and_still_removes_the_directory(tmp_path: Path) -> None:
    run, log = _play(tmp_path, 2, "")
    assert run.returncode != 0 and "h1" in run.stdout
    ((out, _mode, _uid),) = [line.split() for line in (log / "where").read_text().splitlines()]
    assert not os.path.lexists(os.path.dirname(out))
    assert not (tmp_path / "collected" / "canary" / "h1.json").exists()
