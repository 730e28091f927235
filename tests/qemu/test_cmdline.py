"""QEMU command-line parsing: option syntax and the effective settings derived from it."""

from __future__ import annotations

import pytest

from kvmtune.errors import InputError
from kvmtune.qemu.argv import parse_keyval
from kvmtune.qemu.cmdline import effective_cache, guest_from_argv, guest_from_text


def test_keyval_with_escaped_comma_and_implied_key() -> None:
    assert parse_keyval("virtio-blk-pci,drive=d0,serial=a,,b", "driver") == {
        "driver": "virtio-blk-pci", "drive": "d0", "serial": "a,b"}
    assert parse_keyval("file=/img/x.qcow2,if=none,readonly") == {"file": "/img/x.qcow2", "if": "none", "readonly": "on"}


def test_keyval_json_is_flattened() -> None:
    props = parse_keyval('{"driver":"file","filename":"/x","cache":{"direct":true,"no-flush":false}}')
    assert props["cache.direct"] is True and props["cache.no-flush"] is False and props["filename"] == "/x"


def test_keyval_bad_json() -> None:
    with pytest.raises(ValueError, match="invalid JSON"):
        parse_keyval('{"driver": }')


@pytest.mark.parametrize(
    ("direct", "no_flush", "wce", "mode"),
    [
        (True, False, True, "none"),
        (True, False, False, "directsync"),
        (False, False, True, "writeback"),
        (False, False, False, "writethrough"),
        (False, True, True, "unsafe"),
        (None, None, None, None),
    ],
)
def test_effective_cache_table(direct: bool | None, no_flush: bool | None, wce: bool | None, mode: str | None) -> None:
    assert effective_cache(direct, no_flush, wce) == mode


def test_legacy_drive_and_tap_without_vhost() -> None:
    g = guest_from_argv(
        ["/usr/bin/qemu-system-x86_64", "-enable-kvm", "-m", "2G", "-smp", "4", "-name", "web",
         "-drive", "file=/var/lib/img/web.qcow2,if=virtio,cache=none,aio=native,format=qcow2",
         "-drive", "file=/dev/sdb,if=ide,media=cdrom",
         "-netdev", "tap,id=n0,ifname=tap0,script=no", "-device", "virtio-net-pci,netdev=n0,mac=52:54:00:AA:BB:CC"],
        "test",
    )
    assert (g.name, g.virt_type, g.vcpus, g.memory_kib) == ("web", "kvm", 4, 2 * 1024 * 1024)
    assert g.cpu_model == "qemu64"  # no -cpu: QEMU's default model
    vda, cd = g.disks
    assert (vda.bus, vda.cache, vda.io, vda.format, vda.source_type) == ("virtio", "none", "native", "qcow2", "file")
    assert (cd.device, cd.source_type) == ("cdrom", "block")
    (nic,) = g.nics
    assert (nic.model, nic.type, nic.vhost, nic.mac) == ("virtio", "ethernet", False, "52:54:00:aa:bb:cc")


def test_vhostfd_means_vhost_and_fds_count_queues() -> None:
    g = guest_from_argv(
        ["qemu-system-x86_64", "-netdev", '{"type":"tap","fds":"3:4:5:6","vhost":true,"vhostfds":"7:8:9:10","id":"n0"}',
         "-device", '{"driver":"virtio-net-pci","netdev":"n0","mq":true,"id":"net0"}'],
        "test",
    )
    (nic,) = g.nics
    assert nic.vhost is True and nic.queues == 4 and nic.driver_name == "vhost"


def test_q35_ide_device_is_sata_and_scsi_controller_model() -> None:
    g = guest_from_argv(
        ["qemu-system-x86_64", "-machine", "q35,accel=tcg",
         "-blockdev", '{"driver":"file","filename":"/a.raw","node-name":"p0","aio":"io_uring","cache":{"direct":true}}',
         "-blockdev", '{"driver":"raw","file":"p0","node-name":"f0"}',
         "-device", '{"driver":"ide-hd","bus":"ide.0","drive":"f0","id":"sata0-0-0"}',
         "-device", '{"driver":"lsi","id":"scsi0"}',
         "-blockdev", '{"driver":"host_device","filename":"/dev/vg/x","node-name":"p1"}',
         "-device", '{"driver":"scsi-hd","bus":"scsi0.0","drive":"p1","id":"scsi0-0-0"}'],
        "test",
    )
    sata, scsi = g.disks
    assert (sata.bus, sata.cache, sata.io, sata.format) == ("sata", "none", "io_uring", "raw")
    assert (scsi.bus, scsi.scsi_controller_model, scsi.source_type, scsi.cache) == ("scsi", "lsi", "block", None)
    assert g.virt_type == "qemu"


def test_args_file_text_with_env_and_continuations() -> None:
    text = (
        "LC_ALL=C \\\nPATH=/bin \\\n/usr/bin/qemu-system-x86_64 \\\n"
        "-name guest=g1,debug-threads=on \\\n-cpu host \\\n-accel kvm\n"
    )
    g = guest_from_text(text, "g1.args")
    assert (g.name, g.cpu_mode, g.virt_type) == ("g1", "host-passthrough", "kvm")


def test_not_qemu_is_an_input_error() -> None:
    with pytest.raises(InputError, match="not a QEMU system emulator"):
        guest_from_argv(["/bin/ls", "-l"], "x")
    with pytest.raises(InputError, match="empty command line"):
        guest_from_argv([], "x")


def test_virtio_queue_sizes_are_read() -> None:
    """virtio-blk num-queues/queue-size and virtio-net rx/tx ring sizes (KVM-STO-022, KVM-NET-021)."""
    g = guest_from_text(
        "qemu-system-x86_64 -smp 4 -blockdev driver=file,filename=/v/a.raw,node-name=f0 "
        "-blockdev driver=raw,file=f0,node-name=d0 -device virtio-blk-pci,drive=d0,id=vda,num-queues=2,queue-size=128 "
        "-netdev tap,id=n0,vhost=on,queues=4 -device virtio-net-pci,netdev=n0,mq=on,rx_queue_size=1024,tx_queue_size=256",
        "t",
    )
    (disk,) = g.disks
    assert (disk.queues, disk.queue_size) == (2, 128) and disk.where("queue_size").endswith("queue-size=")
    (nic,) = g.nics
    assert (nic.queues, nic.rx_queue_size, nic.tx_queue_size) == (4, 1024, 256)


def test_agent_socket_of_a_command_line() -> None:
    from kvmtune.qemu.agent_channel import agent_socket_path

    argv = ["qemu-system-x86_64", "-chardev", "socket,path=/run/vm/qga.sock,server=on,wait=off,id=qga0",
            "-device", "virtio-serial-pci", "-device", "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0"]
    assert agent_socket_path(argv) == (True, "/run/vm/qga.sock")
    libvirt_fd = ["qemu-system-x86_64", "-chardev", "socket,id=charchannel0,fd=33,server=on,wait=off",
                  "-device", "virtserialport,chardev=charchannel0,id=channel0,name=org.qemu.guest_agent.0"]
    assert agent_socket_path(libvirt_fd) == (True, None)
    client = ["qemu-system-x86_64", "-chardev", "socket,path=/tmp/other.sock,id=c0",
              "-device", "virtserialport,chardev=c0,name=org.qemu.guest_agent.0"]
    assert agent_socket_path(client) == (True, None)  # QEMU does not listen there: someone else's server
    assert agent_socket_path(["qemu-system-x86_64", "-m", "1G"]) == (False, None)
