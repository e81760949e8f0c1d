"""The node on the network layer: its metrics include the listener's, handlers are looked up per
request, and an unknown request type is answered with an ERROR frame on a connection that
stays usable."""

from __future__ import annotations

from logstore.replication import Client, _Connection
from logstore.wire import RequestType, Writer

from .test_inprocess import SECRET
from .test_server import single

NET = "kafka.server:type=socket-server-metrics,listener=replication,name="


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


def test_handlers_are_looked_up_for_every_request(tmp_path, monkeypatch):
    node = single(tmp_path)
    conn = _Connection(node.address, SECRET, -1, 5.0, 1 << 20)
    try:
        assert conn.request(RequestType.METADATA, b"").int32() == 0
        monkeypatch.setattr(node, "_on_metadata", lambda r: Writer().int32(42).payload())
        assert conn.request(RequestType.METADATA, b"").int32() == 42   # same connection, new handler
    finally:
        conn.close()
        node.stop()


def test_an_unknown_request_type_is_answered_with_an_error_and_the_connection_stays(tmp_path):
    node = single(tmp_path)
    conn = _Connection(node.address, SECRET, -1, 5.0, 1 << 20)
    try:
        assert conn.request(99, b"").string() == "unknown request type 99"   # an ERROR frame
        assert conn.request(RequestType.METADATA, b"").int32() == 0
    finally:
        conn.close()
        node.stop()
