"""The Ansible role on a fleet of "hosts": network namespaces, each with a real sshd on a 198.18.0.0/15
address, reached by the real ansible-playbook from a controller namespace. Each host audits its own
fixture root, so their results differ; three more inventory entries fail in the three ways a fleet does."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvmtune.runner import die_with_parent_preexec

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "hosts"
ROOTS = {"h1": "rhel6-old", "h2": "nvme-modern", "h3": "ksm-overcommit"}
pytestmark = pytest.mark.integration


def sh(*argv: str, check: bool = True, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=check, **kw)  # type: ignore[call-overload]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    sh("bash", str(REPO / "scripts" / "build-wheel.sh"), str(out))
    (found,) = out.glob("kvmtune-*-manylinux*.whl")
    return found


def _sweep_dead_runs() -> None:
    """Remove the namespaces (and their processes) of an earlier run of this test whose pytest is gone.

    Their names carry the pytest's pid, so a concurrent run's namespaces, whose pytest lives, are kept."""
    netns = Path("/run/netns")
    for path in netns.glob("ktfleet-*") if netns.is_dir() else ():
        owner = path.name.split("-")[1]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            for pid in sh("ip", "netns", "pids", path.name, check=False).stdout.split():
                os.kill(int(pid), signal.SIGKILL)
            sh("ip", "netns", "del", path.name, check=False)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    for tool in ("ansible-playbook", "sshd", "ssh-keygen"):
        if shutil.which(tool) is None and not Path(f"/usr/sbin/{tool}").exists():
            pytest.fail(f"{tool} is not installed (scripts/install.sh installs ansible-core and openssh-server)")
    tmp = tmp_path_factory.mktemp("fleet")
    # not "kvmtune-…": kvmtune removes namespaces of that prefix whose owner it cannot find (leftovers);
    # the pid lets the next run remove what a pytest killed with -9 left behind
    _sweep_dead_runs()
    tag = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
    sw, ctl = f"ktfleet-{tag}-sw", f"ktfleet-{tag}-ctl"
    hosts = {name: f"ktfleet-{tag}-{name}" for name in ROOTS}
    made: list[str] = []
    sshds: list[subprocess.Popen[bytes]] = []
    try:
        for ns in (sw, ctl, *hosts.values()):
            sh("ip", "netns", "add", ns)
            made.append(ns)
        sh("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", sw, "addr", "add", "198.18.0.1/24", "dev", "br0")  # answers, but runs no sshd
        sh("ip", "-n", sw, "link", "set", "br0", "up")
        for i, ns in enumerate((ctl, *hosts.values())):
            port = f"p{i}"
            sh("ip", "-n", sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
            sh("ip", "-n", sw, "link", "set", port, "master", "br0", "up")
            sh("ip", "-n", ns, "addr", "add", f"198.18.0.{10 + i}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        key = tmp / "id"
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key))
        Path("/run/sshd").mkdir(exist_ok=True)
        for i, (name, ns) in enumerate(hosts.items(), start=1):
            hostkey = tmp / f"{name}_host"
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(hostkey))
            cfg = tmp / f"{name}.sshd"
            cfg.write_text(f"ListenAddress 198.18.0.{10 + i}\nHostKey {hostkey}\nPidFile {tmp}/{name}.pid\n"
                           f"AuthorizedKeysFile {key}.pub\nPermitRootLogin prohibit-password\nStrictModes no\n"
                           "UsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                           "Subsystem sftp /usr/lib/openssh/sftp-server\n")
            # `ip netns exec` execs sshd in place, so the parent-death signal reaches sshd itself:
            # a pytest killed with -9 leaves no sshd behind
            sshds.append(subprocess.Popen(["ip", "netns", "exec", ns, "/usr/sbin/sshd", "-D", "-e", "-f", str(cfg)],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                          preexec_fn=die_with_parent_preexec()))
        yield {"tmp": tmp, "ctl": ctl, "key": key, "hosts": hosts}
    finally:
        for p in sshds:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
        for ns in made:
            for pid in sh("ip", "netns", "pids", ns, check=False).stdout.split():
                os.kill(int(pid), signal.SIGKILL)
            sh("ip", "netns", "del", ns, check=False)


def inventory(fleet: dict[str, object], wheel: Path, roots: dict[str, Path], out: Path) -> Path:
    tmp = fleet["tmp"]
    assert isinstance(tmp, Path)
    lines = ["[kvmtune_hosts]"]
    for i, name in enumerate(ROOTS, start=1):
        (tmp / name).mkdir(exist_ok=True)
        (tmp / name / "prom").mkdir(exist_ok=True)
        lines.append(f"{name} ansible_host=198.18.0.{10 + i} kvmtune_prefix={tmp}/{name}/venv "
                     f"kvmtune_textfile_dir={tmp}/{name}/prom "
                     f"kvmtune_audit_args='--root {roots[name]}'")  # as the role's default: the host and its guests
    lines.append("nopython ansible_host=198.18.0.11 ansible_python_interpreter=/nonexistent/python3")
    lines.append(f"badroot ansible_host=198.18.0.12 kvmtune_prefix={tmp}/badroot/venv "
                 f"kvmtune_audit_args='--host --root {tmp}/no-such-root'")
    lines.append("down ansible_host=198.18.0.1")
    lines += ["", "[all:vars]", "ansible_user=root", f"ansible_ssh_private_key_file={fleet['key']}",
              "ansible_ssh_common_args='-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null "
              "-o ConnectTimeout=5'", f"kvmtune_wheel={wheel}", f"kvmtune_collect_dir={out}"]
    inv = tmp / "inventory.ini"
    inv.write_text("\n".join(lines) + "\n")
    return inv


def playbook(fleet: dict[str, object], inv: Path, name: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "contrib" / "ansible" / "ansible.cfg"),
           "ANSIBLE_LOCAL_TEMP": str(Path(str(fleet["tmp"])) / "ansible-local")}
    return subprocess.run(["ip", "netns", "exec", str(fleet["ctl"]), "ansible-playbook", "-i", str(inv),
                           str(REPO / "contrib" / "ansible" / name), *extra],
                          capture_output=True, text=True, env=env, timeout=600)


def test_fleet_audit_report_and_prometheus(fleet: dict[str, object], wheel: Path, tmp_path: Path) -> None:
    roots = {}
    for name, fixture in ROOTS.items():
        roots[name] = tmp_path / "roots" / name
        shutil.copytree(FIXTURES / fixture, roots[name], symlinks=True)
    out = tmp_path / "collected"
    inv = inventory(fleet, wheel, roots, out)
    started = time.monotonic()
    run = playbook(fleet, inv, "site.yml")
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert time.monotonic() - started < 600
    files = sorted(p.name for p in out.glob("*.json"))
    assert files == ["badroot.json", "down.json", "h1.json", "h2.json", "h3.json", "nopython.json"]
    status = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    assert status["down"]["problem"].startswith("unreachable"), status["down"]
    assert status["nopython"]["problem"] == "no Python at /nonexistent/python3"
    assert status["badroot"]["problem"].startswith("kvmtune exited 2") and "no-such-root" in status["badroot"]["problem"]
    counts = {name: len(status[name]["findings"]) for name in ROOTS}
    assert len(set(counts.values())) > 1, counts  # each host audited its own tree
    assert {status[name]["host"] for name in ROOTS} == set(ROOTS)
    # --staged: each host's journals read (none on these hosts: nothing kvmtune fixed is waiting)
    assert {name: status[name]["staged"]["changes"] for name in ROOTS} == dict.fromkeys(ROOTS, 0)
    # each host's textfile passes promtool
    for name in ROOTS:
        prom = (Path(str(fleet["tmp"])) / name / "prom" / "kvmtune.prom").read_text()
        assert f'host="{name}"' in prom
        check = sh("promtool", "check", "metrics", input=prom, check=False)
        assert check.returncode == 0, check.stdout + check.stderr
    # the merged report, twice: the second collection says what changed
    db = tmp_path / "results.db"
    kvmtune = str(REPO / ".venv" / "bin" / "kvmtune")
    first = sh(kvmtune, "report", str(out), "--db", str(db), "--html", str(tmp_path / "fleet.html"))
    assert "fleet: 6 host(s), 3 audited, 3 failed; stored as collection 1" in first.stdout
    assert f"collection {str(inv)!r}, scope both" in first.stdout  # named after the inventory, host and guests
    assert "FAILED down: unreachable" in first.stdout and "FAILED nopython: no Python" in first.stdout
    worst = [line.split()[0] for line in first.stdout.split("Worst hosts")[1].splitlines()[2:5]]
    assert sorted(worst) == sorted(ROOTS) and worst[0] == max(ROOTS, key=lambda n: _score(status[n]))
    assert "3 host(s) with none staged" in first.stdout
    html = (tmp_path / "fleet.html").read_text()
    assert "<svg" in html and "Findings per rule across hosts" in html
    h1 = json.loads((out / "h1.json").read_text())
    dropped = h1["findings"].pop(0)
    (out / "h1.json").write_text(json.dumps(h1))
    second = sh(kvmtune, "report", str(out), "--db", str(db))
    assert "Since collection 1" in second.stdout and "0 new, 1 resolved, 0 not audited this time" in second.stdout
    assert f"- h1 {dropped['rule']}" in second.stdout
    assert "Trend (findings per collection): #1:" in second.stdout


def _score(doc: dict[str, object]) -> int:
    weights = {"critical": 100, "high": 10, "medium": 3, "low": 1, "info": 0}
    findings = doc["findings"]
    assert isinstance(findings, list)
    return sum(weights[f["severity"]] for f in findings)


def test_fix_play_check_mode_lists_changes_and_apply_records_the_journal(
    fleet: dict[str, object], wheel: Path, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    shutil.copytree(FIXTURES / "rhel6-old", root, symlinks=True)
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    out = tmp_path / "collected"
    inv = inventory(fleet, wheel, dict.fromkeys(ROOTS, root), out)
    # install first (site.yml), then plan in check mode: nothing in the tree changes
    assert playbook(fleet, inv, "site.yml", "--limit", "h1").returncode == 0
    fix_args = f"kvmtune_fix_args='--host --root {root} --profile virtual-host'"
    check = playbook(fleet, inv, "fix.yml", "--limit", "h1", "--check", "-e", fix_args)
    assert check.returncode == 0, check.stdout[-3000:]
    assert "90-kvmtune.conf" in check.stdout
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
    apply = playbook(fleet, inv, "fix.yml", "--limit", "h1", "-e", fix_args)
    assert apply.returncode == 0, apply.stdout[-3000:]
    journal = (out / "h1.journal.txt").read_text()
    assert "journal" in journal.lower()
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} != before
