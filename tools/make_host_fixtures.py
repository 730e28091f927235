#!/usr/bin/env python3
"""Write the synthetic host fixture trees under tests/fixtures/hosts/.

Three scenarios, modelled on real machines (file formats as the kernels in
question write them):

- ``rhel6-old``: RHEL 6 (2.6.32) KVM host with a hand-copied 2012 tuning:
  CFQ, KSM on without overcommit, redhat_transparent_hugepage, seed-era TCP
  sysctls, a jumbo uplink bridged to a 1500-byte tap, nobarrier, low entropy,
  no vhost-net, no halt polling.
- ``nvme-modern``: current two-socket NVMe host doing everything right (the
  "silent" reference).
- ``ksm-overcommit``: RHEL 9 host with 12 guests on 16 CPUs and 64 GiB:
  KSM merging across NUMA nodes, swap in use, halt polling on, drops.
- ``pinned-latency``: two-node Intel host meant for latency (tuned
  realtime-virtual-host chosen, daemon not running) with two vCPU-pinned
  guests, one with a passed-through NIC: powersave governor, deep C-states,
  NUMA balancing and zone reclaim on, 16 GiB of idle static huge pages,
  irqbalance free to use the pinned CPUs, no isolcpus/nohz_full, IOMMU
  translating everything.

The fourth tree, ``this-machine``, is captured with
``tools/capture_host_fixture.py`` instead.

    tools/make_host_fixtures.py [--out tests/fixtures/hosts]
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
GiB_KB = 1024 * 1024


class Tree:
    def __init__(self, root: Path) -> None:
        self.root = root
        if root.exists():
            shutil.rmtree(root)
        root.mkdir(parents=True)

    def w(self, path: str, content: str | bytes) -> None:
        p = self.root / path.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            p.write_bytes(content)
        else:
            p.write_text(content if content.endswith("\n") or content == "" else content + "\n")

    def mkdir(self, path: str) -> None:
        (self.root / path.lstrip("/")).mkdir(parents=True, exist_ok=True)

    def link(self, path: str, target: str) -> None:
        p = self.root / path.lstrip("/")
        p.parent.mkdir(parents=True, exist_ok=True)
        if os.path.lexists(p):
            p.unlink()
        os.symlink(target, p)

    # -- building blocks -----------------------------------------------------------------

    def cpus(self, n: int, flags: str, model: str, nodes: int = 1, smt: int = 1) -> None:
        self.w("/sys/devices/system/cpu/online", f"0-{n - 1}")
        if smt > 1:  # siblings numbered next to each other (as many AMD and some Intel firmware enumerate)
            for i in range(n):
                first = i - i % smt
                self.w(f"/sys/devices/system/cpu/cpu{i}/topology/thread_siblings_list", f"{first}-{first + smt - 1}")
        blocks = []
        for i in range(n):
            blocks.append(
                f"processor\t: {i}\nvendor_id\t: {'AuthenticAMD' if 'svm' in flags else 'GenuineIntel'}\n"
                f"model name\t: {model}\nflags\t\t: {flags}\n"
            )
        self.w("/proc/cpuinfo", "\n".join(blocks))
        per = n // nodes
        for node in range(nodes):
            self.w(f"/sys/devices/system/node/node{node}/cpulist", f"{node * per}-{(node + 1) * per - 1}")
        self.w("/sys/devices/system/node/online", f"0-{nodes - 1}" if nodes > 1 else "0")

    def meminfo(self, total_gib: int, swap_total_gib: int, swap_used_gib: float) -> None:
        total = total_gib * GiB_KB
        st = swap_total_gib * GiB_KB
        sf = st - int(swap_used_gib * GiB_KB)
        self.w(
            "/proc/meminfo",
            f"MemTotal:       {total} kB\nMemFree:        {total // 8} kB\nMemAvailable:   {total // 5} kB\n"
            f"Buffers:          204800 kB\nCached:         {total // 10} kB\nSwapCached:        10240 kB\n"
            f"AnonPages:      {total // 2} kB\nAnonHugePages:  {total // 4} kB\nSwapTotal:      {st} kB\n"
            f"SwapFree:       {sf} kB\nHugePages_Total:       0\nHugePages_Free:        0\nHugepagesize:       2048 kB\n",
        )

    def stat(self, ncpu: int, busy: float, uptime_s: int = 864000, steal: int = 0) -> None:
        ticks = uptime_s * 100 * ncpu
        b = int(ticks * busy)
        user, system, irq = int(b * 0.80), int(b * 0.15), int(b * 0.01)
        softirq = b - user - system - irq
        user -= steal
        idle = ticks - b
        guest = int(user * 0.9)
        lines = [f"cpu  {user} 0 {system} {idle - idle // 50} {idle // 50} {irq} {softirq} {steal} {guest} 0"]
        for i in range(ncpu):
            lines.append(
                f"cpu{i} {user // ncpu} 0 {system // ncpu} {idle // ncpu} 0 {irq // ncpu} {softirq // ncpu} 0 0 0"
            )
        lines += ["intr 0", "ctxt 123456789", "btime 1700000000", "processes 42424", "procs_running 3"]
        self.w("/proc/stat", "\n".join(lines))
        self.w("/proc/uptime", f"{uptime_s}.42 {uptime_s * ncpu // 2}.10")

    def sysctl(self, values: dict[str, str]) -> None:
        for key, value in values.items():
            self.w("/proc/sys/" + key.replace(".", "/"), value)

    def block(self, name: str, scheduler: str, rotational: int) -> None:
        self.w(f"/sys/block/{name}/queue/scheduler", scheduler)
        self.w(f"/sys/block/{name}/queue/rotational", str(rotational))

    def ksm(self, values: dict[str, int]) -> None:
        for k, v in values.items():
            self.w(f"/sys/kernel/mm/ksm/{k}", str(v))

    def netdev(
        self, name: str, kind: str, mtu: int, *, qlen: int = 1000, rxq: int = 1, rps: str = "0", speed: int | None = None,
        master: str | None = None, lower: str | None = None, tx_dropped: int = 0, oper: str = "up", numa: int = -1,
        ports: list[str] | None = None,
    ) -> None:
        base = f"/sys/class/net/{name}"
        self.w(f"{base}/mtu", str(mtu))
        self.w(f"{base}/tx_queue_len", str(qlen))
        self.w(f"{base}/operstate", oper)
        self.w(f"{base}/statistics/tx_dropped", str(tx_dropped))
        uevent = f"INTERFACE={name}\nIFINDEX={sum(map(ord, name)) % 100 + 2}\n"
        if kind == "bridge":
            uevent += "DEVTYPE=bridge\n"
            self.w(f"{base}/bridge/stp_state", "0")
            self.mkdir(f"{base}/brif")
            for p in ports or []:
                self.link(f"{base}/brif/{p}", f"../../{p}/brport")
        elif kind == "tap":
            self.w(f"{base}/tun_flags", "0x1002")
        elif kind == "macvtap":
            self.w(f"{base}/macvtap/tap{sum(map(ord, name)) % 100 + 10}/dev", "239:1")
        elif kind == "physical":
            self.mkdir(f"{base}/device")
            self.w(f"{base}/device/numa_node", str(numa))
            if speed is not None:
                self.w(f"{base}/speed", str(speed))
        self.w(f"{base}/uevent", uevent)
        for q in range(rxq):
            self.w(f"{base}/queues/rx-{q}/rps_cpus", rps)
            self.mkdir(f"{base}/queues/tx-{q}")
        if master:
            self.link(f"{base}/master", f"../{master}")
        if lower:
            self.link(f"{base}/lower_{lower}", f"../{lower}")

    def qemu(self, pid: int, argv: list[str]) -> None:
        self.w(f"/proc/{pid}/cmdline", b"\0".join(a.encode() for a in argv) + b"\0")
        self.w(f"/proc/{pid}/comm", argv[0].rsplit("/", 1)[-1][:15])

    def kthread(self, pid: int, comm: str, utime: int, stime: int, start: int) -> None:
        self.w(f"/proc/{pid}/comm", comm)
        self.w(f"/proc/{pid}/cmdline", b"")
        fields = ["S", "2", "0", "0", "0", "-1", "69238880", "0", "0", "0", "0", str(utime), str(stime),
                  "0", "0", "25", "5", "1", "0", str(start)] + ["0"] * 32
        self.w(f"/proc/{pid}/stat", f"{pid} ({comm}) " + " ".join(fields))

    def task(self, pid: int, tid: int, comm: str, allowed: str) -> None:
        self.w(f"/proc/{pid}/task/{tid}/comm", comm)
        self.w(f"/proc/{pid}/task/{tid}/status", f"Name:\t{comm}\nState:\tS (sleeping)\nTgid:\t{pid}\n"
                                                  f"Pid:\t{tid}\nCpus_allowed_list:\t{allowed}\n")

    def softnet(self, ncpu: int, drops: dict[int, int]) -> None:
        lines = []
        for c in range(ncpu):
            lines.append(" ".join(f"{v:08x}" for v in [123456 + c, drops.get(c, 0), 3, 0, 0, 0, 0, 0, 0, 0, 0, c]))
        self.w("/proc/net/softnet_stat", "\n".join(lines))

    def devnodes(self, *paths: str) -> None:
        for p in paths:
            self.w(p, "")


def rhel6(t: Tree) -> None:
    t.w("/proc/sys/kernel/osrelease", "2.6.32-754.35.1.el6.x86_64")
    t.w("/proc/cmdline", "ro root=/dev/mapper/vg_kvm01-lv_root rd_NO_LUKS LANG=en_US.UTF-8 crashkernel=auto rhgb quiet")
    t.cpus(8, "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush dts acpi mmx fxsr "
              "sse sse2 ss ht tm pbe syscall nx rdtscp lm constant_tsc pni ssse3 cx16 sse4_1 sse4_2 popcnt lahf_lm "
              "vmx flexpriority ept vpid", "Intel(R) Xeon(R) CPU E5620 @ 2.40GHz")
    t.meminfo(32, 8, 0)
    t.w("/proc/swaps", "Filename\t\t\t\tType\t\tSize\tUsed\tPriority\n/dev/mapper/vg_kvm01-lv_swap partition\t8388600\t0\t-1")
    t.stat(8, 0.45)
    t.block("sda", "noop anticipatory deadline [cfq]", 1)
    t.block("sdb", "noop anticipatory [deadline] cfq", 1)
    t.block("dm-0", "none", 1)
    t.ksm({"run": 1, "pages_shared": 1200, "pages_sharing": 3100, "pages_unshared": 91000, "pages_volatile": 5200,
           "full_scans": 412, "pages_to_scan": 100, "sleep_millisecs": 20})
    t.w("/sys/kernel/mm/redhat_transparent_hugepage/enabled", "[always] madvise never")
    t.w("/sys/kernel/mm/redhat_transparent_hugepage/defrag", "[always] madvise never")
    t.sysctl({
        "vm.swappiness": "60", "vm.dirty_ratio": "10", "vm.dirty_background_ratio": "3",
        "kernel.sched_min_granularity_ns": "10000000", "kernel.sched_wakeup_granularity_ns": "15000000",
        "kernel.sched_migration_cost": "500000",
        "net.ipv4.tcp_tw_reuse": "1", "net.ipv4.tcp_tw_recycle": "1", "net.ipv4.tcp_fin_timeout": "1",
        "net.ipv4.tcp_low_latency": "0", "net.ipv4.tcp_congestion_control": "cubic",
        "net.ipv4.tcp_limit_output_bytes": "131072", "net.ipv4.tcp_max_tw_buckets": "450000",
        "net.ipv4.tcp_rmem": "4096\t87380\t4136960", "net.ipv4.tcp_wmem": "4096\t16384\t4136960",
        "net.core.rmem_max": "4136960", "net.core.wmem_max": "4136960", "net.core.netdev_max_backlog": "25000",
        "kernel.random.entropy_avail": "140", "kernel.random.poolsize": "4096",
    })
    t.w("/etc/sysctl.conf", """# Kernel sysctl configuration file for Red Hat Linux
net.ipv4.ip_forward = 0
kernel.sysrq = 0

# KVM host tuning (copied from the 2012 virtualization guide and the network paper)
vm.dirty_ratio = 10
vm.dirty_background_ratio = 3
kernel.sched_min_granularity_ns = 10000000
kernel.sched_wakeup_granularity_ns = 15000000
net.core.netdev_max_backlog = 25000
net.core.rmem_max = 4136960
net.core.wmem_max = 4136960
net.ipv4.tcp_fin_timeout = 1
net.ipv4.tcp_limit_output_bytes = 131072
net.ipv4.tcp_max_tw_buckets = 450000
net.ipv4.tcp_rmem = 4096 87380 4136960
net.ipv4.tcp_tw_reuse = 1
net.ipv4.tcp_tw_recycle = 1
net.ipv4.tcp_wmem = 4096 16384 4136960
""")
    t.softnet(8, {})
    t.devnodes("/dev/kvm", "/dev/net/tun")
    t.w("/sys/module/kvm/parameters/ignore_msrs", "N")
    t.w("/sys/module/kvm/parameters/oos_shadow", "Y")
    t.netdev("lo", "loopback", 16436, qlen=0)
    t.netdev("br0", "bridge", 1500, ports=["eth0", "vnet0"])
    t.netdev("eth0", "physical", 9000, rxq=1, rps="00", speed=1000, master="br0")
    t.netdev("vnet0", "tap", 1500, qlen=500, master="br0")
    t.w("/proc/mounts", """rootfs / rootfs rw 0 0
proc /proc proc rw,relatime 0 0
sysfs /sys sysfs rw,relatime 0 0
/dev/mapper/vg_kvm01-lv_root / ext4 rw,relatime,barrier=1,data=ordered 0 0
/dev/sda1 /boot ext4 rw,relatime,barrier=1,data=ordered 0 0
/dev/mapper/vg_kvm01-lv_images /var/lib/libvirt/images ext4 rw,noatime,nobarrier,data=ordered 0 0
""")
    t.qemu(2345, ["/usr/libexec/qemu-kvm", "-name", "rhel6guest", "-S", "-M", "rhel6.6.0", "-enable-kvm", "-m", "2048",
                  "-smp", "2,sockets=2,cores=1,threads=1", "-nodefaults",
                  "-drive", "file=/var/lib/libvirt/images/rhel6guest.img,if=none,id=drive-virtio-disk0,format=raw,cache=none",
                  "-device", "virtio-blk-pci,bus=pci.0,addr=0x5,drive=drive-virtio-disk0,id=virtio-disk0",
                  "-netdev", "tap,fd=22,id=hostnet0",
                  "-device", "virtio-net-pci,netdev=hostnet0,id=net0,mac=52:54:00:12:34:56"])
    # ksmd: 6.5 % of one CPU over 10 days of uptime
    t.kthread(27, "ksmd", 4_900_000, 716_000, 180)


def nvme_modern(t: Tree) -> None:
    t.w("/proc/sys/kernel/osrelease", "6.8.0-45-generic")
    t.w("/proc/cmdline", "BOOT_IMAGE=/vmlinuz-6.8.0-45-generic root=UUID=3f1d2c4e-8a9b-4c7d-9e0f-112233445566 ro "
                         "amd_iommu=on iommu=pt")
    flags = ("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ht "
             "syscall nx mmxext fxsr_opt pdpe1gb rdtscp lm constant_tsc rep_good nopl nonstop_tsc cpuid extd_apicid "
             "aperfmperf pni pclmulqdq monitor ssse3 fma cx16 sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c "
             "rdrand lahf_lm cmp_legacy svm extapic cr8_legacy abm sse4a misalignsse 3dnowprefetch osvw ibs skinit "
             "wdt tce topoext perfctr_core perfctr_nb bpext perfctr_llc mwaitx cpb cat_l3 cdp_l3 hw_pstate ssbd mba "
             "ibrs ibpb stibp vmmcall fsgsbase bmi1 avx2 smep bmi2 erms invpcid cqm rdt_a rdseed adx smap clflushopt "
             "clwb sha_ni xsaveopt xsavec xgetbv1 xsaves npt lbrv svm_lock nrip_save tsc_scale vmcb_clean "
             "flushbyasid decodeassists pausefilter pfthreshold avic v_vmsave_vmload vgif")
    t.cpus(32, flags, "AMD EPYC 7313 16-Core Processor", nodes=2)
    t.meminfo(256, 8, 0)
    t.w("/proc/swaps", "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n/swap.img\tfile\t\t8388604\t\t0\t\t-2")
    t.stat(32, 0.38)
    t.block("nvme0n1", "[none] mq-deadline kyber bfq", 0)
    t.block("nvme1n1", "[none] mq-deadline kyber bfq", 0)
    t.block("sda", "[mq-deadline] kyber bfq none", 1)
    t.block("loop0", "[none] mq-deadline", 0)
    t.ksm({"run": 0, "pages_shared": 0, "pages_sharing": 0, "pages_unshared": 0, "pages_volatile": 0,
           "full_scans": 0, "pages_to_scan": 100, "sleep_millisecs": 20, "merge_across_nodes": 1,
           "use_zero_pages": 0, "ksm_zero_pages": 0, "general_profit": 0, "max_page_sharing": 256})
    t.w("/sys/kernel/mm/transparent_hugepage/enabled", "always [madvise] never")
    t.w("/sys/kernel/mm/transparent_hugepage/defrag", "always defer defer+madvise [madvise] never")
    t.sysctl({
        "vm.swappiness": "10", "vm.dirty_ratio": "40", "vm.dirty_background_ratio": "5",
        "net.ipv4.tcp_tw_reuse": "2", "net.ipv4.tcp_fin_timeout": "60", "net.ipv4.tcp_low_latency": "0",
        "net.ipv4.tcp_congestion_control": "cubic",
        "net.ipv4.tcp_rmem": "4096\t131072\t16777216", "net.ipv4.tcp_wmem": "4096\t16384\t16777216",
        "net.ipv4.tcp_limit_output_bytes": "1048576", "net.ipv4.tcp_slow_start_after_idle": "1",
        "net.ipv4.tcp_notsent_lowat": "4294967295",
        "net.core.rmem_max": "212992", "net.core.wmem_max": "212992", "net.core.netdev_max_backlog": "1000",
        "kernel.random.entropy_avail": "256", "kernel.random.poolsize": "256",
    })
    t.w("/etc/tuned/active_profile", "virtual-host")
    t.w("/usr/lib/sysctl.d/50-default.conf", "kernel.sysrq = 16\nnet.core.default_qdisc = fq_codel\n")
    t.w("/etc/sysctl.d/99-tuned-network.conf", "net.ipv4.tcp_rmem = 4096 131072 16777216\n"
                                               "net.ipv4.tcp_wmem = 4096 16384 16777216\n")
    t.softnet(32, {})
    t.devnodes("/dev/kvm", "/dev/vhost-net", "/dev/net/tun")
    t.w("/sys/module/kvm/parameters/halt_poll_ns", "200000")
    t.w("/sys/module/kvm/parameters/halt_poll_ns_grow", "2")
    t.netdev("lo", "loopback", 65536, qlen=1000)
    t.netdev("br0", "bridge", 9000, ports=["ens1f0", "vnet0", "vnet1"])
    t.netdev("ens1f0", "physical", 9000, rxq=32, speed=25000, master="br0", numa=0)
    t.netdev("ens1f1", "physical", 9000, rxq=32, speed=25000, numa=1)
    t.netdev("eno1", "physical", 1500, rxq=8, speed=1000, numa=0, oper="down")
    t.netdev("vnet0", "tap", 9000, qlen=1000, master="br0")
    t.netdev("vnet1", "tap", 9000, qlen=1000, master="br0")
    t.netdev("macvtap0", "macvtap", 9000, qlen=500, lower="ens1f1")
    t.w("/proc/mounts", """sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0
proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0
/dev/nvme0n1p2 / ext4 rw,relatime 0 0
/dev/nvme0n1p1 /boot/efi vfat rw,relatime,fmask=0077,dmask=0077 0 0
/dev/nvme1n1p1 /var/lib/libvirt/images xfs rw,noatime,attr2,inode64,logbufs=8,logbsize=32k,noquota 0 0
""")
    for i in range(4):
        t.qemu(4100 + i, ["/usr/bin/qemu-system-x86_64", "-name", f"guest=app{i:02d},debug-threads=on", "-S",
                          "-machine", "pc-q35-8.2,usb=off,dump-guest-core=off", "-accel", "kvm",
                          "-cpu", "host,migratable=on", "-m", "size=33554432k",
                          "-smp", "8,sockets=1,dies=1,cores=8,threads=1",
                          "-blockdev", f'{{"driver":"file","filename":"/var/lib/libvirt/images/app{i:02d}.qcow2",'
                          '"node-name":"libvirt-1-storage","cache":{"direct":true,"no-flush":false},"aio":"native"}',
                          "-device", f"virtio-net-pci,netdev=hostnet0,id=net0,mac=52:54:00:aa:00:{i:02x}",
                          "-netdev", '{"type":"tap","fd":"30","vhost":true,"vhostfd":"31","id":"hostnet0"}'])


def ksm_overcommit(t: Tree) -> None:
    t.w("/proc/sys/kernel/osrelease", "5.14.0-427.13.1.el9_4.x86_64")
    t.w("/proc/cmdline", "BOOT_IMAGE=(hd0,gpt2)/vmlinuz-5.14.0-427.13.1.el9_4.x86_64 root=/dev/mapper/rhel-root ro "
                         "crashkernel=1G-4G:192M,4G-64G:256M,64G-:512M resume=/dev/mapper/rhel-swap rd.lvm.lv=rhel/root "
                         "rd.lvm.lv=rhel/swap intel_iommu=on")
    t.cpus(16, "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush dts acpi mmx fxsr "
               "sse sse2 ss ht tm pbe syscall nx pdpe1gb rdtscp lm constant_tsc arch_perfmon pebs bts rep_good nopl "
               "xtopology nonstop_tsc cpuid aperfmperf pni pclmulqdq dtes64 monitor ds_cpl vmx smx est tm2 ssse3 sdbg "
               "fma cx16 xtpr pdcm pcid dca sse4_1 sse4_2 x2apic movbe popcnt tsc_deadline_timer aes xsave avx f16c "
               "rdrand lahf_lm abm 3dnowprefetch cpuid_fault epb cat_l3 cdp_l3 invpcid_single intel_ppin ssbd mba "
               "ibrs ibpb stibp tpr_shadow vnmi flexpriority ept vpid ept_ad fsgsbase tsc_adjust bmi1 hle avx2 smep "
               "bmi2 erms invpcid rtm cqm mpx rdt_a avx512f avx512dq rdseed adx smap clflushopt clwb intel_pt",
           "Intel(R) Xeon(R) Silver 4110 CPU @ 2.10GHz", nodes=2)
    t.meminfo(64, 16, 6)
    t.w("/proc/swaps", "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n"
                       f"/dev/dm-1                               partition\t16777212\t{6 * GiB_KB}\t\t-2")
    t.stat(16, 0.88, steal=0)
    t.block("sda", "[mq-deadline] kyber bfq none", 0)
    t.block("nvme0n1", "mq-deadline kyber [bfq] none", 0)
    t.block("dm-0", "none", 0)
    t.ksm({"run": 1, "pages_shared": 524288, "pages_sharing": 3145728, "pages_unshared": 1048576,
           "pages_volatile": 262144, "full_scans": 118, "pages_to_scan": 1250, "sleep_millisecs": 20,
           "merge_across_nodes": 1, "use_zero_pages": 0, "ksm_zero_pages": 0, "general_profit": 12683575296,
           "max_page_sharing": 256, "stable_node_chains": 12, "stable_node_dups": 40})
    t.w("/sys/kernel/mm/transparent_hugepage/enabled", "[always] madvise never")
    t.w("/sys/kernel/mm/transparent_hugepage/defrag", "always defer defer+madvise [madvise] never")
    t.sysctl({
        "vm.swappiness": "60", "vm.dirty_ratio": "40", "vm.dirty_background_ratio": "5",
        "kernel.sched_migration_cost_ns": "500000",
        "net.ipv4.tcp_tw_reuse": "2", "net.ipv4.tcp_fin_timeout": "60", "net.ipv4.tcp_low_latency": "0",
        "net.ipv4.tcp_congestion_control": "cubic",
        "net.ipv4.tcp_rmem": "4096\t131072\t6291456", "net.ipv4.tcp_wmem": "4096\t16384\t4194304",
        "net.core.rmem_max": "212992", "net.core.wmem_max": "212992", "net.core.netdev_max_backlog": "1000",
        "kernel.random.entropy_avail": "256", "kernel.random.poolsize": "256",
    })
    t.w("/etc/tuned/active_profile", "virtual-host")
    t.softnet(16, {3: 0x3039, 11: 0x1a2})
    t.devnodes("/dev/kvm", "/dev/vhost-net", "/dev/net/tun")
    t.w("/sys/module/kvm/parameters/halt_poll_ns", "200000")
    t.netdev("lo", "loopback", 65536)
    t.netdev("br0", "bridge", 1500, ports=["eno1"] + [f"vnet{i}" for i in range(12)])
    t.netdev("eno1", "physical", 1500, rxq=8, speed=10000, master="br0", numa=0)
    for i in range(12):
        t.netdev(f"vnet{i}", "tap", 1500, qlen=1000, master="br0", tx_dropped=18234 if i == 3 else 0)
    t.w("/proc/mounts", """proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0
/dev/mapper/rhel-root / xfs rw,relatime,attr2,inode64,logbufs=8,logbsize=32k,noquota 0 0
/dev/sda1 /boot xfs rw,relatime,attr2,inode64,logbufs=8,logbsize=32k,noquota 0 0
/dev/mapper/rhel-images /var/lib/libvirt/images xfs rw,noatime,attr2,inode64,noquota 0 0
""")
    for i in range(12):
        t.qemu(5200 + i, ["/usr/libexec/qemu-kvm", "-name", f"guest=web{i:02d},debug-threads=on", "-S",
                          "-machine", "pc-q35-rhel9.2.0,usb=off", "-accel", "kvm", "-cpu", "host",
                          "-m", "8192", "-overcommit", "mem-lock=off", "-smp", "6,sockets=6,cores=1,threads=1",
                          "-blockdev", f'{{"driver":"file","filename":"/var/lib/libvirt/images/web{i:02d}.qcow2",'
                          '"node-name":"libvirt-1-storage","cache":{"direct":true,"no-flush":false}}',
                          "-netdev", '{"type":"tap","fd":"30","vhost":true,"vhostfd":"31","id":"hostnet0"}',
                          "-device", f"virtio-net-pci,netdev=hostnet0,id=net0,mac=52:54:00:bb:00:{i:02x}",
                          "-device", "virtio-balloon-pci,id=balloon0"])
    # ksmd: 12 % of one CPU over 10 days
    t.kthread(58, "ksmd", 9_500_000, 870_000, 250)


def pinned_latency(t: Tree) -> None:
    t.w("/proc/sys/kernel/osrelease", "6.1.0-26-amd64")
    t.w("/proc/cmdline", "BOOT_IMAGE=/boot/vmlinuz-6.1.0-26-amd64 root=UUID=0c9a7e51-5b3d-4f0e-9a61-7d2b3c4d5e6f ro "
                         "quiet intel_iommu=on")
    t.cpus(16, "fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush dts acpi mmx fxsr "
               "sse sse2 ss ht tm pbe syscall nx pdpe1gb rdtscp lm constant_tsc arch_perfmon nonstop_tsc cpuid "
               "aperfmperf pni pclmulqdq monitor vmx est ssse3 fma cx16 sse4_1 sse4_2 x2apic movbe popcnt "
               "tsc_deadline_timer aes xsave avx f16c rdrand lahf_lm abm epb ept vpid avx2 invtsc",
           "Intel(R) Xeon(R) Gold 6226R CPU @ 2.90GHz", nodes=2, smt=2)
    total = 128 * GiB_KB
    t.w("/proc/meminfo", f"MemTotal:       {total} kB\nMemFree:        {total // 3} kB\n"
                         f"MemAvailable:   {total // 3} kB\nSwapTotal:      0 kB\nSwapFree:       0 kB\n"
                         "AnonHugePages:  0 kB\nHugePages_Total:    8192\nHugePages_Free:     8192\n"
                         "HugePages_Rsvd:        0\nHugePages_Surp:        0\nHugepagesize:       2048 kB\n")
    t.w("/proc/swaps", "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority")
    t.stat(16, 0.30)
    t.block("nvme0n1", "[none] mq-deadline kyber bfq", 0)
    t.w("/sys/kernel/mm/transparent_hugepage/enabled", "always [madvise] never")
    t.w("/sys/kernel/mm/transparent_hugepage/defrag", "always defer defer+madvise [madvise] never")
    t.sysctl({
        "vm.swappiness": "10", "vm.dirty_ratio": "40", "vm.dirty_background_ratio": "5",
        "vm.zone_reclaim_mode": "1", "kernel.numa_balancing": "1",
        "net.ipv4.tcp_tw_reuse": "2", "net.ipv4.tcp_congestion_control": "cubic",
        "net.ipv4.tcp_rmem": "4096\t131072\t6291456", "net.ipv4.tcp_wmem": "4096\t16384\t4194304",
        "net.core.netdev_max_backlog": "1000",
        "kernel.random.entropy_avail": "256", "kernel.random.poolsize": "256",
    })
    t.w("/etc/sysctl.d/60-numa.conf", "# from the HPC image this host was built from\nvm.zone_reclaim_mode = 1\n")
    t.w("/etc/tuned/active_profile", "realtime-virtual-host")  # chosen, but tuned.service is stopped
    for cpu in range(16):
        base = f"/sys/devices/system/cpu/cpu{cpu}"
        t.w(f"{base}/cpufreq/scaling_governor", "powersave")
        t.w(f"{base}/power/energy_perf_bias", "6")
    for n, (name, latency) in enumerate([("POLL", 0), ("C1", 2), ("C1E", 10), ("C6", 133)]):
        t.w(f"/sys/devices/system/cpu/cpu0/cpuidle/state{n}/name", name)
        t.w(f"/sys/devices/system/cpu/cpu0/cpuidle/state{n}/latency", str(latency))
        t.w(f"/sys/devices/system/cpu/cpu0/cpuidle/state{n}/disable", "0")
    for group in range(4):
        t.w(f"/sys/kernel/iommu_groups/{group}/type", "DMA-FQ")
    for irq in (0, 8, 9, 24, 25, 26, 27):
        t.w(f"/proc/irq/{irq}/smp_affinity_list", "0-15" if irq < 24 else str(2 + irq - 24))
    t.w("/etc/default/irqbalance", "#IRQBALANCE_BANNED_CPULIST=\nIRQBALANCE_ONESHOT=\n")
    t.kthread(811, "irqbalance", 1200, 800, 900)
    t.softnet(16, {})
    t.devnodes("/dev/kvm", "/dev/vhost-net", "/dev/net/tun")
    t.w("/sys/module/kvm/parameters/halt_poll_ns", "200000")
    t.netdev("lo", "loopback", 65536)
    t.netdev("br0", "bridge", 1500, ports=["eno1", "vnet0", "vnet1"])
    t.netdev("eno1", "physical", 1500, rxq=8, speed=10000, master="br0", numa=0)
    t.netdev("vnet0", "tap", 1500, master="br0")
    t.netdev("vnet1", "tap", 1500, master="br0")
    t.w("/proc/mounts", "proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0\n/dev/nvme0n1p2 / ext4 rw,relatime 0 0\n")
    # two guests, vCPUs pinned 2-5 and 6-9 (libvirt <vcpupin>), emulator threads left on all CPUs
    for i, first in enumerate((2, 6)):
        pid = 6100 + i
        argv = ["/usr/bin/qemu-system-x86_64", "-name", f"guest=rt{i},debug-threads=on", "-S",
                "-machine", "pc-q35-7.2,usb=off", "-accel", "kvm", "-cpu", "host,migratable=on", "-m", "8192",
                "-smp", "4,sockets=1,dies=1,cores=4,threads=1",
                "-blockdev", f'{{"driver":"file","filename":"/var/lib/libvirt/images/rt{i}.qcow2",'
                '"node-name":"libvirt-1-storage","cache":{"direct":true,"no-flush":false},"aio":"native"}',
                "-netdev", '{"type":"tap","fd":"30","vhost":true,"vhostfd":"31","id":"hostnet0"}',
                "-device", f"virtio-net-pci,netdev=hostnet0,id=net0,mac=52:54:00:cc:00:{i:02x}"]
        if i == 1:
            argv += ["-device", "vfio-pci,host=0000:3b:00.1,id=hostdev0,bus=pci.5,addr=0x0"]
        t.qemu(pid, argv)
        t.task(pid, pid, "qemu-system-x86", "0-15")
        for v in range(4):
            t.task(pid, pid + 10 + v, f"CPU {v}/KVM", str(first + v))


SCENARIOS = {"rhel6-old": rhel6, "nvme-modern": nvme_modern, "ksm-overcommit": ksm_overcommit,
             "pinned-latency": pinned_latency}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(HERE / "tests" / "fixtures" / "hosts"))
    ap.add_argument("scenario", nargs="*", default=list(SCENARIOS))
    args = ap.parse_args()
    for name in args.scenario:
        t = Tree(Path(args.out) / name)
        SCENARIOS[name](t)
        print(f"wrote {t.root}")


if __name__ == "__main__":
    main()
