"""same_socket: a connect reaches only the socket that was checked, never what a swapped-in link names."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from kvmtune.host.sockets import SocketChanged, same_socket


def _listen(path: Path) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(path))
    s.listen(1)
    return s


def test_connects_to_the_checked_socket(tmp_path: Path) -> None:
    path = tmp_path / "qmp.sock"
    with _listen(path) as server:
        checked = os.lstat(path)
        with same_socket(str(path), checked) as reachable, socket.socket(socket.AF_UNIX) as client:
            client.connect(reachable)
            conn, _ = server.accept()
            conn.close()


def test_a_socket_swapped_after_the_check_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "qmp.sock"
    with _listen(path):
        checked = os.lstat(path)
        path.unlink()
        with _listen(path), pytest.raises(SocketChanged), same_socket(str(path), checked):
            pass


def test_a_link_swapped_in_is_not_followed(tmp_path: Path) -> None:
    other = tmp_path / "someone-elses.sock"
    path = tmp_path / "qmp.sock"
    with _listen(other), _listen(path):
        checked = os.lstat(path)
        path.unlink()
        path.symlink_to(other)
        with pytest.raises(SocketChanged), same_socket(str(path), checked):
            pass  # O_PATH|O_NOFOLLOW opens the link itself, whose inode is not the socket checked
