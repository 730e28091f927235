"""Live sampling on fixture /proc trees: counters, rates, diagnosis, output formats and bad input."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kvmtune import cli
from kvmtune.host.root import HostRoot
from kvmtune.live.diagnose import NO_RULE, Diagnoser
from kvmtune.live.model import HostSample, Snapshot
from kvmtune.live.output import prometheus_text, rates_json, render_table
from kvmtune.live.signals import HostRates, Rates, rates
from kvmtune.live.sources import (
    ProcQemuSource,
    Sampler,
    guest_from_libvirt_record,
    parse_pressure,
    parse_schedstat,
    vcpu_index,
)

STAT = "cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 1 0 0 1 0 0 0 0 0 0\ncpu1 1 0 0 1 0 0 0 0 0 0\n"


def write(root: Path, path: str, text: str) -> None:
    p = root / path.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def make_host(root: Path, busy: int = 100, idle: int = 900) -> None:
    write(root, "/proc/stat", STAT.format(busy=busy, idle=idle))
    write(root, "/sys/devices/system/cpu/online", "0-1\n")
    write(root, "/proc/pressure/memory", "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"
          "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    write(root, "/proc/vmstat", "pswpin 10\npswpout 20\n")
    write(root, "/proc/mounts", "/dev/vda1 / ext4 rw 0 0\n")
    for dev in ("/dev/kvm", "/dev/vhost-net", "/dev/net/tun"):
        write(root, dev, "")


def make_qemu(root: Path, pid: int, name: str, vcpus: dict[int, tuple[int, int, str]], smp: int = 1,
              exe: str = "/usr/bin/qemu-system-x86_64") -> None:
    """A QEMU process: exe link, command line, and one thread per vCPU (run ns, delay ns, allowed CPUs)."""
    proc = root / "proc" / str(pid)
    proc.mkdir(parents=True, exist_ok=True)
    if (proc / "exe").is_symlink():
        (proc / "exe").unlink()
    os.symlink(exe, proc / "exe")
    argv = ["qemu-system-x86_64", "-name", f"guest={name},debug-threads=on", "-m", "1024", "-smp", str(smp),
            "-accel", "kvm"]
    (proc / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    write(root, f"/proc/{pid}/status", "Name:\tqemu\nUid:\t0\t0\t0\t0\n")
    write(root, f"/proc/{pid}/task/{pid}/comm", "qemu-system-x86\n")
    for index, (run_ns, delay_ns, allowed) in vcpus.items():
        tid = pid + 1 + index
        write(root, f"/proc/{pid}/task/{tid}/comm", f"CPU {index}/KVM\n")
        write(root, f"/proc/{pid}/task/{tid}/schedstat", f"{run_ns} {delay_ns} 42\n")
        write(root, f"/proc/{pid}/task/{tid}/status", f"Name:\tCPU {index}/KVM\nCpus_allowed_list:\t{allowed}\n")


def test_parsers() -> None:
    assert parse_schedstat("123 456 7\n") == (123, 456)
    assert parse_schedstat("garbage") is None
    assert vcpu_index("CPU 3/KVM\n") == 3 and vcpu_index("CPU 0/TCG") == 0
    assert vcpu_index("worker") is None and vcpu_index("CPU x/KVM") is None
    p = parse_pressure("some avg10=12.50 avg60=1 avg300=0 total=5\nfull avg10=3.25 avg60=0 avg300=0 total=1\n")
    assert (p.some_avg10, p.full_avg10) == (12.5, 3.25)


def test_two_guests_confined_to_one_cpu_are_diagnosed_as_vcpu_overcommit(tmp_path: Path) -> None:
    make_host(tmp_path)
    make_qemu(tmp_path, 100, "web", {0: (0, 0, "0")})
    make_qemu(tmp_path, 200, "db", {0: (0, 0, "0")})
    make_qemu(tmp_path, 300, "idle", {0: (0, 0, "1")})
    host = HostRoot(str(tmp_path))
    sampler = Sampler(host, [])
    a = sampler.snapshot()
    # one second later: web and db each ran 0.5 s and waited 0.5 s for CPU 0; idle never waited
    make_qemu(tmp_path, 100, "web", {0: (500_000_000, 500_000_000, "0")})
    make_qemu(tmp_path, 200, "db", {0: (500_000_000, 450_000_000, "0")})
    make_qemu(tmp_path, 300, "idle", {0: (10_000_000, 0, "1")})
    write(tmp_path, "/proc/stat", STAT.format(busy=300, idle=1000))
    b = sampler.snapshot()
    b.t = a.t + 1.0
    r = rates(a, b)
    by_name = {g.name: g for g in r.guests}
    assert by_name["web"].vcpu_delay[0] == pytest.approx(0.5)
    assert by_name["db"].vcpu_delay[0] == pytest.approx(0.45)
    assert by_name["idle"].vcpu_delay[0] == 0
    assert r.host.cpu_busy == pytest.approx(200 / 300)
    assert r.host.swap_in_s == 0
    diagnoses = Diagnoser(host).diagnose(r, b)
    web = [d for d in diagnoses if d.guest == by_name["web"].key]
    assert [d.signal for d in web] == ["vcpu-delay"] and web[0].level == "critical"
    assert web[0].rules[0] == "KVM-HST-019"  # 2 vCPUs of 2 guests confined to 1 host CPU
    assert "confined to 1 host CPU(s) {0}" in web[0].fix
    assert not [d for d in diagnoses if d.guest == by_name["idle"].key]
    table = render_table(r, diagnoses, "delay", width=None)
    rows = [line for line in table.splitlines() if line.startswith(("web", "db", "idle"))]
    assert [row.split()[0] for row in rows] == ["web", "db", "idle"]  # sorted by delay
    assert "critical vcpu-delay 50% run delay, waits for db → " in rows[0] and "KVM-HST-019" in rows[0]
    sampler.close()


def test_guest_identity_is_source_plus_name(tmp_path: Path) -> None:
    make_host(tmp_path)
    make_qemu(tmp_path, 100, "web", {0: (0, 0, "0-1")})
    make_qemu(tmp_path, 200, "web", {0: (0, 0, "0-1")})
    snap = Sampler(HostRoot(str(tmp_path)), []).snapshot()
    assert sorted(snap.guests) == ["pid:100:web", "pid:200:web"]


def test_a_process_is_qemu_only_when_its_executable_is(tmp_path: Path) -> None:
    make_host(tmp_path)
    make_qemu(tmp_path, 100, "real", {0: (0, 0, "0")})
    make_qemu(tmp_path, 200, "fake", {0: (0, 0, "0")}, exe="/home/mallory/bin/sh")  # argv[0] says qemu
    assert ProcQemuSource(HostRoot(str(tmp_path))).qemu_pids() == [100]


def test_libvirt_record_and_signals(tmp_path: Path) -> None:
    a = guest_from_libvirt_record("qemu:///system", "web", {
        "vcpu.current": 2, "vcpu.maximum": 2, "vcpu.0.time": 0, "vcpu.0.delay": 0, "vcpu.1.time": 0, "vcpu.1.delay": 0,
        "block.count": 1, "block.0.name": "vda", "block.0.wr.reqs": 0, "block.0.wr.times": 0, "block.0.wr.bytes": 0,
        "net.count": 1, "net.0.name": "vnet0", "net.0.rx.pkts": 0, "net.0.tx.pkts": 0, "net.0.rx.drop": 0,
        "balloon.current": 1048576, "balloon.maximum": 2097152})
    b = guest_from_libvirt_record("qemu:///system", "web", {
        "vcpu.current": 2, "vcpu.maximum": 2, "vcpu.0.time": 10**9, "vcpu.0.delay": 2 * 10**8,
        "vcpu.1.time": 10**9, "vcpu.1.delay": 0,
        "block.count": 1, "block.0.name": "vda", "block.0.wr.reqs": 200, "block.0.wr.times": 200 * 30 * 10**6,
        "block.0.wr.bytes": 200 * 4096,
        "net.count": 1, "net.0.name": "vnet0", "net.0.rx.pkts": 990, "net.0.tx.pkts": 0, "net.0.rx.drop": 10,
        "balloon.current": 1048576, "balloon.maximum": 2097152})
    assert a.key == "qemu:///system#web"
    from kvmtune.live.signals import guest_rates

    r = guest_rates(a, b, 2.0)
    assert r.vcpu_delay == {0: pytest.approx(0.1), 1: 0}
    assert r.disks["vda"].iops == 100 and r.disks["vda"].write_ms == pytest.approx(30.0)
    assert r.disks["vda"].read_ms is None  # no read completed: not "0 ms"
    assert r.nics["vnet0"].drops == 10 and r.nics["vnet0"].drop_fraction == pytest.approx(0.01)
    assert r.balloon_fraction == 0.5
    # a guest with no configuration read and a host without findings: the signals are still shown
    make_host(tmp_path)
    snap = Snapshot(t=2.0, host=HostSample(), guests={b.key: b})
    found = {d.signal: d for d in Diagnoser(HostRoot(str(tmp_path))).diagnose(
        Rates(2.0, HostRates(), [r], []), snap)}
    assert set(found) == {"vcpu-delay", "disk-latency vda", "net-drops vnet0", "balloon"}
    assert found["net-drops vnet0"].level == "critical" and found["net-drops vnet0"].explanation == NO_RULE
    assert found["disk-latency vda"].level == "critical"  # 30 ms ≥ 25 ms (medium unknown: HDD thresholds)


def test_prometheus_output_passes_promtool(tmp_path: Path) -> None:
    make_host(tmp_path)
    make_qemu(tmp_path, 100, 'we"b\nx', {0: (0, 0, "0")})
    host = HostRoot(str(tmp_path))
    s = Sampler(host, [])
    a = s.snapshot()
    make_qemu(tmp_path, 100, 'we"b\nx', {0: (10**8, 10**8, "0")})
    b = s.snapshot()
    b.t = a.t + 1
    r = rates(a, b)
    text = prometheus_text(r, Diagnoser(host).diagnose(r, b))
    assert 'guest="we\\"b\\nx"' in text
    assert "kvmtune_guest_vcpu_delay_ratio" in text and "kvmtune_diagnosis{" in text
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed (Debian: prometheus); scripts/install.sh installs it")
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_names_with_control_characters_are_printed_escaped(tmp_path: Path) -> None:
    make_host(tmp_path)
    make_qemu(tmp_path, 100, "evil\x1b]0;title\x07\nname", {0: (0, 0, "0")})
    s = Sampler(HostRoot(str(tmp_path)), [])
    a, b = s.snapshot(), s.snapshot()
    table = render_table(rates(a, b), [], "guest")
    assert "evil\\x1b]0;title\\x07\\x" in table and "\x1b" not in table


def test_sample_json_and_capacity_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_host(tmp_path / "root")
    make_qemu(tmp_path / "root", 100, "web", {0: (0, 0, "0")})
    out = tmp_path / "s.json"
    assert cli.main(["sample", "--root", str(tmp_path / "root"), "--no-libvirt", "--duration", "0.2",
                     "--interval", "0.1", "--format", "json", "-o", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["kind"] == "kvmtune-sample" and len(doc["intervals"]) == 2
    assert [g["name"] for g in doc["summary"]["guests"]] == ["web"]
    assert doc["thresholds"]["host-cpu"]["warn"] == 0.8
    # a sample in which the guest issued 12 tps: a 120-tps disk carries 10 of them
    doc["summary"]["guests"][0]["tps"] = 12.0
    out.write_text(json.dumps(doc))
    capsys.readouterr()
    assert cli.main(["capacity", "--from", str(out), "--disk-tps", "120"]) == 0
    text = capsys.readouterr().out
    assert "carries about 10 such guests" in text and "seed:001" in text


def test_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["capacity", "--from", str(tmp_path / "none.json"), "--disk-tps", "100"]) == 2
    assert "none.json: cannot read" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{}")
    assert cli.main(["capacity", "--from", str(tmp_path / "bad.json"), "--disk-tps", "100"]) == 2
    assert "not a `kvmtune sample --format json` file" in capsys.readouterr().err
    assert cli.main(["sample", "--interval", "0", "--duration", "1"]) == 2
    assert cli.main(["sample", "--root", str(tmp_path), "--duration", "1", "--interval", "1", "-o",
                     str(tmp_path / "nodir" / "x.prom")]) == 2
    err = capsys.readouterr().err
    assert "nodir" in err and "Traceback" not in err


def _monitor(tmp_path: Path) -> tuple[Path, socket.socket, threading.Event]:
    """A host tree and a listening unix socket in it for a fake QEMU's monitor: (its path, the socket, a stop flag
    for the thread that serves it)."""
    make_host(tmp_path)
    path = tmp_path / "mon.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(2)
    return path, server, threading.Event()


def test_a_qmp_socket_that_never_answers_costs_about_one_second(tmp_path: Path) -> None:
    """A process whose monitor accepts but never greets: one note, and the sample goes on."""
    path, server, stop = _monitor(tmp_path)

    def accept_and_hang() -> None:
        conn, _ = server.accept()
        stop.wait(10)
        conn.close()

    t = threading.Thread(target=accept_and_hang, daemon=True)
    t.start()
    make_qemu(tmp_path, 100, "web", {0: (0, 0, "0")})
    proc = tmp_path / "proc" / "100"
    argv = ["qemu-system-x86_64", "-name", "guest=web", "-qmp", f"unix:/{path.name},server=on,wait=off"]
    (proc / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    write(tmp_path, "/proc/100/status", f"Name:\tqemu\nUid:\t{os.getuid()}\t0\t0\t0\n")
    host = HostRoot(str(tmp_path))
    started = time.monotonic()
    snap = Sampler(host, []).snapshot()
    took = time.monotonic() - started
    stop.set()
    server.close()
    g = snap.guests["pid:100:web"]
    assert any("QMP did not answer" in n for n in g.notes), g.notes
    assert took < 3.0


def test_a_qmp_that_greets_late_is_tried_again_not_given_up_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A TCG guest sharing a saturated CPU greets its monitor late: the first connection times out. Before, the
    sampler gave that QEMU's QMP up for the whole session, so a guest without named vCPU threads (no debug-threads)
    stayed 'not measured: vcpu-delay' in top for good (a full CI run, two guests pinned to one busy CPU). Now it is
    tried again after QMP_RETRY_S, and its vCPU threads then come from query-cpus-fast."""
    from kvmtune.live import sources

    monkeypatch.setattr(sources, "QMP_RETRY_S", 0.0)
    path, server, stop = _monitor(tmp_path)

    def serve() -> None:
        late, _ = server.accept()  # the first connection: no greeting within the client's time-out
        conn, _ = server.accept()
        late.close()
        with conn, conn.makefile("rwb") as f:
            f.write(b'{"QMP": {"version": {}, "capabilities": []}}\n')
            f.flush()
            for line in f:
                cmd = json.loads(line)["execute"]
                ret: object = [{"cpu-index": 0, "thread-id": 101}] if cmd == "query-cpus-fast" else \
                    [] if cmd.startswith("query-") else {}
                f.write(json.dumps({"return": ret}).encode() + b"\n")
                f.flush()
        stop.wait(10)

    threading.Thread(target=serve, daemon=True).start()
    make_qemu(tmp_path, 100, "web", {0: (1_000_000, 500_000, "0")})
    write(tmp_path, "/proc/100/task/101/comm", "qemu-system-x86\n")  # vCPU threads not named
    argv = ["qemu-system-x86_64", "-name", "guest=web", "-qmp", f"unix:/{path.name},server=on,wait=off"]
    (tmp_path / "proc" / "100" / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    write(tmp_path, "/proc/100/status", f"Name:\tqemu\nUid:\t{os.getuid()}\t0\t0\t0\n")
    sampler = Sampler(HostRoot(str(tmp_path)), [])
    try:
        first = sampler.snapshot().guests["pid:100:web"]
        assert any("QMP did not answer" in n for n in first.notes), first.notes
        assert not first.vcpus
        second = sampler.snapshot().guests["pid:100:web"]
    finally:
        stop.set()
        sampler.close()
        server.close()
    assert not any("QMP did not answer" in n for n in second.notes), second.notes
    assert list(second.vcpus) == [0], second.vcpus


def test_a_guest_that_disappears_mid_sample_is_skipped(tmp_path: Path) -> None:
    make_host(tmp_path)
    make_qemu(tmp_path, 100, "web", {0: (0, 0, "0")})
    host = HostRoot(str(tmp_path))
    sampler = Sampler(host, [])
    a = sampler.snapshot()
    shutil.rmtree(tmp_path / "proc" / "100")
    b = sampler.snapshot()
    assert "pid:100:web" in a.guests and not b.guests
    assert rates(a, b).guests == []


def test_sample_refuses_an_unwritable_output_before_measuring(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """-o into a missing directory is a usage error at once, not after --duration seconds of sampling."""
    make_host(tmp_path / "root")
    started = time.monotonic()
    assert cli.main(["sample", "--root", str(tmp_path / "root"), "--no-libvirt", "--duration", "30", "--interval", "30",
                     "-o", str(tmp_path / "nodir" / "x.prom")]) == 2
    assert time.monotonic() - started < 10  # the sample would take 30 s
    err = capsys.readouterr().err
    assert err == f"kvmtune: error: {tmp_path / 'nodir' / 'x.prom'}: directory {tmp_path / 'nodir'} does not exist\n"
    assert not (tmp_path / "nodir").exists()


def test_sample_text_and_prometheus_go_to_the_output_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_host(tmp_path / "root")
    make_qemu(tmp_path / "root", 100, "web", {0: (0, 0, "0")})
    for fmt, marker in (("prometheus", "# TYPE kvmtune_"), ("text", "web")):
        out = tmp_path / f"s.{fmt}"
        assert cli.main(["sample", "--root", str(tmp_path / "root"), "--no-libvirt", "--duration", "0.1",
                         "--interval", "0.1", "--format", fmt, "-o", str(out)]) == 0
        assert marker in out.read_text() and capsys.readouterr().out == ""
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".") or "tmp" in p.name] == []  # no temporary left


def test_top_root_must_be_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file").write_text("x")
    for command in (["top", "--plain", "--count", "1"], ["sample", "--duration", "1", "--interval", "1"],
                    ["capacity", "--disk-tps", "10"]):
        with pytest.raises(SystemExit) as exc:
            cli.main([*command, "--root", str(tmp_path / "file"), "--no-libvirt"])
        assert exc.value.code == 2
        assert capsys.readouterr().err.endswith(f"argument --root: {tmp_path / 'file'}: not a directory\n")


def test_a_device_id_from_qmp_is_printed_escaped_in_the_diagnosis(tmp_path: Path) -> None:
    """A fake QMP server is not bound by QEMU's id syntax: its disk name reaches the DIAGNOSIS column escaped."""
    make_host(tmp_path)
    path = tmp_path / "mon.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    device = "vd\x1b]0;owned\x07\u202ea"
    calls = [0]

    def serve() -> None:
        conn, _ = server.accept()
        with conn, conn.makefile("rwb") as f:
            f.write(b'{"QMP": {"version": {}, "capabilities": []}}\n')
            f.flush()
            for line in f:
                cmd = json.loads(line)["execute"]
                if cmd == "query-blockstats":  # 100 reads per call, each taking 50 ms: far past any threshold
                    calls[0] += 1
                    ret: object = [{"device": device, "stats": {"rd_operations": 100 * calls[0],
                                                                "rd_total_time_ns": 5_000_000_000 * calls[0]}}]
                else:
                    ret = [] if cmd.startswith("query-") else {}
                f.write(json.dumps({"return": ret}).encode() + b"\n")
                f.flush()

    threading.Thread(target=serve, daemon=True).start()
    make_qemu(tmp_path, 100, "web", {0: (0, 0, "0")})
    argv = ["qemu-system-x86_64", "-name", "guest=web,debug-threads=on", "-qmp", f"unix:/{path.name},server=on,wait=off"]
    (tmp_path / "proc" / "100" / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    write(tmp_path, "/proc/100/status", f"Name:\tqemu\nUid:\t{os.getuid()}\t0\t0\t0\n")
    host = HostRoot(str(tmp_path))
    sampler = Sampler(host, [])
    try:
        a, b = sampler.snapshot(), sampler.snapshot()
    finally:
        sampler.close()
        server.close()
    r = rates(a, b)
    diagnoses = Diagnoser(host).diagnose(r, b)
    assert any(d.signal == f"disk-latency {device}" for d in diagnoses), diagnoses
    table = render_table(r, diagnoses, "guest", width=400)
    row = next(line for line in table.splitlines() if line.startswith("web"))
    assert "disk-latency vd\\x1b]0;owned\\x07\\u202ea 50.0 ms/op" in row
    assert not [c for c in ("\x1b", "\x07", "\u202e") if c in table]


def _series_of(root: Path, pid: int) -> tuple[set[str], dict[str, str]]:
    host = HostRoot(str(root))
    s = Sampler(host, [])
    a = s.snapshot()
    write(root, f"/proc/{pid}/task/{pid + 1}/schedstat", f"{10**8} {10**8} 42\n")
    b = s.snapshot()
    b.t = a.t + 1
    r = rates(a, b)
    lines = prometheus_text(r, []).splitlines()
    series = {line.rsplit(" ", 1)[0] for line in lines if line.startswith("kvmtune_guest_")}
    (guest,) = rates_json(r, [])["guests"]
    return series, guest


def test_a_restarted_process_guest_continues_its_series(tmp_path: Path) -> None:
    """Prometheus and JSON key a QEMU process by its -uuid, else its -name, never its pid."""
    make_host(tmp_path)
    make_qemu(tmp_path, 100, "db01", {0: (0, 0, "0")})
    before, first = _series_of(tmp_path, 100)
    shutil.rmtree(tmp_path / "proc" / "100")  # the guest restarts under another pid
    make_qemu(tmp_path, 4242, "db01", {0: (0, 0, "0")})
    after, second = _series_of(tmp_path, 4242)
    assert before and before == after
    assert 'id="name:db01"' in next(iter(before)) and 'source="qemu"' in next(iter(before))
    assert first["id"] == second["id"] == "name:db01"
    cmdline = tmp_path / "proc" / "4242" / "cmdline"
    cmdline.write_bytes(cmdline.read_bytes() + b"-uuid\0" + b"6F1C3E1A-0000-4000-8000-00000000DB01\0")
    _, third = _series_of(tmp_path, 4242)
    assert third["id"] == "uuid:6f1c3e1a-0000-4000-8000-00000000db01"


def test_top_names_the_neighbour_a_confined_guest_waits_for(tmp_path: Path) -> None:
    make_host(tmp_path)
    make_qemu(tmp_path, 100, "web", {0: (0, 0, "0")})
    make_qemu(tmp_path, 200, "db", {0: (0, 0, "0")})
    host = HostRoot(str(tmp_path))
    sampler = Sampler(host, [])
    a = sampler.snapshot()
    make_qemu(tmp_path, 100, "web", {0: (500_000_000, 500_000_000, "0")})
    make_qemu(tmp_path, 200, "db", {0: (500_000_000, 450_000_000, "0")})
    b = sampler.snapshot()
    b.t = a.t + 1.0
    r = rates(a, b)
    diagnoses = Diagnoser(host).diagnose(r, b)
    row = next(line for line in render_table(r, diagnoses, "delay", width=None).splitlines() if line.startswith("web"))
    assert "critical vcpu-delay 50% run delay, waits for db → KVM-HST-019" in row, row
    (web,) = [g for g in rates_json(r, diagnoses)["guests"] if g["name"] == "web"]
    assert web["diagnoses"][0]["who"] == "waits for db"


def _busy_host_diagnosis(root: Path, accel: str) -> list[str]:
    make_host(root)
    (root / "dev" / "kvm").unlink()  # this host has no KVM: KVM-HST-001 is one of its findings
    make_qemu(root, 100, "web", {0: (0, 0, "0-1")})
    cmdline = root / "proc" / "100" / "cmdline"
    cmdline.write_bytes(cmdline.read_bytes().replace(b"-accel\0kvm", f"-accel\0{accel}".encode()))
    host = HostRoot(str(root))
    sampler = Sampler(host, [])
    a = sampler.snapshot()
    write(root, "/proc/stat", STAT.format(busy=1070, idle=930))  # 97 % busy over the interval
    b = sampler.snapshot()
    b.t = a.t + 1.0
    r = rates(a, b)
    (cpu,) = [d for d in Diagnoser(host).diagnose(r, b) if d.guest == "" and d.signal == "host-cpu"]
    assert cpu.level == "critical"
    return cpu.rules


def test_a_busy_host_names_the_accelerator_only_when_guests_are_emulated(tmp_path: Path) -> None:
    """A host without KVM (KVM-HST-001 is a finding): that explains a busy host only when guests run under TCG."""
    assert "KVM-HST-001" not in _busy_host_diagnosis(tmp_path / "kvm", "kvm")
    assert _busy_host_diagnosis(tmp_path / "tcg", "tcg")[0] == "KVM-HST-001"


def test_top_plain_into_a_pipe_never_cuts_a_row(tmp_path: Path) -> None:
    make_host(tmp_path)
    for pid, name in ((100, "a-guest-with-a-long-name"), (200, "its-neighbour-also-long")):
        make_qemu(tmp_path, pid, name, {0: (0, 0, "0")})
        cmdline = tmp_path / "proc" / str(pid) / "cmdline"
        cmdline.write_bytes(cmdline.read_bytes() + f"-netdev\0tap,id=n0,ifname=tap{pid}\0".encode())
    stop = threading.Event()

    def waiting() -> None:  # both vCPUs wait for CPU 0 all the time, as the tree says
        n = 0
        while not stop.is_set():
            n += 1
            for pid in (100, 200):  # replaced whole, as the kernel's file never reads half-written
                path = tmp_path / f"proc/{pid}/task/{pid + 1}/schedstat"
                path.with_suffix(".new").write_text(f"{n * 10**7} {n * 10**8} 42\n")
                os.replace(path.with_suffix(".new"), path)
                for counter, value in (("rx_packets", 1000 * n), ("tx_packets", 1000 * n), ("rx_dropped", 5 * n),
                                       ("tx_dropped", 0)):
                    stat = tmp_path / f"sys/class/net/tap{pid}/statistics/{counter}"
                    stat.parent.mkdir(parents=True, exist_ok=True)
                    stat.with_suffix(".new").write_text(f"{value}\n")
                    os.replace(stat.with_suffix(".new"), stat)
            time.sleep(0.05)

    t = threading.Thread(target=waiting, daemon=True)
    t.start()
    try:
        done = subprocess.run([sys.executable, "-m", "kvmtune", "top", "--plain", "--count", "1", "--interval", "1",
                               "--no-libvirt", "--root", str(tmp_path)], capture_output=True, text=True,
                              env=os.environ, timeout=60)
    finally:
        stop.set()
        t.join()
    assert done.returncode == 0, done.stderr
    row = next(line for line in done.stdout.splitlines() if line.startswith("a-guest-with"))
    assert len(row) > 160 and row.endswith("net-drops tap100 " + row.rsplit("net-drops tap100 ", 1)[1]), row
    assert row.endswith("→ no rule explains this") and "KVM-HST-019" in row, row


def test_a_repinned_vcpu_is_seen_within_affinity_every_samples(tmp_path: Path) -> None:
    """Affinity is read every AFFINITY_EVERY samples, not each (the sampling cost goal): a new pin shows up then."""
    from kvmtune.live.sources import AFFINITY_EVERY

    make_host(tmp_path)
    make_qemu(tmp_path, 100, "web", {0: (0, 0, "0-1")})
    sampler = Sampler(HostRoot(str(tmp_path)), [])
    assert sampler.snapshot().guests["pid:100:web"].vcpus[0].allowed_cpus == frozenset({0, 1})
    write(tmp_path, "/proc/100/task/101/status", "Name:\tCPU 0/KVM\nCpus_allowed_list:\t1\n")  # virsh vcpupin
    seen = [sampler.snapshot().guests["pid:100:web"].vcpus[0].allowed_cpus for _ in range(AFFINITY_EVERY)]
    assert seen[-1] == frozenset({1}) and seen.count(frozenset({0, 1})) < AFFINITY_EVERY


def test_a_guest_whose_vcpu_delay_could_not_be_taken_is_not_measured_not_ok(tmp_path: Path) -> None:
    """Issue 46 item 3: top, sample's JSON and its Prometheus text say "not measured" (no sample, not a zero) for a
    QEMU whose vCPU threads cannot be found, and for a host without PSI; a guest is "ok" only when all was measured."""
    make_host(tmp_path)
    (tmp_path / "proc/pressure/memory").unlink()  # a kernel without PSI
    make_qemu(tmp_path, 100, "named", {0: (0, 0, "0")})
    make_qemu(tmp_path, 200, "unnamed", {})
    argv = ["qemu-system-x86_64", "-name", "unnamed", "-m", "1024"]  # no debug-threads, no QMP
    (tmp_path / "proc/200/cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
    host = HostRoot(str(tmp_path))
    sampler = Sampler(host, [])
    a = sampler.snapshot()
    make_qemu(tmp_path, 100, "named", {0: (10_000_000, 0, "0")})
    write(tmp_path, "/proc/stat", STAT.format(busy=150, idle=1800))
    b = sampler.snapshot()
    b.t = a.t + 1.0
    r = rates(a, b)
    diagnoses = Diagnoser(host).diagnose(r, b)
    rows = {line.split()[0]: line for line in render_table(r, diagnoses, "guest", width=None).splitlines()}
    assert rows["named"].endswith("  ok")
    assert rows["unnamed"].endswith("  not measured: vcpu-delay") and " ok" not in rows["unnamed"]
    assert "host not measured: psi-memory: no /proc/pressure/memory" in rows["host"] + "\n" + "\n".join(rows.values())
    doc = rates_json(r, diagnoses)
    by_name = {g["name"]: g for g in doc["guests"]}
    assert by_name["unnamed"]["not_measured"] == {
        "vcpu-delay": "its vCPU threads were not identified (QEMU without -name …,debug-threads=on, and no QMP)"}
    assert by_name["named"]["not_measured"] == {} and by_name["unnamed"]["vcpu_delay"] == {}
    assert doc["host"]["not_measured"] == {"psi-memory": "no /proc/pressure/memory (a kernel without CONFIG_PSI, or psi=0)"}
    text = prometheus_text(r, diagnoses)
    delays = [ln for ln in text.splitlines() if ln.startswith("kvmtune_guest_vcpu_delay_ratio{")]
    assert len(delays) == 1 and 'guest="named"' in delays[0]  # no sample for unnamed, not a zero
    assert "pressure" not in text and "kvmtune_diagnosis{" not in text


@pytest.mark.parametrize("option", [
    ["-blockdev", "{bad"],  # an InputError from the command-line reader
    ["-drive", "file=json:" + "[" * 100_000 + ",if=virtio"],  # nested past the JSON reader: was a RecursionError
])
def test_another_users_unreadable_qemu_command_line_costs_that_process_not_the_sample(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], option: list[str]) -> None:
    """``top``/``sample``/``why`` read every QEMU's ``/proc/PID/cmdline``, any user's: one kvmtune cannot read ended
    the whole run (exit 2, one line naming that pid; a RecursionError before 75af4ea): now it is that pid's note, and
    the other guests are sampled."""
    make_host(tmp_path)
    make_qemu(tmp_path, 100, "web", {0: (0, 0, "0")})
    make_qemu(tmp_path, 200, "odd", {0: (0, 0, "0")})
    cmdline = tmp_path / "proc" / "200" / "cmdline"
    cmdline.write_bytes(cmdline.read_bytes() + b"\0".join(o.encode() for o in option) + b"\0")
    out = tmp_path / "s.json"
    assert cli.main(["sample", "--root", str(tmp_path), "--no-libvirt", "--duration", "0.2", "--interval", "0.1",
                     "--format", "json", "-o", str(out)]) == 0, capsys.readouterr().err
    doc = json.loads(out.read_text())
    assert [g["name"] for g in doc["summary"]["guests"]] == ["web"]
    snap = Sampler(HostRoot(str(tmp_path)), []).snapshot()
    assert sorted(snap.guests) == ["pid:100:web"]
    assert [n for n in snap.notes if n.startswith("pid 200")] == [
        "pid 200: not sampled (invalid JSON option value: Expecting property name enclosed in double quotes)"
        if option[0] == "-blockdev" else "pid 200: not sampled (JSON option value nested too deeply to read)"]
