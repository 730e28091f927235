"""``kvmtune doctor``: what this host can measure, on one screen, before a benchmark is started.

Nothing here boots a guest or changes anything: the KVM verdict is the one ``kvmtune guest accel``
cached (that probe boots a guest; run it to refresh), the rest are device nodes, modules, programs,
fio's engines and free space. Each line says what is missing and what it costs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

from kvmtune.capture.session import restore_leftovers
from kvmtune.cli.command import Command, Outcome, format_option
from kvmtune.host.facts import HostFacts
from kvmtune.host.root import HostRoot
from kvmtune.lab.accel import kvm_pvm_note
from kvmtune.lab.accel_cache import read_cached_verdict
from kvmtune.lab.net.netload import PACKAGED_NETLOAD, REPO_NETLOAD
from kvmtune.lab.workdir import default_workdir
from kvmtune.runner import Runner, default_runner
from kvmtune.textsafe import safe

MIN_FREE_GIB = 4.0  # a seed-003 block-tier run with 1 GiB images and their fresh copies


@dataclass
class Check:
    what: str
    ok: bool | None  # None: unknown here
    detail: str
    costs: str = ""  # what a missing piece takes away


class DoctorCommand(Command):
    name = "doctor"
    help = "what this host can measure: KVM, vhost-net, OVS, qemu-storage-daemon, fio, space"
    description = "Say in one screen what kvmtune can measure here, and what is missing."

    def options(self, p: argparse.ArgumentParser) -> None:
        p.add_argument("--workdir", type=Path, default=None, help=f"benchmark work directory (default {default_workdir()})")
        format_option(p, ("text", "json"))

    def run(self, args: argparse.Namespace) -> Outcome:
        workdir = args.workdir or default_workdir()
        # a capture killed by SIGKILL left trace events or latency histograms on in a guest's QEMU: undone here
        restored = [Check("capture leftovers", True, line) for line in restore_leftovers(HostRoot(), workdir)]
        return Outcome(result=restored + checks(HostRoot(), default_runner(), workdir))

    def render(self, outcome: Outcome, fmt: str, out: TextIO, *, color: bool) -> None:
        found = outcome.result
        assert isinstance(found, list)
        if fmt == "json":
            out.write(json.dumps({"schema_version": 1, "checks": [asdict(c) for c in found]}, indent=2) + "\n")
            return
        mark = {True: "ok  ", False: "MISS", None: "??  "}
        for c in found:
            line = f"{mark[c.ok]} {c.what}: {c.detail}"
            if c.ok is not True and c.costs:
                line += f" — {c.costs}"
            out.write(line + "\n")
        out.write(f"({os.cpu_count()} CPUs; `kvmtune guest accel` probes KVM by booting a guest)\n")


COMMANDS = (DoctorCommand,)


def checks(host: HostRoot, runner: Runner, workdir: Path) -> list[Check]:
    facts = HostFacts(host, probe=False)
    out: list[Check] = []
    flag = facts.cpu_vendor_virt_flag
    verdict = read_cached_verdict(workdir, facts.kernel_release or "")
    if verdict is not None:
        out.append(Check("KVM boots a guest", verdict.accel == "kvm",
                         f"{verdict.accel} ({safe(verdict.reason)}; measured {verdict.age_s / 3600:.1f} h ago)",
                         "guest-tier results are TCG emulation numbers, not comparable with KVM ones"))
    else:
        kvm = host.exists("/dev/kvm")
        out.append(Check("KVM boots a guest", None,
                         f"not probed yet (run `kvmtune guest accel`); /dev/kvm {'present' if kvm else 'absent'}, "
                         f"CPU flag {flag or 'vmx/svm absent'}", "unknown until probed"))
    modules = [m for m in ("kvm_intel", "kvm_amd", "kvm_pvm") if host.is_dir(f"/sys/module/{m}")]
    pvm = kvm_pvm_note(host)
    out.append(Check("KVM module", None if not modules else pvm is None,
                     f"{', '.join(modules) or 'none of kvm_intel, kvm_amd, kvm_pvm'} loaded"
                     + (f": {pvm}" if pvm else ""),
                     "stock guest kernels do not boot under KVM here; the probe guest falls back to TCG" if pvm else
                     "no KVM: guests run under TCG emulation"))
    out.append(Check("vhost-net", host.exists("/dev/vhost-net"), "/dev/vhost-net",
                     "virtio-net's data path stays in QEMU userspace"))
    ovs_kernel = host.is_dir("/sys/module/openvswitch")
    out.append(Check("Open vSwitch kernel datapath", ovs_kernel,
                     "module openvswitch " + ("loaded" if ovs_kernel else "not loaded"),
                     "OVS topologies run with the userspace datapath only"))
    for prog, costs in (("qemu-system-x86_64", "no guest tier"), ("qemu-img", "no image audit or quick tier"),
                        ("qemu-storage-daemon", "no block tier"), ("fio", "no storage benchmark"),
                        ("ovs-vswitchd", "no Open vSwitch topology"), ("promtool", "Prometheus output not checkable")):
        path = runner.which(prog)
        out.append(Check(prog, path is not None, path or "not on PATH", costs))
    netload = runner.which("netload") or next((str(p) for p in (PACKAGED_NETLOAD, REPO_NETLOAD) if p.is_file()), None)
    out.append(Check("netload", netload is not None,
                     netload or "not in this build (the py3-none-any wheel carries none; the x86-64 wheel and the .deb do) "
                     "and not on PATH",
                     "no guest network benchmark: build it (make -C netload) or pass `bench net --netload PATH`"))
    engines = runner.run(["fio", "--enghelp"], timeout=10) if runner.which("fio") else None
    names = set(engines.stdout.split()) if engines is not None and engines.ok else set()
    for engine, costs in (("nbd", "no block tier (fio drives qemu-storage-daemon over NBD)"),
                          ("libaio", "no aio=native-like host floor"), ("io_uring", "no io_uring floor")):
        out.append(Check(f"fio engine {engine}", engine in names if names else None,
                         "listed by fio --enghelp" if engine in names else "not listed", costs))
    probe = workdir if workdir.exists() else next((p for p in workdir.parents if p.exists()), Path("/"))
    free = shutil.disk_usage(probe).free / 2**30
    out.append(Check("free space in the work directory", free >= MIN_FREE_GIB, f"{free:.1f} GiB free at {probe}",
                     f"below {MIN_FREE_GIB:g} GiB the storage benchmarks refuse to start"))
    return out
