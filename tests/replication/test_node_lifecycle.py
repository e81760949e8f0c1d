"""A ReplicaNode that cannot bind its address leaves nothing open behind it."""

from __future__ import annotations

import errno
import socket

import pytest

from logstore.replication import ReplicaNode


@pytest.mark.regression(reason="fixed: a node that failed to bind kept its store open and locked")
def test_a_node_that_cannot_bind_closes_its_store(tmp_path):
    taken = socket.create_server(("127.0.0.1", 0))
    try:
        with pytest.raises(OSError) as info:
            ReplicaNode(0, str(tmp_path), taken.getsockname(), {}, b"secret", min_insync_replicas=1)
        assert info.value.errno == errno.EADDRINUSE
        # The data directory is free at once: a node on another port opens it.
        node = ReplicaNode(0, str(tmp_path), ("127.0.0.1", 0), {}, b"secret", min_insync_replicas=1)
        node.stop()
    finally:
        taken.close()
