"""Unix sockets named by another user's process (a QEMU command line's QMP or guest-agent path).

Such a path lies in a directory its owner controls: between the check that it is a socket owned by
that user and the connect(), the owner could swap it for a link to someone else's socket, which
root would follow. :func:`same_socket` hands out a path that reaches only the inode that was
checked (``/proc/self/fd/N`` of an ``O_PATH|O_NOFOLLOW`` descriptor), for the time of the connect.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


class SocketChanged(OSError):
    """The path no longer names the socket that was checked."""


@contextlib.contextmanager
def same_socket(path: str, checked: os.stat_result) -> Iterator[str]:
    """A path to connect to that names exactly the socket ``checked`` describes, never a link's target.

    Raises OSError when ``path`` cannot be opened, and SocketChanged when it names another inode than
    the one checked: a link put in its place is opened as the link itself, so it is refused too."""
    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (checked.st_dev, checked.st_ino):
            raise SocketChanged(f"{path}: changed after it was checked")
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)
