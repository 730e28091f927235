"""fio workloads, the guest job script, and parsing fio's real JSON output."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kvmtune.errors import InputError
from kvmtune.lab.storage import fio as fiomod


@pytest.fixture(scope="module")
def real_fio_json(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A real fio run (host, tiny file, 200 ms) with the arguments the guest uses."""
    d = tmp_path_factory.mktemp("fio")
    w = fiomod.BASIC["randrw-8k"]
    args = fiomod.fio_args(w, str(d / "f.dat"), 0.2, 8, on_fs=False)
    args = [a for a in args if not a.startswith("--ioengine") and not a.startswith("--direct")]
    res = subprocess.run(["fio", *args, "--ioengine=psync", "--direct=0", "--output-format=json"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_parse_real_fio_json(real_fio_json: str) -> None:
    m = fiomod.parse_fio_json(real_fio_json)
    assert m["iops_read"] > 0 and m["iops_write"] > 0
    assert m["iops"] == pytest.approx(m["iops_read"] + m["iops_write"])
    assert m["bw_Bps"] == pytest.approx(m["bw_read_Bps"] + m["bw_write_Bps"])
    assert 0 < m["clat_p50_read_us"] <= m["clat_p99_read_us"]
    assert m["clat_p99_us"] == max(m["clat_p99_read_us"], m["clat_p99_write_us"])
    assert 0.1 <= m["fio_runtime_s"] <= 2.0
    assert "fio_sys_cpu_pct" in m


def test_parse_tolerates_warnings_before_the_json(real_fio_json: str) -> None:
    m = fiomod.parse_fio_json("fio: some warning\n" + real_fio_json)
    assert m["iops"] > 0


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "no JSON"),
        ("{not json", "malformed"),
        ('{"jobs": []}', "no jobs"),
        ('{"jobs": [{"error": 5, "read": {}, "write": {}}]}', "job error 5"),
        ('{"jobs": [{"error": 0, "read": {"total_ios": 0}, "write": {"total_ios": 0}}]}', "did no I/O"),
    ],
)
def test_parse_rejects_unusable_output(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        fiomod.parse_fio_json(text)


def test_lookup_knows_names_and_cycles_and_rejects_unknown() -> None:
    ws = fiomod.lookup(["randwrite-4k", "ffsb-mail-t8-buffered", "cycle-16m"])
    assert [w.name for w in ws] == ["randwrite-4k", "ffsb-mail-t8-buffered", "cycle-16m"]
    assert ws[2].is_cycle and ws[2].cycle_mib == 16
    with pytest.raises(InputError, match="unknown workload 'nope'"):
        fiomod.lookup(["nope"])


def test_ffsb_set_covers_ops_threads_and_modes() -> None:
    ws = fiomod.ffsb_workloads()
    assert len(ws) == 5 * 3 * 2
    assert all(w.bs == "8k" and w.fs for w in ws)
    t16 = next(w for w in ws if w.name == "ffsb-randwrite-t16-direct")
    args = fiomod.fio_args(t16, "/mnt/x", 2, 1024, on_fs=True)
    assert "--numjobs=16" in args and "--thread" in args and "--direct=1" in args
    assert "--size=32m" in args  # half the disk split over 16 jobs


def test_mail_files_shrink_to_fit_a_small_disk() -> None:
    mail = next(w for w in fiomod.ffsb_workloads((8,)) if w.name == "ffsb-mail-t8-direct")
    args = fiomod.fio_args(mail, "/mnt/m", 1, 64, on_fs=True)
    fs = next(a for a in args if a.startswith("--filesize="))
    lo, hi = fs.split("=")[1].split(":")
    assert lo == "1k" and int(hi.rstrip("k")) * 32 * 8 <= 64 * 1024  # 32 files × 8 jobs fit in 64 MiB


def _sh_ok(text: str) -> None:
    out = subprocess.run(["sh", "-n"], input=text, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_boot_job_loads_modules_waits_for_the_disk_then_starts_the_agent() -> None:
    job = fiomod.GuestJob(
        "vda", ["kernel/drivers/virtio/virtio.ko", "kernel/drivers/block/virtio_blk.ko"],
        fiomod.lookup(["randwrite-4k", "fs-randwrite-4k", "cycle-8m"]), 1.0, 256, sched="mq-deadline",
    )
    s = fiomod.boot_job(job)
    assert s.index("virtio.ko") < s.index("virtio_blk.ko") < s.index("DEV=/dev/vda") < s.index("qemu-ga -m virtio-serial")
    assert "[ -d /sys/module/virtio_blk ] || insmod /lib/modules/kernel/drivers/block/virtio_blk.ko" in s
    assert s.index("qemu-ga") < s.index(fiomod.READY)
    assert "fio" not in s and "mq-deadline" not in s  # the workloads come through the agent
    _sh_ok(s)


def test_the_scripts_the_agent_runs_prepare_the_disk_and_mark_each_workload() -> None:
    job = fiomod.GuestJob(
        "vda", ["kernel/drivers/virtio/virtio.ko", "kernel/drivers/block/virtio_blk.ko"],
        fiomod.lookup(["randwrite-4k", "fs-randwrite-4k", "cycle-8m"]), 1.0, 256, sched="mq-deadline",
    )
    prep = fiomod.prepare_script(job)
    assert "[ -d /sys/module/virtio_blk ] || insmod" in prep  # what a restored guest lacks is loaded here
    assert "echo mq-deadline > /sys/block/vda/queue/scheduler" in prep
    assert "mke2fs -q -F -t ext4" in prep and "mount $DEV /mnt" in prep
    plain, fs, cycle = (fiomod.workload_script(job, w, i) for i, w in enumerate(job.workloads))
    assert "run randwrite-4k --name=randwrite-4k" in plain and "--filename=$DEV" in plain and "slot=0" in plain
    assert "--directory=/mnt/fs-randwrite-4k" in fs and "rm -rf /mnt/* 2>/dev/null; mkdir -p /mnt/fs-randwrite-4k" in fs
    assert "dd if=/dev/zero of=$DEV bs=1M count=8 conv=fsync" in cycle and "\nrun " not in cycle
    for text in (prep, plain, fs, cycle):
        _sh_ok(text)
    assert "mke2fs" not in fiomod.prepare_script(fiomod.GuestJob("vda", [], fiomod.lookup(["randwrite-4k"]), 1.0, 64))


def test_cpu_busy_from_proc_stat_lines() -> None:
    a = fiomod.parse_proc_stat_cpu("cpu  100 0 100 800 0 0 0 0 0 0")
    b = fiomod.parse_proc_stat_cpu("cpu  150 0 150 900 0 0 0 0 0 0")
    assert fiomod.cpu_busy_pct(a, b) == pytest.approx(50.0)
    assert fiomod.cpu_busy_pct(a, a) is None
    with pytest.raises(ValueError):
        fiomod.parse_proc_stat_cpu("intr 1 2 3")


def test_a_saved_guest_waits_with_fio_started_and_its_agent_up() -> None:
    job = fiomod.GuestJob("sda", ["kernel/drivers/ata/ata_piix.ko"], fiomod.lookup(["randread-4k"]), 1.0, 64)
    wait = fiomod.wait_job(fiomod.GuestJob("sda", job.modules, [], 0.0, 64))
    assert wait == fiomod.wait_job(fiomod.GuestJob("sda", job.modules, [], 0.0, 64))  # the restore serves it again
    assert "randread" not in wait
    # pre-started fio processes wait on FIFOs; a workload's script feeds one an ini job and reads its exit code
    assert wait.index("mkfifo /tmp/kvw/$n.ini") < wait.index("qemu-ga") < wait.index(fiomod.READY)
    first = fiomod.workload_script(job, job.workloads[0], 0)
    assert 'ini "$name" "$@" > /tmp/kvw/$slot.ini; read rc < /tmp/kvw/$slot.done' in first and "slot=0" in first
    for text in (wait, first):
        _sh_ok(text)


def test_ini_conversion_in_the_guest_shell_gives_a_job_fio_accepts(tmp_path: Path) -> None:
    real = fiomod.workload_script(fiomod.GuestJob("vda", [], [], 1.0, 64), fiomod.BASIC["randrw-8k"], 0)
    ini_fn = next(ln for ln in real.splitlines() if ln.startswith("ini()"))
    args = fiomod.fio_args(fiomod.BASIC["randrw-8k"], str(tmp_path / "f.dat"), 0.2, 8, on_fs=False)
    args = [a for a in args if not a.startswith(("--ioengine", "--direct"))] + ["--ioengine=psync"]
    script = ini_fn + "\nini randrw-8k " + " ".join(args) + "\n"
    ini = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout
    assert ini.startswith("[randrw-8k]\nname=randrw-8k\n") and "\ntime_based\n" in ini
    (tmp_path / "job.ini").write_text(ini)
    res = subprocess.run(["fio", "--output-format=json", str(tmp_path / "job.ini")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert fiomod.parse_fio_json(res.stdout)["iops"] > 0
