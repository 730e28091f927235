"""``kvmtune why`` on fixture /proc trees: thread owners, who ran instead, causes, output, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kvmtune.cli.why import render_text
from kvmtune.host.root import HostRoot
from kvmtune.live.sources import vcpu_index
from kvmtune.live.threads import Owners, parse_thread_stat
from kvmtune.live.why.core import Target, WhyReport
from kvmtune.live.why.cpu import cpu_lines
from kvmtune.live.why.tracker import Tracker


def write(root: Path, path: str, text: str) -> None:
    p = root / path.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def stat_line(tid: int, comm: str, ticks: int, cpu: int, kernel: bool = False) -> str:
    flags = 0x00200000 if kernel else 0x400000
    fields = ["S", "1", "1", "1", "0", "-1", str(flags), "0", "0", "0", "0", str(ticks), "0"]
    fields += ["0"] * 23 + [str(cpu)] + ["0"] * 13
    return f"{tid} ({comm}) " + " ".join(fields) + "\n"


def qemu(root: Path, pid: int, name: str) -> None:
    (root / "proc" / str(pid)).mkdir(parents=True, exist_ok=True)
    os.symlink("/usr/bin/qemu-system-x86_64", root / "proc" / str(pid) / "exe")
    write(root, f"/proc/{pid}/cmdline", f"qemu-system-x86_64\0-name\0guest={name},debug-threads=on\0")


def thread(root: Path, pid: int, tid: int, comm: str, ticks: int, cpu: int, *, delay_ns: int = 0,
           allowed: str = "0", kernel: bool = False) -> None:
    base = f"/proc/{pid}/task/{tid}"
    write(root, f"{base}/stat", stat_line(tid, comm, ticks, cpu, kernel))
    write(root, f"{base}/comm", comm + "\n")
    write(root, f"{base}/schedstat", f"{ticks * 10_000_000} {delay_ns} 5\n")
    write(root, f"{base}/status", f"Name:\t{comm}\nCpus_allowed_list:\t{allowed}\n")


def test_vcpu_index_counts_single_threaded_tcg_as_vcpu_0() -> None:
    assert vcpu_index("ALL CPUs/TCG\n") == 0 and vcpu_index("CPU 2/KVM") == 2 and vcpu_index("IO iothread0") is None


def test_thread_stat_and_owners(tmp_path: Path) -> None:
    qemu(tmp_path, 100, "ca")
    thread(tmp_path, 100, 101, "CPU 0/TCG", 5, 0)
    thread(tmp_path, 100, 102, "IO iothread0", 5, 0)
    thread(tmp_path, 300, 300, "vhost-100", 5, 0, kernel=True)
    thread(tmp_path, 400, 400, "kworker/0:1-events", 5, 0, kernel=True)
    thread(tmp_path, 500, 500, "stress (ng)", 5, 1)
    owners = Owners(HostRoot(str(tmp_path)))
    got = {}
    for pid, tid in ((100, 101), (100, 102), (300, 300), (400, 400), (500, 500)):
        st = parse_thread_stat(pid, (tmp_path / f"proc/{pid}/task/{tid}/stat").read_text())
        assert st is not None and st.tid == tid
        got[tid] = owners.owner(st).label()
    assert got == {101: "ca (pid 100, vCPU 0)",
                   102: "ca's QEMU threads (pid 100: emulator, I/O threads, workers)",
                   300: "ca's vhost worker (for pid 100)", 400: "kernel thread kworker",
                   500: "host process stress (ng) (pid 500)"}
    assert parse_thread_stat(1, "garbage") is None


def crowd(root: Path, step: int) -> None:
    """ca's vCPU and cb's vCPU share CPU 0, a host process runs on CPU 1; tick ``step`` (0 or 1)."""
    write(root, "/proc/stat", "cpu  1 0 0 1 0 0 0 0 0 0\ncpu0 1 0 0 1 0 0 0 0 0 0\ncpu1 1 0 0 1 0 0 0 0 0 0\n")
    if step == 0:
        qemu(root, 100, "ca")
        qemu(root, 200, "cb")
    thread(root, 100, 101, "CPU 0/KVM", 10 + 50 * step, 0, delay_ns=500_000_000 * step)
    thread(root, 200, 201, "CPU 0/KVM", 10 + 50 * step, 0)
    thread(root, 900, 900, "make", 10 + 90 * step, 1, allowed="0-1")


def crowded_second(tmp_path: Path) -> tuple[Target, Tracker]:
    """Guest "ca" (pid 100) and make on the same CPU, sampled twice, one second apart whatever the machine took."""
    host = HostRoot(str(tmp_path))
    crowd(tmp_path, 0)
    target = Target("ca", "pid 100", "pid:100:ca", 100, None, False)
    tr = Tracker(host, target, {0: 101})
    tr.tick()
    crowd(tmp_path, 1)
    tr.tick()
    tr.t1 = tr.t0 + 1.0
    return target, tr


def test_the_wait_is_put_on_the_guest_that_ran_on_the_same_cpu(tmp_path: Path) -> None:
    target, tr = crowded_second(tmp_path)
    report = WhyReport(target, 1.0, "kvm")
    cpu_lines(tr, report, online=2, pinned_in_definition=False)
    (line,) = report.lines
    assert line.what == "vCPU 0 waited 50% of the interval for a host CPU (ran 50%): waits for cb"
    assert line.evidence == "100% of the wait was on CPU 0, which cb (pid 200, vCPU 0) used for 50% of the interval"
    assert line.cause == "pinning overlap: both are confined to host CPU(s) {0}" and line.rule is None
    assert report.vcpus[0]["thieves"][0]["name"] == "cb"
    assert all(t["name"] != "make" for t in report.vcpus[0]["thieves"])  # it ran on CPU 1, where ca never waited
    report2 = WhyReport(target, 1.0, "kvm")
    cpu_lines(tr, report2, online=2, pinned_in_definition=True)
    assert report2.lines[0].rule == "KVM-CPU-020"  # the same overlap, stated in a libvirt definition
    report3 = WhyReport(target, 1.0, "kvm")  # the rules top names for the signal do not hide the specific cause
    cpu_lines(tr, report3, online=2, pinned_in_definition=False, signal_rules=(["KVM-CPU-003"], ""))
    assert report3.lines[0].rule is None
    assert report3.lines[0].no_rule == ("no rule covers affinity set outside libvirt (taskset, a cgroup cpuset): the "
                                        "audit cannot see it in a definition; top names KVM-CPU-003 for this signal "
                                        "(the audit's findings in its topics)")


def test_text_says_nothing_explains_it_and_labels_emulation() -> None:
    report = WhyReport(Target("quiet", "pid 7", "pid:7:quiet", 7, None, False), 10.0, "tcg", notes=["a note"])
    text = render_text(report)
    assert text.splitlines()[:3] == [
        "why quiet (pid 7): sampled 10.0 s",
        "EMULATION: this guest runs under TCG, not KVM: every number below is an emulation number",
        "Nothing here explains it: no signal passed its threshold (vCPU wait under 5 %, no throttling, no disk "
        "latency, drops or memory pressure past their thresholds)"]
    assert json.loads(json.dumps(report.as_json()))["explained"] is False


def test_an_unknown_guest_is_one_line_and_exit_2(tmp_path: Path) -> None:
    write(tmp_path, "/proc/stat", "cpu  1 0 0 1 0 0 0 0 0 0\n")
    done = subprocess.run([sys.executable, "-m", "kvmtune", "why", "no-such-guest", "--no-libvirt", "--seconds", "1",
                           "--root", str(tmp_path)], capture_output=True, text=True, env=os.environ, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == "kvmtune: no-such-guest: no running guest has this name, UUID or pid (running: none)\n"


def test_guest_run_refuses_a_name_or_pin_that_could_carry_other_options() -> None:
    for args, message in ((["--name", "x,debug-threads=off"], "--name 'x,debug-threads=off': letters, digits"),
                          (["--pin", "0 -S"], "--pin '0 -S': a CPU list")):
        done = subprocess.run([sys.executable, "-m", "kvmtune", "guest", "run", "--load", "cpu", *args],
                              capture_output=True, text=True, env=os.environ, timeout=60)
        assert done.returncode == 2 and done.stdout == "", done
        assert done.stderr.startswith(f"kvmtune: error: {message}") and done.stderr.count("\n") == 1, done.stderr


def unnamed(root: Path, step: int) -> None:
    """qx runs without debug-threads: its threads are unnamed; its busiest thread waits twice as long as it runs."""
    write(root, "/proc/stat", "cpu  1 0 0 1 0 0 0 0 0 0\ncpu0 1 0 0 1 0 0 0 0 0 0\n")
    if step == 0:
        (root / "proc/300").mkdir(parents=True, exist_ok=True)
        os.symlink("/usr/bin/qemu-system-x86_64", root / "proc/300/exe")
        write(root, "/proc/300/cmdline", "qemu-system-x86_64\0-name\0qx\0")
    thread(root, 300, 300, "qemu-system-x86", 10 + 5 * step, 0, delay_ns=10_000_000 * step)
    thread(root, 300, 301, "qemu-system-x86", 10 + 30 * step, 0, delay_ns=600_000_000 * step)
    thread(root, 300, 302, "qemu-system-x86", 10 + 2 * step, 0)


def test_without_thread_names_the_vcpu_wait_is_not_measured_and_the_busiest_threads_bound_it(tmp_path: Path) -> None:
    """Issue 46 item 3: never "under 5 %" for a wait that could not be measured; the bound says what it is."""
    from kvmtune.live.why.cpu import unnamed_cpu_line

    host = HostRoot(str(tmp_path))
    unnamed(tmp_path, 0)
    target = Target("qx", "pid 300", "pid:300:qx", 300, None, False)
    tr = Tracker(host, target, {})
    tr.tick()
    unnamed(tmp_path, 1)
    tr.tick()
    tr.t1 = tr.t0 + 1.0
    report = WhyReport(target, 1.0, "kvm")
    cpu_lines(tr, report, online=1, pinned_in_definition=False)
    unnamed_cpu_line(tr, report, (["KVM-CPU-003", "KVM-HST-001"], "the fix"))
    assert "bounds it from above" in report.not_measured["vcpu-delay"]
    bound = report.vcpu_wait_bound
    assert bound is not None and bound["bound"] == 0.6 and bound["busiest"][0] == {"tid": 301, "busy": 0.3, "delay": 0.6}
    (line,) = report.lines
    assert line.share == 0.6 and line.what.startswith("vCPU wait not measured (unnamed threads); upper bound")
    assert "thread 301 ran 30% and waited 60% of the interval" in line.evidence
    assert line.rule == "KVM-CPU-003" and line.fix == "the fix"  # what top names for the same signal
    text = render_text(report)
    assert "under 5 %" not in text and "not measured: vcpu-delay: its vCPU threads are unnamed" in text
    assert json.loads(json.dumps(report.as_json()))["not_measured"]["vcpu-delay"]


def test_nothing_explains_it_never_claims_a_wait_it_did_not_measure() -> None:
    report = WhyReport(Target("quiet", "pid 7", "pid:7:quiet", 7, None, False), 10.0, "kvm",
                       not_measured={"vcpu-delay": "its vCPU threads are unnamed"})
    line = render_text(report).splitlines()[1]
    assert line.startswith("Nothing here explains it: no signal passed its threshold (no throttling")
    assert "under 5 %" not in line and line.endswith("; not measured: vcpu-delay")


def test_a_wait_whose_live_cause_names_no_rule_takes_the_rules_top_names_for_the_signal(tmp_path: Path) -> None:
    """top and why judge the vcpu-delay signal from the same Signal row: a host process competing for the guest's CPUs
    has no rule of its own, so why names the rules top names (Diagnoser.explain), not "no rule covers"."""
    host = HostRoot(str(tmp_path))
    write(tmp_path, "/proc/stat", "cpu  1 0 0 1 0 0 0 0 0 0\ncpu0 1 0 0 1 0 0 0 0 0 0\n")
    qemu(tmp_path, 100, "ca")
    for step in (0, 1):
        thread(tmp_path, 100, 101, "CPU 0/KVM", 10 + 40 * step, 0, delay_ns=500_000_000 * step, allowed="0-1")
        thread(tmp_path, 900, 900, "stress", 10 + 50 * step, 0, allowed="0-1")
        if step == 0:
            target = Target("ca", "pid 100", "pid:100:ca", 100, None, False)
            tr = Tracker(host, target, {0: 101})
        tr.tick()
    tr.t1 = tr.t0 + 1.0
    alone = WhyReport(target, 1.0, "kvm")
    cpu_lines(tr, alone, online=2, pinned_in_definition=False)
    assert alone.lines[0].rule is None and alone.lines[0].no_rule.startswith("no rule covers a host process")
    judged = WhyReport(target, 1.0, "kvm")
    cpu_lines(tr, judged, online=2, pinned_in_definition=False, signal_rules=(["KVM-CPU-003", "KVM-HST-001"], ""))
    assert judged.lines[0].rule == "KVM-CPU-003" and judged.lines[0].no_rule == ""
    assert judged.lines[0].cause.endswith("the audit's findings for this signal: KVM-CPU-003, KVM-HST-001")


def test_why_judges_the_vcpu_wait_with_the_thresholds_top_uses(tmp_path: Path) -> None:
    """The settings file's run_delay_warn reaches why as it reaches top and sample: a 50 % wait under a 60 % warn level
    is no line; why reads the settings file (a bad one is refused before sampling)."""
    target, tr = crowded_second(tmp_path)
    lenient = WhyReport(target, 1.0, "kvm")
    cpu_lines(tr, lenient, online=2, pinned_in_definition=False, warn=0.6)
    assert lenient.lines == [] and lenient.vcpus[0]["delay"] == 0.5
    bad = tmp_path / "kvmtune.toml"
    bad.write_text("[thresholds]\nrun_delay_warn = 7\n")
    bad.chmod(0o644)
    done = subprocess.run([sys.executable, "-m", "kvmtune", "why", "ca", "--config", str(bad), "--no-libvirt",
                           "--root", str(tmp_path)], capture_output=True, text=True, env=os.environ, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith(f"kvmtune: {bad}:2: thresholds.run_delay_warn")
