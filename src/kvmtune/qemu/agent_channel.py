"""Where a QEMU command line connects its guest agent: the socket of the chardev behind the
``virtserialport`` named ``org.qemu.guest_agent.0``.

Only a ``socket`` chardev that QEMU itself listens on (``server=on``) and names by path counts:
a chardev given as a file descriptor (libvirt passes ``fd=N``) belongs to whoever holds it, and a
client socket is another program's server.
"""

from __future__ import annotations

from kvmtune.qemu.argv import parse_options

AGENT_PORT_NAME = "org.qemu.guest_agent.0"
_ON = ("on", "yes", "true", "")


def agent_socket_path(argv: list[str]) -> tuple[bool, str | None]:
    """(the command line has a guest agent port, the path of the socket QEMU listens on for it)."""
    try:
        _, options = parse_options(argv)
    except ValueError:
        return False, None
    sockets: dict[str, str] = {}
    agent_chardevs: list[str] = []
    for opt in options:
        props = opt.props
        if opt.name == "-chardev" and props.get("backend") == "socket":
            path, ident = props.get("path"), props.get("id")
            if isinstance(path, str) and isinstance(ident, str) and str(props.get("server", "off")) in _ON:
                sockets[ident] = path
        elif (opt.name == "-device" and props.get("driver") in ("virtserialport", "virtio-serial-port")
              and props.get("name") == AGENT_PORT_NAME and isinstance(props.get("chardev"), str)):
            agent_chardevs.append(str(props["chardev"]))
    for chardev in agent_chardevs:
        if chardev in sockets:
            return True, sockets[chardev]
    return bool(agent_chardevs), None
