"""Issue 47's "Done when" for ``kvmtune canary run --quick`` on this host (real qemu-storage-daemon, fio, netload in
kvmtune's namespaces): at most 30 s on an idle host, nothing left behind (also after SIGKILL), a baseline of three runs,
a run in a cgroup limited to 25 % of one CPU judged a regression that names the quota and the changed package of a dpkg
status fixture, and a run after the limit is removed judged without a regression.

The shared test host has other work on it: the runs here pass ``--busy-load 100`` so that the others' load average does
not turn the canary's judgement into "not judged: host busy" (tests/canary/test_judge.py covers that rule)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvmtune.errors import KvmtuneError
from kvmtune.lab.net.netload import find_netload
from kvmtune.runner import Runner

pytestmark = pytest.mark.integration

KVMTUNE = [sys.executable, "-m", "kvmtune"]
STANZA = "Package: {name}\nStatus: install ok installed\nArchitecture: amd64\nVersion: {version}\n"


def _netload() -> str:
    try:
        return find_netload(None, Runner())
    except KvmtuneError:
        pytest.skip("netload is not built (make -C netload)")


@pytest.fixture
def canary_env(tmp_path: Path) -> Iterator[dict[str, Path]]:
    if os.geteuid() != 0:
        pytest.skip("the datapath tier makes network namespaces: needs root")
    for tool in ("qemu-storage-daemon", "fio"):
        if Runner().which(tool) is None:
            pytest.skip(f"{tool} not installed")
    paths = {"work": tmp_path / "work", "dir": tmp_path / "images", "db": tmp_path / "canary.db",
             "lock": tmp_path / "bench.lock"}
    paths["dir"].mkdir()
    yield paths
    # nothing of ours is left, whatever the test did
    assert _leftovers(paths) == []


def _argv(paths: dict[str, Path], *extra: str) -> list[str]:
    return [*KVMTUNE, "canary", "run", "--quick", "--workdir", str(paths["work"]), "--dir", str(paths["dir"]),
            "--db", str(paths["db"]), "--netload", _netload(), "--format", "json", *extra]


def _env(paths: dict[str, Path]) -> dict[str, str]:
    return {**os.environ, "KVMTUNE_BENCH_LOCK": str(paths["lock"])}


def _namespaces() -> list[str]:
    res = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    return [line.split()[0] for line in res.stdout.splitlines() if line.startswith("kvmtune-")]


def _mentioning(text: str) -> list[str]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                raw = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if text.encode() in raw:
                out.append(raw.replace(b"\0", b" ").decode(errors="replace")[:120])
    return out


def _leftovers(paths: dict[str, Path]) -> list[str]:
    found = [f"scratch {p}" for p in paths["dir"].glob("scratch-*")] + [f"scratch {p}" for p in paths["work"].glob("scratch-*")]
    found += [f"process {p}" for p in _mentioning(str(paths["dir"])) + _mentioning(str(paths["work"]))]
    netdir = paths["work"] / "net"
    if netdir.is_dir():
        found += [f"run dir {p}" for p in netdir.iterdir()]
    return found  # a run's namespaces are kvmtune-<run>-<role>, <run> its directory in net/ (checked by name below)


def _run(paths: dict[str, Path], *extra: str, prefix: list[str] | None = None) -> tuple[int, dict, float]:
    t0 = time.monotonic()
    res = subprocess.run([*(prefix or []), *_argv(paths, *extra)], capture_output=True, text=True, timeout=300,
                         env=_env(paths), check=False)
    took = time.monotonic() - t0
    assert res.returncode in (0, 1), res.stderr[-2000:]
    return res.returncode, json.loads(res.stdout), took


def test_quick_run_is_short_and_leaves_nothing(canary_env: dict[str, Path]) -> None:
    load = float(Path("/proc/loadavg").read_text().split()[0])
    code, doc, took = _run(canary_env)
    assert code == 0 and doc["verdict"] == "baseline"
    measured = [m for m in doc["metrics"] if m["value"] is not None]
    assert {m["name"] for m in measured} == {
        "block.randread4k.qd32.iops", "block.randwrite4k.qd1.flush.p50", "block.randwrite4k.qd1.flush.p99",
        "datapath.rr.p50", "datapath.stream"}
    assert all(len(m["rounds"]) == 3 and m["value"] > 0 for m in measured)
    # vhost-net is not left out unsaid: on a host without /dev/vhost-net the run says so
    vhost = next(m for m in doc["metrics"] if m["name"] == "datapath.vhost.rr.p50")
    assert vhost["value"] is None and vhost["verdict"] == "not-judged" and vhost["note"].startswith("not measured: ")
    if not Path("/dev/vhost-net").exists():
        assert "no /dev/vhost-net" in vhost["note"]
    assert doc["environment"]["not_measured"]["datapath.vhost.rr.p50"] == vhost["note"].removeprefix("not measured: ")
    assert doc["environment"]["scratch_fs"]["fstype"]
    if load < 1.0:  # the budget is for an idle 2-core host; a loaded shared host gets 1.5 times it
        assert took <= 30, took
    else:
        assert took <= 45, (took, load)
    assert _leftovers(canary_env) == []


def _wait_for(pred: object, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("point", ["block", "datapath", "probe"])
def test_sigkill_leaves_nothing_after_the_next_start(canary_env: dict[str, Path], point: str) -> None:
    argv = _argv(canary_env)
    if point == "probe":  # the full suite's probe guest: its QEMU dies with kvmtune, the next start sweeps its directory
        if Runner().which("qemu-system-x86_64") is None or not Path("/usr/sbin/qemu-ga").is_file():
            pytest.skip("QEMU or qemu-guest-agent not installed")
        argv = [a for a in argv if a != "--quick"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(canary_env))
    try:
        net = canary_env["work"] / "net"
        if point == "block":
            hit = _wait_for(lambda: any(canary_env["dir"].glob("scratch-*/nbd.sock")), 60)
        elif point == "probe":
            hit = _wait_for(lambda: any(canary_env["work"].glob("scratch-probe-*/qga.sock")), 120)
        else:
            hit = _wait_for(lambda: net.is_dir() and any(n.startswith("kvmtune-") for n in _namespaces()
                                                         if any(n.startswith(f"kvmtune-{r.name}-") for r in net.iterdir())),
                            90)
        assert hit, f"the canary never reached its {point} tier"
        runs = [r.name for r in net.iterdir()] if net.is_dir() else []
        time.sleep(0.3)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # its children die with it (no process names the work or scratch directory within 2 s)
    assert _wait_for(lambda: not _mentioning(str(canary_env["dir"])) and not _mentioning(str(canary_env["work"])), 5)
    if point == "datapath":
        assert runs and any(n.startswith(f"kvmtune-{runs[0]}-") for n in _namespaces())  # a killed run's are left ...
    code, _doc, _took = _run(canary_env)  # ... and the next start sweeps what the killed run left
    assert code == 0
    assert _leftovers(canary_env) == []
    assert [n for n in _namespaces() if any(n.startswith(f"kvmtune-{r}-") for r in runs)] == []


def _cgroup_quota(tmp: Path) -> tuple[Path, str]:
    """A cgroup of the test's own limited to 25 % of one CPU: v2 ``cpu.max`` or v1 ``cpu.cfs_quota_us``."""
    name = f"kvmtune-canary-test-{os.getpid()}"
    if Path("/sys/fs/cgroup/cgroup.controllers").exists():
        if "cpu" not in Path("/sys/fs/cgroup/cgroup.subtree_control").read_text().split():
            pytest.skip("cgroup v2 without the cpu controller enabled for children")
        cg = Path("/sys/fs/cgroup") / name
        cg.mkdir()
        (cg / "cpu.max").write_text("25000 100000\n")
        return cg, "cpu.max"
    base = Path("/sys/fs/cgroup/cpu")
    if not base.is_dir():
        base = Path("/sys/fs/cgroup/cpu,cpuacct")
    if not base.is_dir():
        pytest.skip("no cgroup cpu controller mounted")
    cg = base / name
    cg.mkdir()
    (cg / "cpu.cfs_period_us").write_text("100000\n")
    (cg / "cpu.cfs_quota_us").write_text("25000\n")
    return cg, "cpu.cfs_quota_us"


def _remove_cgroup(cg: Path) -> None:
    deadline = time.monotonic() + 10
    while cg.exists():
        try:
            cg.rmdir()
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _packages(tmp: Path, name: str, fio: str) -> Path:
    root = tmp / name
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").write_text(
        STANZA.format(name="fio", version=fio) + "\n" + STANZA.format(name="qemu-system-x86", version="1:7.2+dfsg-7"))
    return root


def test_a_quota_is_a_regression_that_names_it_and_the_changed_package(canary_env: dict[str, Path],
                                                                        tmp_path: Path) -> None:
    before, after = _packages(tmp_path, "pkgs-a", "3.33-3"), _packages(tmp_path, "pkgs-b", "3.33-4")
    common = ("--busy-load", "100")
    for _ in range(3):
        code, doc, _took = _run(canary_env, *common, "--packages-root", str(before))
        assert code == 0 and doc["verdict"] == "baseline"
    cg, knob = _cgroup_quota(tmp_path)
    try:
        code, doc, _took = _run(canary_env, *common, "--packages-root", str(after),
                                prefix=["sh", "-c", f'echo $$ > {cg}/cgroup.procs && exec "$@"', "sh"])
    finally:
        _remove_cgroup(cg)
    verdicts = {m["name"]: m["verdict"] for m in doc["metrics"]}
    assert code == 1 and doc["verdict"] == "regression", (verdicts, doc["busy"])
    assert "regression" in verdicts.values()
    whats = {c["what"]: c for c in doc["changed"]}
    assert any(knob in w for w in whats), doc["changed"]
    quota = next(c for w, c in whats.items() if knob in w)
    assert "25000" in quota["after"]
    assert whats["fio"] == {"what": "fio", "before": "3.33-3", "after": "3.33-4"}
    assert doc["environment"]["packages"]["fio"] == "3.33-4"
    # the quota gone, the regression goes too. On a CI host whose other lane runs the unit tiers beside this, one
    # run can still land in a busy minute and settle a slowdown (block and datapath at 0.6-0.8 of the baseline,
    # seen twice in full runs); a regression the quota left behind would stay in every run, so up to three are taken
    tries: list[object] = []
    for _ in range(3):
        code, doc, _took = _run(canary_env, *common, "--packages-root", str(after))
        tries.append([(m["name"], m["verdict"], m["interval"]) for m in doc["metrics"]])
        if code == 0:
            break
    assert code == 0, tries
    assert all(m["verdict"] != "regression" for m in doc["metrics"])


def test_the_full_suite_boots_the_probe_guest_labelled_with_its_accelerator(canary_env: dict[str, Path]) -> None:
    """The full suite (no --quick): the probe guest's boot to its agent, labelled with the accelerator QEMU really ran
    (TCG on a host where KVM does not boot it: emulation, never compared with KVM); within the issue's 90 s on an
    idle 2-core host; nothing left behind (no QEMU, no scratch directory)."""
    for tool in ("qemu-system-x86_64",):
        if Runner().which(tool) is None:
            pytest.skip(f"{tool} not installed")
    if not Path("/usr/sbin/qemu-ga").is_file():
        pytest.skip("qemu-guest-agent not installed")
    load = float(Path("/proc/loadavg").read_text().split()[0])
    argv = [a for a in _argv(canary_env, "--busy-load", "100") if a != "--quick"]
    t0 = time.monotonic()
    res = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=_env(canary_env), check=False)
    took = time.monotonic() - t0
    assert res.returncode == 0, res.stderr[-2000:]
    doc = json.loads(res.stdout)
    probe = next(m for m in doc["metrics"] if m["name"] == "probe.boot_to_agent")
    assert probe["labels"]["accel"] in ("kvm", "tcg") and len(probe["rounds"]) == 3
    assert all(0 < x < 60 for x in probe["rounds"])
    if Path("/sys/module/kvm_pvm").is_dir():  # a stock kernel does not boot under PVM: the probe guest ran under TCG
        assert probe["labels"] == {"accel": "tcg"}
    print(f"full canary suite: {took:.1f} s, load average {load:.2f} before, probe boot {probe['value']:.2f} s "
          f"({probe['labels']})")
    if load < 1.0:
        assert took <= 90, took
    else:
        assert took <= 135, (took, load)
    assert _leftovers(canary_env) == []
