"""The storage guest tier driven through the agent, without QEMU: why a guest never answered (from its console),
and what the scripts run through the agent print, read as hostile input."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import cast

from kvmtune.bench.storage.guest import _not_ready, parse_console
from kvmtune.errors import KvmtuneError
from kvmtune.lab.qemu import GuestRun


def _vm(tmp_path: Path, console: bytes) -> GuestRun:
    serial = tmp_path / "vm.serial"
    serial.write_bytes(console)
    return cast(GuestRun, SimpleNamespace(serial=serial))


def test_why_the_agent_never_answered(tmp_path: Path) -> None:
    late = KvmtuneError("the agent of probe guest storage did not answer within 40s")
    booted = b"KVMTUNE-BOOTED 1.2\r\nKVMTUNE-FATAL disk /dev/vda did not appear in the guest\r\n"
    assert _not_ready(_vm(tmp_path, booted), 40, late) == "disk /dev/vda did not appear in the guest"
    panic = b"[ 0.5] Kernel panic - not syncing: VFS: Unable to mount root fs\n"
    assert _not_ready(_vm(tmp_path, panic), 40, late).startswith("kernel did not boot: [ 0.5] Kernel panic")
    silent = _not_ready(_vm(tmp_path, b"SeaBIOS\n\xff\xfe garbage\n"), 12, late)
    assert silent.startswith("kernel did not boot within 12s (last console line: ") and "\n" not in silent
    assert _not_ready(_vm(tmp_path, b"KVMTUNE-BOOTED 1.0\n"), 40, late) == str(late)  # booted: the agent's own line
    stopped = KvmtuneError("QEMU stopped the guest in its internal-error state")
    assert _not_ready(_vm(tmp_path, b""), 40, stopped) == str(stopped)
    missing = cast(GuestRun, SimpleNamespace(serial=tmp_path / "gone.serial"))
    assert _not_ready(missing, 5, late).startswith("kernel did not boot within 5s")


def test_what_the_workload_scripts_print_is_read_strictly() -> None:
    out = [
        "KVMTUNE-DISK /dev/vda 524288 [none] mq-deadline",
        "KVMTUNE-W-BEGIN randread-4k 7.1", "KVMTUNE-CPU randread-4k a cpu  1 2 3 4", "KVMTUNE-CPU randread-4k b cpu  5 6 7 8",
        "KVMTUNE-W-DONE randread-4k 0 9.0", "KVMTUNE-JSON-BEGIN randread-4k", '{"jobs": []}', "KVMTUNE-JSON-END randread-4k",
        "KVMTUNE-W-DONE broken x 9.5", "KVMTUNE-ERR broken fio: engine not found",
        "KVMTUNE-JSON-BEGIN never-ends", "KVMTUNE-W-DONE after-unclosed 0",  # swallowed into the unclosed document
    ]
    parsed = parse_console(out)
    assert parsed["randread-4k"]["rc"] == 0 and parsed["randread-4k"]["json"] == '{"jobs": []}'
    assert parsed["randread-4k"]["cpu_a"] == "cpu  1 2 3 4" and parsed["randread-4k"]["cpu_b"] == "cpu  5 6 7 8"
    assert parsed["broken"]["rc"] == -1 and parsed["broken"]["error"] == "fio: engine not found"
    assert "after-unclosed" not in parsed and "json" not in parsed.get("never-ends", {})
    assert parse_console(["KVMTUNE-FATAL mkfs failed: no space"])[""]["error"] == "mkfs failed: no space"
