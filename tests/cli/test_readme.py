"""The README's first screen tells a new operator what to run, where the command is and what the
install changes; it points only at files in the repository, and no link in the repository dangles."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")


def test_first_lines_build_then_install_without_recommends_then_test_and_the_fast_loop() -> None:
    """How to build the package and the wheels, then the package (run as written by scripts/deb-proof.sh), the wheel
    (tests/packaging/test_wheel.py), the checkout (issue 46 item 1)."""
    block = README.split("```sh\n", 1)[1].split("```", 1)[0]
    commands = [ln.split("#", 1)[0].strip() for ln in block.splitlines() if ln.strip()]
    assert commands == ["bash scripts/build-deb.sh dist", "bash scripts/build-wheel.sh dist",
                        "apt install --no-install-recommends ./dist/kvmtune_*.deb", "pipx install ./dist/kvmtune-*x86_64.whl",
                        "bash scripts/install.sh", "bash scripts/test.sh", "bash scripts/test.sh --fast"]
    assert README.index("```sh") < 200
    building = README[: README.index("**What kvmtune does")]
    for needed in ("Go >= 1.22", "bookworm-backports", "GOTOOLCHAIN", "`go 1.22` directive", "docs/packaging.md"):
        assert needed in building.replace("\n", " "), needed
    assert "go 1.22\n" in (REPO / "netload" / "go.mod").read_text()  # the version the README names


def test_the_readme_says_how_the_wheel_reaches_libvirts_binding() -> None:
    """Issue 46 item 2: the pipx line that reaches the system's binding and the one that builds it."""
    first_screen = README[: README.index("## Audit")]
    assert "pipx install --system-site-packages ./dist/kvmtune-*x86_64.whl" in first_screen
    assert "apt install pkg-config gcc python3-dev libvirt-dev && pipx inject kvmtune libvirt-python" in first_screen
    from kvmtune.domain.connection import BINDING_HINT  # the audit's note says the same

    assert "--system-site-packages" in BINDING_HINT and "pipx inject kvmtune libvirt-python" in BINDING_HINT


def test_deb_proof_reads_and_runs_the_readme_install_line_as_written() -> None:
    """deb-proof.sh takes the line from README.md with its own sed: the same line this test reads."""
    proof = REPO / "scripts" / "deb-proof.sh"
    (extract,) = [ln for ln in proof.read_text().splitlines() if ln.startswith("readme_line=$(")]
    script = extract.removeprefix("readme_line=$(").removesuffix(")")
    got = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    assert got == "apt install --no-install-recommends ./dist/kvmtune_*.deb"
    assert 'in_root sh -c "cd /tmp && $readme_line"' in proof.read_text()
    assert 'cp "$deb" "$root/tmp/dist/"' in proof.read_text()


def test_first_screen_says_where_the_command_is_and_what_install_changes() -> None:
    first_screen = README[: README.index("## Audit")]
    assert ".venv/bin/kvmtune" in first_screen and "/usr/local/bin/kvmtune" in first_screen and "PATH" in first_screen
    for change in ("linux-image-cloud-amd64", "Open\nvSwitch", "iperf3", "sockperf", "Go", "npm", "libvirtd"):
        assert change.replace("\n", " ") in first_screen.replace("\n", " "), change
    assert "scripts/install.sh --audit-only" in first_screen


def test_no_duplicated_sections() -> None:
    headings = re.findall(r"^## (.+)$", README, flags=re.M)
    assert len(headings) == len(set(headings)), headings


def test_paths_the_readme_names_exist_in_the_repository() -> None:
    assert "../" not in README
    named = set(re.findall(r"`((?:docs|scripts|src|netload|bench|tests|examples)/[\w./-]*)`", README))
    assert named
    for path in named:
        if "<" in path or "*" in path:
            continue
        assert (REPO / path.split(" ")[0]).exists(), path


def test_no_symlink_in_the_repository_dangles() -> None:
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-s"], capture_output=True, text=True, check=True).stdout
    links = [ln.split("\t", 1)[1] for ln in listed.splitlines() if ln.startswith("120000 ")]
    links = [ln for ln in links if not ln.startswith("tests/fixtures/")]  # captured sysfs trees link as sysfs does
    assert "examples" in links
    for link in links:
        assert (REPO / link).exists(), f"{link} -> {(REPO / link).readlink()} dangles"


def test_one_textfile_path_everywhere() -> None:
    """Issue 46 item 7: the README, the units and kvmtune(8) name node_exporter's textfile directory alike."""
    from kvmtune.cli.shelldocs import _FILES

    units = "".join((REPO / "packaging" / "deb" / f"kvmtune-{u}.service").read_text() for u in ("audit", "sample"))
    texts = (README, units, " ".join(path for path, _ in _FILES))
    textfiles = {m for text in texts for m in re.findall(r"(/var/lib/[\w/.-]*)/kvmtune[\w-]*\.prom", text)}
    assert textfiles == {"/var/lib/prometheus/node-exporter"}, textfiles
