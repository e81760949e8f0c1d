"""The node on the network layer: its metrics include the listener's, handlers are looked up per
request, and a request of an API the node does not serve closes only its own connection."""

from __future__ import annotations

import socket
import struct

from logstore.replication import Client
from logstore.replica.client import DESCRIBE_QUORUM, NodeConnection

from .test_inprocess import SECRET
from .test_server import single

NET = "kafka.server:type=socket-server-metrics,listener=kafka,name="
QUORUM = {"topics": [{"topic_name": "replicated", "partitions": [{"partition_index": 0}]}]}


def test_node_metrics_include_the_network_layers(tmp_path):
    node = single(tmp_path)
    try:
        before = node.metrics()
        client = Client([node.address], SECRET)
        client.produce("replicated", 0, [b"x"], acks=1)
        client.fetch("replicated", 0, 0)
        client.close()
        after = node.metrics()
        assert after[NET + "request-total"] - before[NET + "request-total"] >= 2
        assert after[NET + "successful-authentication-total"] > before[NET + "successful-authentication-total"]
        assert after[NET + "incoming-byte-total"] > before[NET + "incoming-byte-total"]
        assert "kafka.server:type=ReplicaManager,name=UnderReplicatedPartitions" in after
    finally:
        node.stop()


def test_handlers_are_looked_up_for_every_request(tmp_path):
    node = single(tmp_path)
    conn = NodeConnection(node.address, SECRET, -1, 5.0)
    handlers = node.kafka._apis.handlers
    original = handlers[DESCRIBE_QUORUM]
    try:
        assert conn.request(DESCRIBE_QUORUM, QUORUM).topics[0].partitions[0].leader_id == 0

        def replaced(request):
            answer = original(request)
            answer["topics"][0]["partitions"][0]["leader_id"] = 42
            return answer

        handlers[DESCRIBE_QUORUM] = replaced
        assert conn.request(DESCRIBE_QUORUM, QUORUM).topics[0].partitions[0].leader_id == 42  # same connection
    finally:
        handlers[DESCRIBE_QUORUM] = original
        conn.close()
        node.stop()


def test_an_unserved_api_closes_only_its_own_connection(tmp_path):
    node = single(tmp_path)
    other = NodeConnection(node.address, SECRET, -1, 5.0)
    try:
        with socket.create_connection(node.address, timeout=5) as sock:
            # ApiVersions is answered before the login; API key 99 is no API at all.
            header = struct.pack(">hhih", 99, 0, 7, -1)
            sock.sendall(struct.pack(">i", len(header)) + header)
            assert sock.recv(100) == b""  # closed without an answer
        assert other.request(DESCRIBE_QUORUM, QUORUM).topics[0].partitions[0].error_code == 0
    finally:
        other.close()
        node.stop()
