"""scripts/build-wheel.sh: one x86-64 wheel with netload for every Python kvmtune supports, a pure wheel without
it, and an sdist; each installed into a fresh virtualenv of Python 3.11, 3.12 and 3.13 and run (issue 34)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.integration


def sh(*argv: str | Path, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=600, **kw)  # type: ignore[call-overload]


def interpreter(minor: str) -> str | None:
    """Python 3.<minor>: on PATH, or one of pyenv's (this project's machines have 3.11, 3.12 and 3.13 there)."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = sorted(root.glob(f"3.{minor}.*/bin/python3.{minor}")) if root.is_dir() else []
    if candidates:
        return str(candidates[-1])
    found = shutil.which(f"python3.{minor}")
    return found if found and "/shims/" not in found else None  # a pyenv shim may name a version it lacks


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("build") / "dist"  # dist/, as the README's build line names it
    proc = sh("bash", REPO / "scripts" / "build-wheel.sh", out)
    assert proc.returncode == 0, proc.stderr
    return out


def test_three_distributions_and_netload_only_in_the_x86_64_wheel(dist: Path) -> None:
    names = sorted(p.name for p in dist.iterdir())
    assert names == ["kvmtune-0.1.0-py3-none-any.whl", "kvmtune-0.1.0-py3-none-manylinux2014_x86_64.whl",
                     "kvmtune-0.1.0.tar.gz"]
    listing = sh("unzip", "-l", dist / names[1]).stdout
    assert "kvmtune/_bin/netload" in listing
    assert "_bin/netload" not in sh("unzip", "-l", dist / names[0]).stdout
    stamps = {n: json.loads(sh("unzip", "-p", dist / n, "kvmtune/_build.json").stdout) for n in names[:2]}
    assert stamps[names[1]]["netload"] and stamps[names[0]]["netload"] is None
    head = sh("git", "-C", REPO, "rev-parse", "--short=12", "HEAD").stdout.strip()
    assert all(s["commit"].startswith(head) and s["version"] == "0.1.0" for s in stamps.values())
    sdist = sh("tar", "-tzf", dist / names[2]).stdout.split()
    assert "kvmtune-0.1.0/netload/go.mod" in sdist and "kvmtune-0.1.0/src/kvmtune/cli/__init__.py" in sdist
    assert not any("/_bin/" in n for n in sdist)


def test_pip_refuses_nothing_on_x86_64_and_prefers_the_wheel_with_netload(dist: Path, tmp_path: Path) -> None:
    """Both wheels side by side, as build-wheel.sh leaves them: pip on x86-64 takes the manylinux one."""
    venv = tmp_path / "venv"
    assert sh(sys.executable, "-m", "venv", venv).returncode == 0
    proc = sh(venv / "bin" / "pip", "download", "-q", "--no-deps", "--no-index", "--find-links", dist, "-d", tmp_path / "got",
              "kvmtune")
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in (tmp_path / "got").iterdir()] == ["kvmtune-0.1.0-py3-none-manylinux2014_x86_64.whl"]


@pytest.mark.parametrize("minor", ["11", "12", "13"])
def test_the_wheel_installs_and_runs_on_python_3_x(minor: str, dist: Path, tmp_path: Path) -> None:
    python = interpreter(minor)
    if python is None:
        pytest.skip(f"no Python 3.{minor} here (pyenv's versions/3.{minor}.* or python3.{minor} on PATH)")
    venv = tmp_path / "venv"
    assert sh(python, "-m", "venv", venv).returncode == 0
    wheel = dist / "kvmtune-0.1.0-py3-none-manylinux2014_x86_64.whl"
    proc = sh(venv / "bin" / "pip", "install", "-q", "--disable-pip-version-check", wheel)  # lxml from the index
    assert proc.returncode == 0, proc.stderr
    kvmtune = venv / "bin" / "kvmtune"
    env = {**os.environ, "HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "data"), "PYTHONPATH": ""}
    run = sh(venv / "bin" / "python", "-c", "import kvmtune, sys; print(kvmtune.__file__, sys.version_info[:2])", env=env)
    assert f"/lib/python3.{minor}/site-packages/kvmtune/" in run.stdout and f"(3, {minor})" in run.stdout
    version = sh(kvmtune, "--version", env=env)
    assert version.returncode == 0 and "kvmtune 0.1.0 (commit " in version.stdout and "netload 0.4.1)" in version.stdout
    audit = sh(kvmtune, "audit", "--examples", "--no-images", "--format", "json", "-o", tmp_path / "examples.json", env=env)
    assert audit.returncode in (0, 1), audit.stderr
    assert "web01-legacy" in (tmp_path / "examples.json").read_text()
    host = sh(kvmtune, "audit", "--no-config", "--color", "never", env=env)  # no libvirt binding in this venv
    assert host.returncode in (0, 1), host.stderr
    assert "host audited" in host.stdout and "not read: libvirt's Python binding" in host.stdout
    rules = sh(kvmtune, "rules", "list", env=env)
    assert rules.returncode == 0 and "KVM-STO-004" in rules.stdout
    report = sh(kvmtune, "report", tmp_path / "examples.json", "--no-save", "--db", tmp_path / "results.db", env=env)
    assert report.returncode == 0, report.stderr
    assert "KVM-" in report.stdout
    netload = venv / "lib" / f"python3.{minor}" / "site-packages" / "kvmtune" / "_bin" / "netload"
    nv = sh(netload, "--version")
    assert nv.returncode == 0 and nv.stdout.startswith("netload 0.4.1")


def test_the_pure_wheel_says_it_carries_no_netload(dist: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    assert sh(sys.executable, "-m", "venv", "--system-site-packages", venv).returncode == 0  # Debian's lxml: no index
    proc = sh(venv / "bin" / "pip", "install", "-q", "--no-index", "--no-deps", dist / "kvmtune-0.1.0-py3-none-any.whl")
    assert proc.returncode == 0, proc.stderr
    env = {**os.environ, "PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": ""}
    assert "netload not included in this build)" in sh(venv / "bin" / "kvmtune", "--version", env=env).stdout
    doctor = sh(venv / "bin" / "kvmtune", "doctor", "--format", "json", env=env, cwd=tmp_path)
    (check,) = [c for c in json.loads(doctor.stdout)["checks"] if c["what"] == "netload"]
    assert check["ok"] is False and "py3-none-any wheel carries none" in check["detail"]


def test_the_readme_pipx_line_installs_the_wheel(dist: Path, tmp_path: Path) -> None:
    """The README's `pipx install ./dist/kvmtune-*x86_64.whl`, run as written where the build wrote dist/ (pipx from PyPI)."""
    tools = tmp_path / "tools"
    assert sh(sys.executable, "-m", "venv", tools).returncode == 0
    got = sh(tools / "bin" / "pip", "install", "-q", "--disable-pip-version-check", "pipx")
    assert got.returncode == 0, got.stderr
    line = next(ln.split("#", 1)[0].strip() for ln in (REPO / "README.md").read_text().splitlines() if ln.startswith("pipx "))
    assert line == "pipx install ./dist/kvmtune-*x86_64.whl"
    env = {**os.environ, "PATH": f"{tools / 'bin'}:{os.environ['PATH']}", "PIPX_HOME": str(tmp_path / "pipx"),
           "PIPX_BIN_DIR": str(tmp_path / "bin"), "PIPX_MAN_DIR": str(tmp_path / "man"), "PYTHONPATH": ""}
    proc = sh("bash", "-c", line, cwd=dist.parent, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    version = sh(tmp_path / "bin" / "kvmtune", "--version", env=env)
    assert version.returncode == 0 and "netload 0.4.1)" in version.stdout
