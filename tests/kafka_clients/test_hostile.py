"""Hostile input on the Kafka listener: random and truncated frames, sizes near 2^31, unknown
API keys and versions, random bodies for every API served, a client dripping one byte at a time.
The server never crashes, its other connections go on, its memory does not grow with the sizes
announced, and nothing is written to the store."""

from __future__ import annotations

import resource
import socket
import struct
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logstore.kafka.server import KafkaServer
from logstore.kafka.wire import SUPPORTED

from .test_wire_edges import api_versions_v0, closed, request, response


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = KafkaServer(str(tmp_path_factory.mktemp("hostile")), ("127.0.0.1", 0), max_request_bytes=1 << 20,
                    auto_create_topics=False).start()
    s.store.create_topic("victim", 2)
    s.store.partition("victim", 0).append(b"before")
    yield s
    s.stop()


def records_in(store):
    return sum(store.partition(t, p).log_end_offset for t in store.topics() for p in range(store.partitions_for(t)))


def still_serves(server):
    with socket.create_connection(server.address, timeout=5) as s:
        s.sendall(request(18, 0, 99))
        return api_versions_v0(response(s))[:2] == (99, 0)


def exchange(server, data, wait=0.5):
    """Send ``data``, then read until the server answers everything or closes (bounded)."""
    with socket.create_connection(server.address, timeout=wait) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            while s.recv(65536):
                pass
        except (ConnectionError, TimeoutError, OSError):
            pass


SLOW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])


@SLOW
@given(st.binary(min_size=0, max_size=300))
def test_random_bytes_after_a_valid_size(server, body):
    before = records_in(server.store)
    exchange(server, struct.pack(">i", len(body)) + body)
    assert records_in(server.store) == before


@SLOW
@given(st.sampled_from(sorted(SUPPORTED)), st.data())
def test_random_bodies_for_every_api_and_version(server, api_key, data):
    low, high = SUPPORTED[api_key]
    version = data.draw(st.integers(low, high))
    body = data.draw(st.binary(max_size=200))
    before = records_in(server.store)
    exchange(server, request(api_key, version, 7, body))
    assert records_in(server.store) == before


@pytest.mark.parametrize("size", [2**31 - 1, 2**31 - 4096, 1 << 30, (1 << 20) + 1, -1, -(2**31), 0, 3, 7])
def test_sizes_near_the_limits_close_the_connection_without_allocating(server, size):
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with socket.create_connection(server.address, timeout=5) as s:
        s.sendall(struct.pack(">i", size) + b"\x00" * 16)
        assert closed(s)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss < 64 * 1024  # KiB: nothing near the size
    assert still_serves(server)


@pytest.mark.parametrize("api_key, version", [(999, 0), (-1, 0), (0, 99), (1, 0), (3, 13), (32, 0), (17, 0), (36, 0)])
def test_unknown_api_keys_and_versions_close_only_their_connection(server, api_key, version):
    """(ApiVersions of an unknown version is answered instead: see test_wire_edges.)"""
    with socket.create_connection(server.address, timeout=5) as s:
        s.sendall(request(api_key, version, 5, b"\x00" * 8))
        assert closed(s)
    assert still_serves(server)


def test_a_frame_cut_short_by_its_client(server):
    before = records_in(server.store)
    frame = request(3, 8, 1, struct.pack(">i", 1) + struct.pack(">h", 6) + b"victim" + b"\x01\x00\x00")
    for cut in range(1, len(frame)):
        exchange(server, frame[:cut], wait=0.2)
    assert records_in(server.store) == before and still_serves(server)


def test_a_slow_drip_client_holds_nobody_up(server):
    """One byte every 20 ms of a valid request: the other connections are served meanwhile,
    and the drip gets its answer once its last byte arrives."""
    frame = request(18, 0, 42)
    answer: list[bytes] = []

    def drip():
        with socket.create_connection(server.address, timeout=10) as s:
            for i in range(len(frame)):
                s.sendall(frame[i:i + 1])
                time.sleep(0.02)
            answer.append(response(s))

    t = threading.Thread(target=drip)
    t.start()
    slowest = 0.0
    while t.is_alive():
        started = time.monotonic()
        assert still_serves(server)
        slowest = max(slowest, time.monotonic() - started)
    t.join()
    assert api_versions_v0(answer[0])[:2] == (42, 0)
    assert slowest < 1.0  # served while the drip was pending (each poll is one round trip)
