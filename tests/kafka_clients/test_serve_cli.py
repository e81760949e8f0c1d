"""``logstore serve``: prints the bound address once it accepts, serves, stops cleanly on SIGTERM."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

kafka = pytest.importorskip("kafka")


def test_serve_prints_its_address_serves_and_stops_on_sigterm(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "logstore", "serve", str(tmp_path / "store"),
                             "--listen", "127.0.0.1:0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving ") and " on 127.0.0.1:" in line, line
        bootstrap = line.split(" on ")[1].strip()
        producer = kafka.KafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
        try:
            assert producer.send("cli", value=b"hello").get(10).offset == 0
        finally:
            producer.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    from logstore import LogStore

    with LogStore(str(tmp_path / "store")) as store:
        assert [r.value for r in store.partition("cli", 0).iter()] == [b"hello"]
