"""The netload driver: the ``netload`` binary the probe guests run, its port, a run's shared secret, and the
numbers stored from one of its JSON documents. ``kvmtune bench net`` (:mod:`kvmtune.bench.net.guest`) and
verify's host and guest tiers drive it.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from kvmtune.lab.net.netns import NetError
from kvmtune.runner import Runner

NETLOAD_PORT = 20000
REPO_NETLOAD = Path(__file__).resolve().parents[4] / "netload" / "bin" / "netload"
# the copy a wheel carries (scripts/build-wheel.sh), so hosts installed from the wheel need no Go
PACKAGED_NETLOAD = Path(__file__).resolve().parents[2] / "_bin" / "netload"


def find_netload(given: str | None, runner: Runner) -> str:
    """The netload binary for the guest: ``--netload``, ``netload`` on PATH, the wheel's copy, or the repository's build."""
    if given:
        if not os.path.isfile(given):
            raise NetError(f"{given}: netload binary not found")
        return given
    found = runner.which("netload") or next((str(p) for p in (PACKAGED_NETLOAD, REPO_NETLOAD) if p.is_file()), None)
    if not found:
        raise NetError("netload binary not found: build it (make -C netload) or pass --netload PATH")
    return found


def new_token() -> str:
    """A fresh shared secret for one run's netload servers (hex: safe in a shell line)."""
    return secrets.token_hex(16)


def netload_metrics(doc: dict[str, Any]) -> dict[str, float]:
    """The stored numbers of one netload JSON document (lower-is-better metrics contain lat/cpu)."""
    s = doc["summary"]
    txn = s.get("txn_time_ns") or {}
    cpu = doc.get("cpu") or {}
    m: dict[str, float] = {
        "throughput_Bps": float(s["throughput_bytes_per_s"]),
        "tps": float(s["transactions_per_s"]),
        "bytes": float(s["bytes"]),
        "transactions": float(s["transactions"]),
        "errors": float(s.get("errors", 0) + s.get("server_errors", 0)),
        "measured_s": float(s.get("duration_s", 0.0)),
    }
    for key in ("tcp_retransmits", "undelivered_messages"):  # netload 0.3.0 and later
        if s.get(key) is not None:
            m[key] = float(s[key])
    for name, q in (("avg", "avg"), ("p50", "p50"), ("p90", "p90"), ("p99", "p99"), ("p99_9", "p99_9")):
        if txn.get(q) is not None and txn.get("count"):
            m[f"lat_{name}_us"] = float(txn[q]) / 1000.0
    for side in ("client", "server"):
        c = cpu.get(side) or {}
        if c.get("system_cpu_s_per_mb") is not None and s["bytes"]:
            m[f"{side}_cpu_s_per_mb"] = float(c["system_cpu_s_per_mb"])
        if c.get("system_cpu_us_per_txn") is not None and s["transactions"]:
            m[f"{side}_cpu_us_per_txn"] = float(c["system_cpu_us_per_txn"])
        if c.get("system_busy_share") is not None:
            m[f"{side}_cpu_busy_pct"] = 100.0 * float(c["system_busy_share"])
    return m
