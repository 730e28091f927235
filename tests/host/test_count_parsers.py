"""The small counter parsers why reads cgroup, PSI, /proc/PID/status and sysfs counts with (host/parsers.py): a count
is ASCII digits or nothing, never a crash on a digit ``int`` refuses."""

from __future__ import annotations

from kvmtune.host.parsers import parse_count, parse_flat_keyed, parse_psi_total, parse_status_kib


def test_a_count_is_ascii_digits_or_none() -> None:
    assert parse_count(" 42\n") == 42 and parse_count("0") == 0
    for bad in ("²", "٣", "-1", "+1", "1.5", "", " ", "1 2", "0x10"):
        assert parse_count(bad) is None, bad
    assert parse_count("1\u2028") == 1  # a line break around it is stripped, as around any count


def test_flat_keyed_skips_what_is_not_a_count_and_keeps_the_last_duplicate() -> None:
    text = "usage_usec 10\nnr_throttled ²\nthrottled_usec 5\nthrottled_usec 7\nbad\n\u2028 3\n"
    # U+2028 splits the line: " 3" has no key
    assert parse_flat_keyed(text) == {"usage_usec": 10, "throttled_usec": 7}
    assert parse_flat_keyed(None) == {}


def test_psi_total_reads_the_some_line_only() -> None:
    text = "some avg10=0.00 avg60=0.00 avg300=0.00 total=1234\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=99\n"
    assert parse_psi_total(text) == 1234
    assert parse_psi_total("full avg10=0 total=5\n") is None
    assert parse_psi_total("some total=²\n") is None and parse_psi_total(None) is None


def test_status_kib_takes_the_first_line_of_its_key() -> None:
    text = "Name:\tqemu\nVmSwap:\t  2048 kB\nVmSwap:\t 1 kB\nHugetlbPages:\t²kB\n"
    assert parse_status_kib(text, "VmSwap") == 2048
    assert parse_status_kib(text, "HugetlbPages") is None
    assert parse_status_kib(text, "Anonymous") is None and parse_status_kib("VmSwap:\n", "VmSwap") is None
