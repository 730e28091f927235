"""``kvmtune guest run --load disk --job OPTIONS``: fio options after the disk load's defaults, hostile ones refused."""

from __future__ import annotations

import pytest

from kvmtune.cli import main
from kvmtune.lab.loadguest import DISK_DEFAULTS, disk_fio_argv, parse_job
from kvmtune.qemuopts import OptionError


def test_the_job_overrides_the_defaults_and_libaio_is_the_default_engine() -> None:
    assert DISK_DEFAULTS["ioengine"] == "libaio"
    argv = disk_fio_argv(parse_job("rw=randrw rwmixread=70 bs=16k iodepth=8"))
    assert argv[:3] == ["fio", "--name=load", "--filename=/dev/vda"]
    assert "--bs=16k" in argv and "--bs=4k" not in argv
    assert "--iodepth=8" in argv and "--iodepth=1" not in argv
    assert "--rwmixread=70" in argv and "--ioengine=libaio" in argv and "--direct=1" in argv
    assert disk_fio_argv()[-4:] == ["--rw=randrw", "--bs=4k", "--ioengine=libaio", "--iodepth=1"]


def test_a_job_may_name_its_options_with_dashes_and_extra_spaces() -> None:
    assert parse_job("  --bs=1m   rw=write ioengine=psync ") == {"bs": "1m", "rw": "write", "ioengine": "psync"}


@pytest.mark.parametrize("job", [
    "bs=16k\nfilename=/dev/sda",           # a second line
    "bs=16k\u2028rw=read",                  # a Unicode line separator
    "bs=16k\rrw=read",
    "bs=16k;reboot",                        # shell separator
    "bs=16k && reboot",
    "bs=$(reboot)",
    "bs=`reboot`",
    "bs=16k|sh",
    "--filename=/dev/sda",                   # another disk
    "filename=/dev/vda",
    "ioengine=external:/tmp/evil.so",        # an engine loaded from a file
    "ioengine=external",
    "exec_prerun=/bin/sh",
    "bs=16k bs=4k",                          # duplicate key
    "bs=16k,4k",                             # fio's own value separator
    "bs=*",                                  # a glob
    "rw=randrw rwmixread=700",
    "iodepth=0",
    "iodepth=\uff18",                         # a full-width digit
    "bs",
    "=16k",
    "x" * 600,
])
def test_a_hostile_job_is_refused_with_one_line(job: str) -> None:
    with pytest.raises(OptionError) as exc:
        parse_job(job)
    assert "\n" not in str(exc.value) and str(exc.value).startswith("--job: ")


def test_the_cli_refuses_a_hostile_job_with_exit_2_and_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["guest", "run", "--load", "disk", "--job", "bs=4k\nfilename=/dev/sda;rm -rf /"])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("kvmtune: --job: "), err


def test_the_cli_takes_a_job_only_with_the_disk_load(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["guest", "run", "--load", "cpu", "--job", "bs=4k"]) == 2
    assert "--job is for --load disk" in capsys.readouterr().err


def test_fio_on_this_host_links_libaio_so_the_probe_guest_carries_it() -> None:
    import shutil

    from kvmtune.lab.guest import shared_libs
    from kvmtune.runner import Runner

    fio = shutil.which("fio")
    if fio is None:
        pytest.skip("fio is not installed")
    assert any("libaio.so" in lib for lib in shared_libs(Runner(), fio))
