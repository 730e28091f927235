"""The pure parsers: real kernel text in, data out; garbage in, a short ValueError."""

from __future__ import annotations

import pytest

from kvmtune.host import parsers as p


def test_bracket_choice() -> None:
    assert p.parse_bracket_choice("always [madvise] never\n") == p.Choice("madvise", ("always", "madvise", "never"))
    assert p.parse_bracket_choice("[none] mq-deadline kyber bfq").current == "none"
    assert p.parse_bracket_choice("noop anticipatory deadline [cfq]").current == "cfq"
    assert p.parse_bracket_choice("none").current == "none"
    for bad in ("", "always madvise never", "[a] [b]", "\x00\x01"):
        with pytest.raises(ValueError):
            p.parse_bracket_choice(bad)


def test_int_and_lists() -> None:
    assert p.parse_int("200000\n") == 200000
    with pytest.raises(ValueError, match="holds 'banana', expected an integer"):
        p.parse_int("banana")
    assert p.parse_int_list("4096\t131072\t6291456\n", 3) == [4096, 131072, 6291456]
    with pytest.raises(ValueError):
        p.parse_int_list("4096 131072", 3)
    assert p.parse_bool_param("Y\n") is True and p.parse_bool_param("0") is False


def test_meminfo() -> None:
    m = p.parse_meminfo("MemTotal:       16384000 kB\nSwapTotal: 0 kB\nHugePages_Total:       4\n")
    assert m == {"MemTotal": 16384000, "SwapTotal": 0, "HugePages_Total": 4}
    with pytest.raises(ValueError):
        p.parse_meminfo("nothing useful")


def test_proc_stat() -> None:
    t = p.parse_proc_stat("cpu  100 0 50 800 50 0 0 0 90 0\ncpu0 100 0 50 800 50 0 0 0 0 0\nintr 1\n")
    assert t.cpus == 1 and t.total == 1000 and t.busy == 150
    old = p.parse_proc_stat("cpu  1 2 3 4\n")  # 2.4-era four counters
    assert old.total == 10
    with pytest.raises(ValueError):
        p.parse_proc_stat("cpu  x y z w\n")


def test_cpu_lists_and_masks() -> None:
    assert p.parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert p.parse_cpu_mask("00000000,0000000f\n") == {0, 1, 2, 3}
    assert p.parse_cpu_mask("0") == set()
    assert p.format_cpu_mask({0, 1, 2, 3, 8}) == "10f"
    with pytest.raises(ValueError):
        p.parse_cpu_mask("zz")


def test_cpuinfo_flags() -> None:
    assert "vmx" in p.parse_cpuinfo_flags("processor\t: 0\nflags\t\t: fpu vmx sse\n")
    assert p.parse_cpuinfo_flags("Features\t: fp asimd\n") == {"fp", "asimd"}


def test_mounts_unescape_and_lookup() -> None:
    ms = p.parse_mounts("/dev/vda / ext4 rw 0 0\nfiler:/v /mnt/my\\040images nfs4 rw,vers=4.2 0 0\n")
    assert ms[1].mountpoint == "/mnt/my images" and ms[1].has_option("vers=4.2")
    assert p.mount_for("/mnt/my images/a.qcow2", ms) is ms[1]
    assert p.mount_for("/mnt/my imagesX/a", ms) is ms[0]


def test_pid_stat_with_odd_comm() -> None:
    fields = " ".join(["S"] + ["0"] * 10 + ["111", "222"] + ["0"] * 6 + ["333"] + ["0"] * 30)
    s = p.parse_pid_stat(f"58 (ksm (d) x) {fields}")
    assert (s.pid, s.comm, s.utime, s.stime, s.starttime) == (58, "ksm (d) x", 111, 222, 333)
    with pytest.raises(ValueError):
        p.parse_pid_stat("garbage")


def test_softnet_swaps_uptime() -> None:
    sn = p.parse_softnet_stat("0001e240 00003039 00000003 00000000\n")
    assert sn[0].dropped == 12345
    sw = p.parse_swaps("Filename Type Size Used Priority\n/dev/zram0 partition 100 50 100\n")
    assert sw[0].is_zram and sw[0].used_kib == 50
    assert p.parse_uptime("864000.42 1.0\n") == pytest.approx(864000.42)


def test_sysctl_conf_and_cmdline() -> None:
    conf = p.parse_sysctl_conf("# c\n; c\nnet.ipv4.tcp_tw_reuse = 1\nnet/core/somaxconn=4096\n-kernel.x = 1 2\n", "f")
    assert [(s.line, s.key, s.value) for s in conf] == [
        (3, "net.ipv4.tcp_tw_reuse", "1"), (4, "net.core.somaxconn", "4096"), (5, "kernel.x", "1 2")
    ]
    assert p.parse_kernel_cmdline("ro quiet elevator=deadline -- init=x") == {"ro": "", "quiet": "", "elevator": "deadline"}


def test_ksm_keeps_good_fields_when_one_is_garbled() -> None:
    k = p.parse_ksm({"run": "1\n", "pages_shared": "100\n", "pages_sharing": "banana", "pages_unshared": "50"})
    assert k.run == 1 and k.pages_shared == 100 and k.pages_sharing is None
    assert k.problems == ["pages_sharing: holds 'banana', expected an integer"]
    good = p.parse_ksm({"pages_shared": "100", "pages_sharing": "800", "pages_unshared": "400"})
    assert good.sharing_ratio == 8.0 and good.waste_ratio == 0.5 and good.saved_bytes() == 800 * 4096
