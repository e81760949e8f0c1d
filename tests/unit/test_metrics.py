"""Metrics: Log.metrics / LogStore.metrics move as appends, reads, flushes, rolls, recovery and
the cleaner do their work, and render as Prometheus text."""

from __future__ import annotations

import os
import re

import pytest

from logstore import Log, LogStore
from logstore.metrics import Histogram, HistogramSnapshot, prometheus_text

IN = "kafka.server:type=BrokerTopicMetrics,name=MessagesInPerSec"
BYTES_IN = "kafka.server:type=BrokerTopicMetrics,name=BytesInPerSec"
BYTES_OUT = "kafka.server:type=BrokerTopicMetrics,name=BytesOutPerSec"
OUT = "logstore:type=Log,name=MessagesOut"
FLUSH = "kafka.log:type=LogFlushStats,name=LogFlushRateAndTimeMs"
SEGMENTS = "kafka.log:type=Log,name=NumLogSegments"
SIZE = "kafka.log:type=Log,name=Size"


def test_histogram_counts_cumulatively():
    h = Histogram((1.0, 10.0))
    for v in (0.5, 1.0, 5.0, 50.0):
        h.observe(v)
    snap = h.snapshot()
    assert snap.buckets == ((1.0, 2), (10.0, 3), (float("inf"), 4))
    assert snap.count == 4 and snap.sum == 56.5 and snap.mean == 14.125


def test_log_metrics_follow_appends_reads_flushes_and_rolls(tmp_path):
    with Log.open(tmp_path / "t-0", segment_bytes=4096) as log:
        m0 = log.metrics()
        assert m0[IN] == 0 and m0[BYTES_IN] == 0 and m0[FLUSH].count == 0
        for i in range(300):
            log.append(b"value %d" % i)
        log.append_batch([b"b"] * 50)
        m1 = log.metrics()
        assert m1[IN] == 350
        assert m1[SEGMENTS] > 1 and m1[BYTES_IN] == m1[SIZE]  # counted across rolls
        records = list(log.iter())
        m2 = log.metrics()
        assert m2[OUT] - m1[OUT] == len(records) == 350
        assert m2[BYTES_OUT] - m1[BYTES_OUT] >= m1[SIZE] // 2
        log.append(b"one more")
        log.flush()
        m3 = log.metrics()
        assert m3[FLUSH].count == m2[FLUSH].count + 1 and m3[FLUSH].sum > 0
        assert m3["kafka.log:type=Log,name=LogEndOffset"] == 351


def test_recovery_metrics(tmp_path):
    path = tmp_path / "t-0"
    with Log.open(path) as log:
        log.append_batch([b"x" * 100] * 10)
        segment = os.path.join(log.path, "%020d.log" % log.segments[-1].base_offset)
    with open(segment, "ab") as f:
        f.write(b"\x00\x00\x00\x00\x00\x00\x00\x0a\x00\x00\x00\x40" + b"torn" * 10)
    os.unlink(path / ".kafka_cleanshutdown")
    with Log.open(path) as log:
        m = log.metrics()
        assert m["logstore:type=Log,name=RecoveryBytesTruncated"] == 52
        assert m["logstore:type=Log,name=RecoveryTimeMs"] > 0
        assert m[IN] == 0  # nothing appended since this open


def test_store_metrics_and_the_cleaner(tmp_path):
    with LogStore(tmp_path / "s", maintenance=False) as store:
        store.create_topic("t", 2)
        store.create_topic("c", 1, cleanup_policy="compact", segment_bytes=1024)
        store.partition("t", 1).append_batch([b"v"] * 7)
        log = store.partition("c", 0)
        for i in range(200):
            log.append(b"v%d" % i, key=b"k%d" % (i % 3))
        before = store.metrics()
        assert before[IN] == {("t", 0): 0, ("t", 1): 7, ("c", 0): 200}
        assert before["logstore:type=LogCleaner,name=DirtyRatio"][("c", 0)] == 1.0
        assert before["kafka.log:type=LogCleaner,name=max-dirty-percent"] == 100
        log.compact()
        after = store.metrics()
        assert after["logstore:type=LogCleaner,name=CleanerRuns"][("c", 0)] == 1
        assert after["logstore:type=LogCleaner,name=DirtyRatio"][("c", 0)] < 1.0
        assert after["kafka.log:type=LogCleaner,name=max-clean-time-secs"] > 0
        assert after["kafka.log:type=LogCleanerManager,name=uncleanable-partitions-count"] == 0
        log.mark_uncleanable("test")
        assert store.metrics()["kafka.log:type=LogCleanerManager,name=uncleanable-partitions-count"] == 1
        text = prometheus_text(after)
    assert 'kafka_server_brokertopicmetrics_messagesin_total{topic="t",partition="1"} 7' in text
    assert "# TYPE kafka_log_logflushstats_logflushrateandtimems histogram" in text
    assert 'kafka_log_logflushstats_logflushrateandtimems_bucket{topic="c",partition="0",le="+Inf"}' in text
    assert "kafka_log_logcleanermanager_uncleanable_partitions_count 0" in text
    sample = re.compile(r'^[a-z_][a-z0-9_]*(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? -?[0-9.e+]+$|^# (HELP|TYPE) .+$')
    bad = [line for line in text.splitlines() if not sample.match(line)]
    assert bad == []


def test_prometheus_text_escapes_label_values():
    text = prometheus_text({"logstore:type=Log,name=Size": {('we"ird\\topic', 0): 1},
                            "x:type=T,name=H": HistogramSnapshot(((1.0, 1), (float("inf"), 2)), 3.5, 2)})
    assert 'topic="we\\"ird\\\\topic"' in text
    assert 'x_t_h_bucket{le="1.0"} 1' in text and "x_t_h_sum 3.5" in text and "x_t_h_count 2" in text


@pytest.mark.parametrize("value", [0, 2**62])
def test_large_and_zero_values_render(value):
    assert f"logstore_log_size {value}" in prometheus_text({"logstore:type=Log,name=Size": value})
