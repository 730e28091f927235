"""``verify --no-store`` measures too: it holds the host's one-benchmark lock like every stored run (issue 31)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def test_verify_no_store_is_refused_by_a_held_lock(tmp_path: Path) -> None:
    lock = tmp_path / "bench.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another benchmark holds the host
    os.write(fd, b'{"pid": 4242, "run": 7, "kind": "block", "db": "/elsewhere.db"}')
    work = tmp_path / "w"
    env = {**os.environ, "PYTHONPATH": str(SRC), "KVMTUNE_BENCH_LOCK": str(lock), "XDG_DATA_HOME": str(tmp_path)}
    try:
        proc = subprocess.run([sys.executable, "-m", "kvmtune", "verify", "--examples", "--only", "KVM-STO-010",
                               "--no-store", "--repeat", "1", "--seconds", "0.2", "--size", "64M", "--workdir",
                               str(work)], capture_output=True, text=True, timeout=120, env=env)
    finally:
        os.close(fd)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr.strip().splitlines()
    assert "another benchmark is running on this host: run 7 (block) in /elsewhere.db, pid 4242" in err[-1], err
    assert "Traceback" not in proc.stderr and "KVM-STO-010" not in proc.stdout  # nothing was measured
    assert not list(work.glob(".kvmtune-verify-*"))
