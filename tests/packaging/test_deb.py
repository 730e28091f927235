"""scripts/build-deb.sh OUTDIR: the Debian package's contents, control fields, conffiles and lintian (issue 34).
Its proof in a clean bookworm and trixie (install, run, purge) is scripts/deb-proof.sh, a CI step of its own."""

from __future__ import annotations

import gzip
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


def sh(*argv: str | Path, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=600, **kw)  # type: ignore[call-overload]


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("deb") / "out"  # a directory that does not exist yet: the script makes it
    proc = sh("bash", REPO / "scripts" / "build-deb.sh", out)
    assert proc.returncode == 0, proc.stderr
    (found,) = out.glob("kvmtune_*.deb")
    assert found.name == "kvmtune_0.1.0_amd64.deb"
    return found


def test_the_package_installs_the_command_man_page_completions_units_and_conffile(deb: Path) -> None:
    files = {line.split()[-1].removeprefix(".") for line in sh("dpkg-deb", "-c", deb).stdout.splitlines()}
    for path in ("/usr/bin/kvmtune", "/usr/lib/python3/dist-packages/kvmtune/cli/__init__.py",
                 "/usr/lib/python3/dist-packages/kvmtune/_bin/netload", "/usr/lib/python3/dist-packages/kvmtune/_build.json",
                 "/usr/share/man/man8/kvmtune.8.gz", "/usr/share/bash-completion/completions/kvmtune",
                 "/usr/share/zsh/vendor-completions/_kvmtune", "/usr/share/fish/vendor_completions.d/kvmtune.fish",
                 "/usr/lib/systemd/system/kvmtune-audit.service", "/usr/lib/systemd/system/kvmtune-audit.timer",
                 "/usr/lib/systemd/system/kvmtune-sample.service", "/usr/lib/systemd/system/kvmtune-sample.timer",
                 "/usr/lib/systemd/system/kvmtune-canary.service", "/usr/lib/systemd/system/kvmtune-canary.timer",
                 "/usr/lib/systemd/system/kvmtune-canary-boot.service", "/usr/lib/kvmtune/canary-apt-hook",
                 "/etc/apt/apt.conf.d/80kvmtune-canary",
                 "/etc/default/kvmtune", "/etc/kvmtune/kvmtune.toml", "/usr/share/doc/kvmtune/copyright",
                 "/usr/share/doc/kvmtune/changelog.gz",
                 "/var/lib/prometheus/node-exporter/"):
        assert path in files, path
    assert not any("__pycache__" in f for f in files)  # postinst compiles, prerm removes: nothing left after purge
    control = sh("dpkg-deb", "-f", deb).stdout
    assert "Depends: python3 (>= 3.11), python3-lxml, python3-yaml, python3-libvirt, qemu-utils\n" in control
    # a Proxmox VE node has pve-qemu-kvm (Provides and Conflicts qemu-system-x86, qemu-utils) and no libvirt: only suggested
    assert "Recommends: fio, prometheus-node-exporter\n" in control
    assert "Suggests: libvirt-daemon-system, qemu-system-x86, " in control
    tmp = deb.parent / "ctrl"
    assert sh("dpkg-deb", "-e", deb, tmp).returncode == 0
    assert (tmp / "conffiles").read_text() == ("/etc/default/kvmtune\n/etc/kvmtune/kvmtune.toml\n"
                                               "/etc/apt/apt.conf.d/80kvmtune-canary\n")
    man = subprocess.run(["dpkg-deb", "--fsys-tarfile", deb], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(man)) as tar:
        roff = gzip.decompress(tar.extractfile("./usr/share/man/man8/kvmtune.8.gz").read()).decode()  # type: ignore[union-attr]
        units = {name: tar.extractfile(f"./usr/lib/systemd/system/{name}.service").read().decode()  # type: ignore[union-attr]
                 for name in ("kvmtune-audit", "kvmtune-sample")}
    assert roff.startswith(".TH KVMTUNE 8 ")
    for unit in units.values():  # /etc stays readable: the settings file /etc/kvmtune/kvmtune.toml reaches the runs
        assert not any(ln.startswith(("InaccessiblePaths=", "TemporaryFileSystem=", "ReadOnlyPaths=", "BindPaths="))
                       for ln in unit.splitlines())
        for hardening in ("ProtectSystem=strict", "ReadWritePaths=/var/lib/prometheus/node-exporter", "NoNewPrivileges=yes",
                          "RestrictAddressFamilies=AF_UNIX", "IPAddressDeny=any", "StateDirectory=kvmtune"):
            assert f"\n{hardening}\n" in unit, hardening
    # one audit a run, both outputs from it (issue 46 item 7)
    (audit_exec,) = [ln for ln in units["kvmtune-audit"].splitlines() if ln.startswith("ExecStart=")]
    assert audit_exec.endswith("--format json -o /var/lib/kvmtune/audit.json "
                               "--also prometheus=/var/lib/prometheus/node-exporter/kvmtune.prom")
    assert "--format prometheus -o /var/lib/prometheus/node-exporter/kvmtune-live.prom" in units["kvmtune-sample"]


def test_the_package_ships_every_document_the_man_page_and_the_settings_file_name(deb: Path) -> None:
    """kvmtune(8)'s SEE ALSO and FILES, and the shipped kvmtune.toml, name /usr/share/doc/kvmtune/...: all there (issue 46)."""
    from kvmtune.cli.shelldocs import SHIPPED_DOCS

    files = {line.split()[-1].removeprefix(".") for line in sh("dpkg-deb", "-c", deb).stdout.splitlines()}
    with tarfile.open(fileobj=io.BytesIO(subprocess.run(["dpkg-deb", "--fsys-tarfile", deb], capture_output=True,
                                                        check=True).stdout)) as tar:
        roff = gzip.decompress(tar.extractfile("./usr/share/man/man8/kvmtune.8.gz").read()).decode()  # type: ignore[union-attr]
        toml = tar.extractfile("./etc/kvmtune/kvmtune.toml").read().decode()  # type: ignore[union-attr]
    named = set(re.findall(r"/usr/share/doc/kvmtune/[\w.-]*\w", roff.replace("\\-", "-") + toml))
    assert {f"/usr/share/doc/kvmtune/{d}" for d in SHIPPED_DOCS} <= named
    assert "/usr/share/doc/kvmtune/settings.md" in toml
    missing = sorted(n for n in named if n not in files)
    assert missing == []
    assert "docs/" not in toml  # no pointer into a source checkout the host does not have
    shipped = (REPO / "docs" / "settings.md").read_text()
    assert tar_text(deb, "./usr/share/doc/kvmtune/settings.md") == shipped


def tar_text(deb: Path, member: str) -> str:
    data = subprocess.run(["dpkg-deb", "--fsys-tarfile", deb], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return tar.extractfile(member).read().decode()  # type: ignore[union-attr]


def test_the_package_is_lintian_clean(deb: Path, tmp_path: Path) -> None:
    lintian = shutil.which("lintian")
    if lintian is None:
        pytest.fail("lintian is not installed (scripts/install.sh installs it)")
    # lintian leaves its ELF cache (a Berkeley DB, mldbm-elf-*) in TMPDIR: here, not in /tmp after every run
    proc = sh(lintian, "--pedantic", "--fail-on", "error,warning,info,pedantic", deb,
              env={**os.environ, "TMPDIR": str(tmp_path)})
    assert proc.returncode == 0 and proc.stdout.strip() == "", proc.stdout + proc.stderr


def test_the_package_is_reproducible(deb: Path, tmp_path: Path) -> None:
    again = sh("bash", REPO / "scripts" / "build-deb.sh", tmp_path)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / deb.name).read_bytes() == deb.read_bytes()


def test_the_package_ships_the_settings_file_with_every_key_commented_out(deb: Path, tmp_path: Path) -> None:
    """/etc/kvmtune/kvmtune.toml: root's, mode 0644 (kvmtune refuses a settings file others can write), valid, and
    setting nothing, so installing the package changes no behaviour; its keys are all there to uncomment."""
    fsys = subprocess.run(["dpkg-deb", "--fsys-tarfile", deb], capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(fsys)) as tar:
        member = tar.getmember("./etc/kvmtune/kvmtune.toml")
        text = tar.extractfile(member).read().decode()  # type: ignore[union-attr]
    assert (member.uname, member.uid, member.mode) == ("root", 0, 0o644)
    assert text == (REPO / "packaging" / "deb" / "kvmtune.toml").read_text(encoding="utf-8")
    shipped = tmp_path / "kvmtune.toml"
    shipped.write_text(text)
    shipped.chmod(0o644)
    env = {"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"}
    done = sh(sys.executable, "-m", "kvmtune", "config", "check", shipped, env=env)
    assert done.returncode == 0 and done.stdout == f"{shipped}: OK (0 setting(s), 0 waiver(s))\n", done.stderr
