"""The drift canary's systemd units: scripts/deb-proof.sh verifies every unit the .deb ships (the canary's among
them) with ``systemd-analyze verify`` in a chroot; here the canary's units are verified the same way against a root
with ``/usr/bin/kvmtune`` in it, without booting anything."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEB = REPO / "packaging" / "deb"
CANARY_UNITS = ("kvmtune-canary.service", "kvmtune-canary.timer", "kvmtune-canary-boot.service")
HOST_UNITS = Path("/usr/lib/systemd/system")


def proof_units() -> list[str]:
    """The units deb-proof.sh hands to ``systemd-analyze verify`` (its ``units=(…)`` array)."""
    text = (REPO / "scripts" / "deb-proof.sh").read_text()
    m = re.search(r"^units=\(([^)]*)\)", text, re.M)
    assert m, "deb-proof.sh has no units=(...) array"
    assert 'systemd-analyze verify "${units[@]' in text
    return m.group(1).split()


def test_deb_proof_verifies_every_unit_the_package_ships() -> None:
    shipped = sorted(p.name for p in DEB.iterdir() if p.suffix in (".service", ".timer"))
    assert set(CANARY_UNITS) <= set(shipped)
    assert sorted(proof_units()) == shipped


def _root(tmp_path: Path) -> Path:
    """A root for ``systemd-analyze verify --root``: the host's targets and slices, /usr/bin/kvmtune, /bin/rm (the
    boot service's ExecStartPre) and the canary's units as the .deb installs them."""
    root = tmp_path / "root"
    units = root / "usr/lib/systemd/system"
    units.mkdir(parents=True)
    for p in HOST_UNITS.iterdir():
        if p.suffix in (".target", ".slice") and p.is_file():
            shutil.copy2(p, units / p.name)
    for d, name, text in (("usr/bin", "kvmtune", "#!/bin/sh\nexit 0\n"), ("bin", "rm", "#!/bin/sh\nexit 0\n")):
        (root / d).mkdir(parents=True, exist_ok=True)
        (root / d / name).write_text(text)
        os.chmod(root / d / name, 0o755)
    for name in CANARY_UNITS:
        shutil.copy2(DEB / name, units / name)
    return root


def _verify(root: Path, names: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    units = root / "usr/lib/systemd/system"
    return subprocess.run(["systemd-analyze", "verify", "--man=no", f"--root={root}", *(str(units / n) for n in names)],
                          capture_output=True, text=True, timeout=60, check=False)


needs_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None or not (HOST_UNITS / "sysinit.target").is_file(),
                                   reason="systemd-analyze or the host's systemd units are not installed")


@needs_analyze
def test_the_canary_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    res = _verify(_root(tmp_path), CANARY_UNITS)
    assert res.returncode == 0 and res.stdout + res.stderr == "", res.stdout + res.stderr


@needs_analyze
def test_the_verification_would_see_a_broken_unit(tmp_path: Path) -> None:
    """The check above can fail: an unknown key is a warning on stderr, a missing ExecStart binary an error."""
    root = _root(tmp_path)
    service = root / "usr/lib/systemd/system/kvmtune-canary.service"
    service.write_text(service.read_text().replace("[Service]\n", "[Service]\nFrobnicate=yes\n"))
    assert "Frobnicate" in _verify(root, ("kvmtune-canary.service",)).stderr
    (root / "usr/bin/kvmtune").unlink()
    res = _verify(root, ("kvmtune-canary-boot.service",))
    assert res.returncode != 0 and "/usr/bin/kvmtune" in res.stderr
