"""Where the Ansible role puts root's audit and the wheel on a host: a fresh root-only directory each run,
removed afterwards, never a fixed /tmp name another user can prepare (a link to a block device, a FIFO).

The real ansible-playbook runs site.yml against this machine (local connection) with a stand-in kvmtune
installation: its pip and kvmtune record where they were told to read and write, and how that directory
looked then."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "contrib" / "ansible"

PIP = """#!/bin/sh
for a in "$@"; do wheel="$a"; done
d=$(dirname "$wheel")
echo "$wheel $(stat -c '%a %u' "$d") $(stat -c '%a' "$wheel")" >> "{log}/pip"
"""
KVMTUNE = """#!/bin/sh
out=""; prev=""
for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done
echo "$out $(stat -c '%a %u' "$(dirname "$out")")" >> "{log}/kvmtune"
echo "$*" >> "{log}/argv"
case " $* " in *" --root /no-such-root "*) echo "kvmtune: --root /no-such-root: no such directory" >&2; exit 2;; esac
echo '{{"kind": "stand-in audit"}}' > "$out"
"""


def _stand_in(tmp_path: Path) -> tuple[Path, Path]:
    prefix, log = tmp_path / "venv", tmp_path / "log"
    (prefix / "bin").mkdir(parents=True)
    log.mkdir()
    (prefix / "bin" / "python").write_text("")  # the role's "make the virtualenv" sees one there
    for name, text in (("pip", PIP), ("kvmtune", KVMTUNE)):
        (prefix / "bin" / name).write_text(text.format(log=log))
        (prefix / "bin" / name).chmod(0o755)
    return prefix, log


def _play(tmp_path: Path, prefix: Path, audit_args: str | None, how: str = "") -> subprocess.CompletedProcess[str]:
    """``how``: extra host variables; by default the role is pointed at a stand-in wheel by name.
    ``audit_args``: ``None`` leaves the role's default."""
    if shutil.which("ansible-playbook") is None:
        pytest.fail("ansible-playbook is not installed (scripts/install.sh installs ansible-core)")
    if not how:
        wheel = tmp_path / "kvmtune-0.1.0-py3-none-any.whl"
        wheel.write_bytes(b"PK stand-in")
        how = f"kvmtune_wheel={wheel}"
    inv = tmp_path / "inventory.ini"
    inv.write_text("[kvmtune_hosts]\nh1 ansible_connection=local ansible_python_interpreter=/usr/bin/python3 "
                   f"kvmtune_prefix={prefix} {how} kvmtune_collect_dir={tmp_path / 'collected'}"
                   + (f" kvmtune_audit_args='{audit_args}'" if audit_args is not None else "") + "\n")
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROLE / "ansible.cfg"), "ANSIBLE_LOCAL_TEMP": str(tmp_path / "al"),
           "ANSIBLE_REMOTE_TEMP": str(tmp_path / "ar")}
    return subprocess.run(["ansible-playbook", "-i", str(inv), str(ROLE / "site.yml")], capture_output=True,
                          text=True, env=env, timeout=300)


def _seen(log: Path, name: str) -> list[list[str]]:
    return [line.split() for line in (log / name).read_text().splitlines()]


@pytest.mark.skipif(os.geteuid() != 0, reason="the role runs as root (a 0700 root directory is what is tested)")
def test_role_audits_into_a_fresh_private_directory_and_removes_it(tmp_path: Path) -> None:
    prefix, log = _stand_in(tmp_path)
    run = _play(tmp_path, prefix, "--host")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    ((wheel, wmode, wuid, fmode),) = _seen(log, "pip")
    ((out, omode, ouid),) = _seen(log, "kvmtune")
    for path, mode, uid in ((wheel, wmode, wuid), (out, omode, ouid)):
        # the directory it was in was root's alone, then, and is gone now
        assert (mode, uid) == ("700", "0"), (path, mode, uid)
        assert not os.path.lexists(os.path.dirname(path)), path
    assert fmode == "600" and os.path.basename(wheel) == "kvmtune-0.1.0-py3-none-any.whl"
    assert json.loads((tmp_path / "collected" / "h1.json").read_text()) == {"kind": "stand-in audit"}
    # a second run gets another directory: nothing about the name can be prepared ahead
    run = _play(tmp_path, prefix, "--host")
    assert run.returncode == 0, run.stdout[-3000:]
    assert _seen(log, "kvmtune")[1][0] != out and _seen(log, "pip")[1][0] != wheel


@pytest.mark.skipif(os.geteuid() != 0, reason="the role runs as root")
def test_role_removes_the_directory_when_the_audit_fails(tmp_path: Path) -> None:
    prefix, log = _stand_in(tmp_path)
    run = _play(tmp_path, prefix, "--host --root /no-such-root")
    assert run.returncode == 0, run.stdout[-3000:]  # the failure is reported, not fatal to the play
    ((out, mode, _),) = _seen(log, "kvmtune")
    assert mode == "700" and not os.path.lexists(os.path.dirname(out))
    status = json.loads((tmp_path / "collected" / "h1.json").read_text())
    assert status["kind"] == "kvmtune-fleet-status" and status["problem"].startswith("kvmtune exited 2")


@pytest.mark.skipif(os.geteuid() != 0, reason="the role runs as root")
def test_role_takes_the_wheel_by_the_name_the_build_gave_it(tmp_path: Path) -> None:
    """No wheel named in the inventory: the role finds the x86-64 wheel build-wheel.sh left in the dist directory."""
    prefix, log = _stand_in(tmp_path)
    dist = tmp_path / "dist"
    dist.mkdir()
    for name in ("kvmtune-0.1.0-py3-none-any.whl", "kvmtune-0.1.0-py3-none-manylinux2014_x86_64.whl", "kvmtune-0.1.0.tar.gz"):
        (dist / name).write_bytes(b"PK stand-in")
    run = _play(tmp_path, prefix, "--host", how=f"kvmtune_dist_dir={dist}")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    ((wheel, *_),) = _seen(log, "pip")
    assert os.path.basename(wheel) == "kvmtune-0.1.0-py3-none-manylinux2014_x86_64.whl"


@pytest.mark.skipif(os.geteuid() != 0, reason="the role runs as root")
def test_role_installs_the_deb_with_apt_when_asked(tmp_path: Path) -> None:
    prefix, log = _stand_in(tmp_path)
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "kvmtune_0.1.0_amd64.deb").write_bytes(b"!<arch> stand-in")
    apt = tmp_path / "apt-get"
    apt.write_text(PIP.format(log=log).replace('"{log}/pip"', f'"{log}/apt"').replace("/pip", "/apt") +
                   f'echo "$*" >> "{log}/apt-args"\n')
    apt.chmod(0o755)
    run = _play(tmp_path, prefix, "--host", how=f"kvmtune_install_from=deb kvmtune_dist_dir={dist} kvmtune_apt_get={apt} "
                                              f"kvmtune_bin={prefix / 'bin' / 'kvmtune'}")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    ((deb, dmode, duid, fmode),) = _seen(log, "apt")
    assert os.path.basename(deb) == "kvmtune_0.1.0_amd64.deb" and (dmode, duid, fmode) == ("700", "0", "600")
    assert not os.path.lexists(os.path.dirname(deb))
    assert (log / "apt-args").read_text().startswith("install -y -q --no-install-recommends /")
    assert not (log / "pip").exists()  # no virtualenv, no wheel
    assert json.loads((tmp_path / "collected" / "h1.json").read_text()) == {"kind": "stand-in audit"}


@pytest.mark.skipif(os.geteuid() != 0, reason="the role runs as root")
def test_role_without_a_build_says_which_script_makes_it(tmp_path: Path) -> None:
    prefix, _ = _stand_in(tmp_path)
    (tmp_path / "empty").mkdir()
    run = _play(tmp_path, prefix, "--host", how=f"kvmtune_install_from=deb kvmtune_dist_dir={tmp_path / 'empty'}")
    status = json.loads((tmp_path / "collected" / "h1.json").read_text())
    assert "run scripts/build-deb.sh dist" in status["problem"], run.stdout[-3000:]


@pytest.mark.skipif(os.geteuid() != 0, reason="the role runs as root")
def test_role_audits_host_and_guests_by_default_names_the_collection_and_distributes_waivers(tmp_path: Path) -> None:
    """Issue 31 item 10: the role's default audit is the host and what it runs (no --host: libvirt's domains and
    the running QEMU processes too); the collection is named after the inventory. Issue 33: a fleet settings
    file is copied to each host, root's and 0644, and the audits read it with --config."""
    prefix, log = _stand_in(tmp_path)
    run = _play(tmp_path, prefix, None)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    (argv,) = (log / "argv").read_text().splitlines()
    # nothing narrows it to the host; --staged counts the host's journaled fixes not in force yet
    assert argv.split()[:4] == ["audit", "--staged", "--format", "json"]
    marker = json.loads((tmp_path / "collected" / ".kvmtune-collection").read_text())
    assert marker == {"kind": "kvmtune-fleet-collection", "name": str(tmp_path / "inventory.ini")}
    waivers = tmp_path / "fleet.toml"
    waivers.write_text('[[waiver]]\nrule = "KVM-HST-043"\nreason = "lab"\n')
    dest = tmp_path / "host-etc" / "kvmtune" / "fleet.toml"
    run = _play(tmp_path, prefix, None, how=f"kvmtune_wheel={tmp_path / 'kvmtune-0.1.0-py3-none-any.whl'} "
                                            f"kvmtune_waivers_file={waivers} kvmtune_waivers_dest={dest}")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert dest.read_text() == waivers.read_text()
    assert (dest.stat().st_uid, dest.stat().st_mode & 0o777) == (0, 0o644)
    assert (log / "argv").read_text().splitlines()[1].split()[:4] == ["audit", "--config", str(dest), "--staged"]


def test_no_fixed_tmp_path_in_the_role() -> None:
    for path in sorted(ROLE.rglob("*.yml")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            assert "/tmp" not in code and "/var/tmp" not in code, f"{path.relative_to(REPO)}:{n}: {line.strip()}"
