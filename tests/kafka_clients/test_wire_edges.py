"""Protocol edges on raw sockets (bytes written by hand from Kafka's protocol guide, or by
kafka-python's structs; never by the server's codec): ApiVersions of an unknown version,
acks=0, malformed and oversized requests closing only their own connection, and the byte
limits of a fetch (KIP-74)."""

from __future__ import annotations

import socket
import struct

import pytest

from logstore.kafka.server import KafkaServer


@pytest.fixture
def server(tmp_path):
    s = KafkaServer(str(tmp_path), ("127.0.0.1", 0), max_request_bytes=1 << 20).start()
    yield s
    s.stop()


def request(api_key, version, correlation, body=b"", client_id=b"test"):
    frame = struct.pack(">hhih", api_key, version, correlation, len(client_id)) + client_id + body
    return struct.pack(">i", len(frame)) + frame


def recv_exactly(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return buf


def response(sock):
    (n,) = struct.unpack(">i", recv_exactly(sock, 4))
    return recv_exactly(sock, n)


def closed(sock):
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def connect(server):
    return socket.create_connection(server.address, timeout=5)


def api_versions_v0(payload):
    """(correlation id, error code, {api key: (min, max)}) of an ApiVersions v0 response."""
    correlation, error, count = struct.unpack_from(">ihi", payload, 0)
    ranges = {}
    for i in range(count):
        key, low, high = struct.unpack_from(">hhh", payload, 10 + 6 * i)
        ranges[key] = (low, high)
    return correlation, error, ranges


def test_a_client_connecting_between_construction_and_start_is_answered(tmp_path):
    """The server answers from construction: a client that connects before start() (to the
    port bound for port 0) gets its ApiVersions at once; start() then changes nothing."""
    server = KafkaServer(str(tmp_path), ("127.0.0.1", 0))
    try:
        with connect(server) as sock:
            sock.sendall(request(18, 0, 5))
            assert api_versions_v0(response(sock))[:2] == (5, 0)
        assert server.start() is server
        with connect(server) as sock:
            sock.sendall(request(18, 0, 6))
            assert api_versions_v0(response(sock))[:2] == (6, 0)
    finally:
        server.stop()

def test_api_versions_v0_lists_the_ranges_librdkafka_needs(server):
    with connect(server) as s:
        s.sendall(request(18, 0, 7))
        correlation, error, ranges = api_versions_v0(response(s))
    assert (correlation, error) == (7, 0)
    # librdkafka before 2.11.1 enables v2 batches with Produce 3 and Fetch 4 in range, and
    # compresses only when Produce's minimum is 0.
    assert ranges[0][0] == 0 and ranges[0][1] >= 3
    assert ranges[1][0] <= 4 <= ranges[1][1]
    assert ranges[2][0] <= 1 <= ranges[2][1]
    assert ranges[10][0] <= 0 <= ranges[10][1]  # FindCoordinator v0: consumer groups
    assert ranges[22][0] == 0


def test_an_unsupported_api_versions_version_gets_error_35_in_v0_format(server):
    with connect(server) as s:
        s.sendall(request(18, 99, 11, body=b"\x00garbage"))
        correlation, error, ranges = api_versions_v0(response(s))
        assert (correlation, error) == (11, 35)
        assert ranges[18] == (0, 4)
        s.sendall(request(18, 1, 12))   # the connection stays usable
        assert api_versions_v0(response(s))[:2] == (12, 0)


def test_an_unknown_api_or_malformed_request_closes_only_its_connection(server):
    with connect(server) as good, connect(server) as bad1, connect(server) as bad2, connect(server) as bad3:
        bad1.sendall(request(999, 0, 1))                                 # unknown api key
        bad2.sendall(request(3, 1, 2, body=struct.pack(">i", 1000)))     # 1000 topics, no bytes for them
        bad3.sendall(struct.pack(">i", (1 << 20) + 1))                   # over max_request_bytes
        assert closed(bad1) and closed(bad2) and closed(bad3)
        good.sendall(request(18, 0, 3))
        assert api_versions_v0(response(good))[:2] == (3, 0)


def test_acks_0_produce_gets_no_response(server):
    server.store.create_topic("quiet")
    from logstore.records.batch import BatchBuilder

    batch = bytes(BatchBuilder().build([b"v"]))
    topic = b"quiet"
    # Produce v3: transactional_id (null), acks=0, timeout, [topic [partition records]]
    body = (struct.pack(">hhi", -1, 0, 1000) + struct.pack(">ih", 1, len(topic)) + topic
            + struct.pack(">iii", 1, 0, len(batch)) + batch)
    with connect(server) as s:
        s.sendall(request(0, 3, 21, body) + request(18, 0, 22))
        # The next answer on the connection is ApiVersions': the produce got none.
        assert api_versions_v0(response(s))[0] == 22
    assert [r.value for r in server.store.partition("quiet", 0).iter()] == [b"v"]


def test_a_non_loopback_bind_needs_allow_anonymous(tmp_path):
    from logstore import LogstoreError

    with pytest.raises(LogstoreError, match="without authentication"):
        KafkaServer(str(tmp_path), ("0.0.0.0", 0))


def test_a_thousand_idle_connections_cost_no_thread_each(tmp_path):
    import resource
    import threading

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 2600  # a client and a server descriptor per connection, and some
    if soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            pytest.skip(f"the descriptor limit ({hard}) is too low for 1000 connections")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    with KafkaServer(str(tmp_path), ("127.0.0.1", 0)) as server:
        threads = threading.active_count()
        idle = []
        try:
            for i in range(1000):
                s = connect(server)
                s.sendall(request(18, 0, i))  # each one answered once, then idle
                idle.append(s)
            for i, s in enumerate(idle):
                assert api_versions_v0(response(s))[:2] == (i, 0)
            assert server.metrics()["kafka.server:type=socket-server-metrics,listener=kafka,name=connection-count"] \
                == 1000
            assert threading.active_count() - threads < 20  # a loop and a few workers, not a thread each
            with connect(server) as fresh:  # the 1001st is served as the first was
                fresh.sendall(request(18, 0, 7))
                assert api_versions_v0(response(fresh))[:2] == (7, 0)
        finally:
            for s in idle:
                s.close()


def fetch_v4(server, partitions, max_bytes, partition_max_bytes):
    """One Fetch v4 (kafka-python's structs encode and decode it) of ``partitions`` of topic
    "limits" from offset 0; {partition: record bytes in the answer}."""
    from kafka.protocol.old.fetch import FetchRequest, FetchResponse

    ask = FetchRequest[4](-1, 0, 1, max_bytes, 0, [("limits", [(p, 0, partition_max_bytes) for p in partitions])])
    ask.with_header(7, "limits-test")
    with connect(server) as sock:
        sock.sendall(ask.encode(header=True, framed=True))
        answer = FetchResponse[4].decode(response(sock), header=True)
    [(topic, parts)] = answer.responses
    assert topic == "limits" and all(p[1] == 0 for p in parts)
    return {p[0]: p[-1] or b"" for p in parts}


def test_fetch_limits_give_the_first_partition_one_batch_and_the_others_whole_batches_within_them(server):
    """KIP-74: the first partition with records gets its first batch even past both limits; a
    later partition gets whole batches within what is left of the response limit and its own,
    or nothing (never a batch past them)."""
    store = server.store
    store.create_topic("limits", 3)
    batches = {}
    for p in range(3):
        store.partition("limits", p).append_batch([b"x" * 200] * 5)  # one batch of ~1.1 kB
        batches[p] = store.partition("limits", p).read_raw(0, 1 << 20)
    size = len(batches[0])
    assert size > 1000 and all(len(b) == size for b in batches.values())

    tiny = fetch_v4(server, [0, 1, 2], max_bytes=100, partition_max_bytes=50)
    assert tiny == {0: batches[0], 1: b"", 2: b""}  # the one batch past both limits, then nothing

    two = fetch_v4(server, [0, 1, 2], max_bytes=2 * size + size // 2, partition_max_bytes=10 * size)
    assert two == {0: batches[0], 1: batches[1], 2: b""}  # the third does not fit in what is left

    by_partition = fetch_v4(server, [1, 0, 2], max_bytes=10 * size, partition_max_bytes=size - 1)
    assert by_partition == {1: batches[1], 0: b"", 2: b""}  # only the first gets a batch over its limit

    everything = fetch_v4(server, [0, 1, 2], max_bytes=10 * size, partition_max_bytes=size)
    assert everything == batches
