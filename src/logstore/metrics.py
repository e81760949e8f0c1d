"""Metrics: what :meth:`LogStore.metrics` (and ``Log.metrics``, ``ReplicaNode.metrics``) report,
and their Prometheus text exposition.

A metrics snapshot is a plain dict keyed by metric name. Names are Kafka's JMX names where Kafka
has the metric (``kafka.log:type=Log,name=LogEndOffset``), and the same shape under the
``logstore`` domain otherwise. A value is a number, a :class:`HistogramSnapshot`, or a dict of
those keyed by a label tuple (``(topic, partition)`` for per-partition metrics). Kafka's
``...PerSec`` meters are reported as their running count, as Kafka's own ``Count`` attribute.

==================================================================== ==============================
name                                                                 what
==================================================================== ==============================
kafka.server:type=BrokerTopicMetrics,name=MessagesInPerSec          records appended since the log was opened (any process)
kafka.server:type=BrokerTopicMetrics,name=BytesInPerSec             bytes of batches appended since then
kafka.server:type=BrokerTopicMetrics,name=BytesOutPerSec            bytes of batches read by this process
logstore:type=Log,name=MessagesOut                                  records read by this process
kafka.log:type=Log,name=LogStartOffset / LogEndOffset / Size / NumLogSegments   per partition
kafka.log:type=LogFlushStats,name=LogFlushRateAndTimeMs             fsync latency histogram (ms)
logstore:type=Log,name=RecoveryTimeMs / RecoveryBytesTruncated      what opening the log took and cut
logstore:type=LogCleaner,name=CleanerRuns / DirtyRatio              per compacted partition
kafka.log:type=LogCleaner,name=max-dirty-percent                    store-wide
kafka.log:type=LogCleanerManager,name=uncleanable-partitions-count  store-wide
kafka.log:type=LogCleaner,name=max-clean-time-secs                  store-wide, longest last pass
kafka.server:type=ReplicaManager,name=UnderReplicatedPartitions     replication (ReplicaNode.metrics)
kafka.server:type=ReplicaFetcherManager,name=MaxLag,clientId=Replica  replication, records
logstore:type=Replica,name=FollowerLag                              per (topic, partition, follower)
kafka.server:type=socket-server-metrics,listener=L,name=...         network layer (net.Server), per listener:
    connection-count, connection-creation-total, connection-close-total, successful-authentication-total,
    failed-authentication-total, request-total, response-total, incoming-byte-total, outgoing-byte-total
logstore:type=socket-server-metrics,listener=L,name=...             connection-refused-total (max_connections),
    connection-expired-total (handshake or idle timeout)
kafka.network:type=RequestChannel,listener=L,name=RequestQueueSize  requests waiting for a worker thread
kafka.network:type=RequestMetrics,name=RequestsPerSec,request=API   Kafka server (KafkaServer.metrics): requests answered
kafka.network:type=RequestMetrics,name=TotalTimeMs,request=API      Kafka server: handler to answer, histogram (ms)
kafka.server:type=BrokerTopicMetrics,name=RemoteCopyBytesPerSec     tiered storage, store-wide: bytes copied to the remote tier;
    also RemoteCopyRequestsPerSec, RemoteCopyErrorsPerSec, RemoteFetchBytesPerSec, RemoteFetchRequestsPerSec,
    RemoteFetchErrorsPerSec, RemoteDeleteRequestsPerSec, RemoteDeleteErrorsPerSec (since the start), and the
    gauges RemoteCopyLagBytes, RemoteLogSizeBytes, RemoteLogIndexCacheBytes
kafka.log:type=RemoteLog,name=RemoteCopyLagBytes                    tiered storage, per partition: bytes waiting for a copy;
    also RemoteCopyLagSegments, RemoteLogSizeBytes, RemoteLogMetadataCount (finished remote segments)
==================================================================== ==============================

In the Prometheus text, a JMX name's domain, ``type`` and ``name`` make the metric's name and its
other key properties (``listener``, ``request``) labels.

Thread-safety: :class:`Histogram` is thread-safe; snapshots are plain values.
"""

from __future__ import annotations

import bisect
import re
import threading
from dataclasses import dataclass
from typing import Any, Mapping

__all__ = ["Histogram", "HistogramSnapshot", "prometheus_text", "FLUSH_BUCKETS_MS"]

#: Upper bounds (ms) of the fsync latency histogram's buckets.
FLUSH_BUCKETS_MS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 1000.0)


@dataclass(frozen=True)
class HistogramSnapshot:
    """A histogram's state: cumulative counts per upper bound (Prometheus ``le``), sum, count."""

    buckets: tuple[tuple[float, int], ...]
    sum: float
    count: int

    @property
    def mean(self) -> float:
        """Average observation (0 without any)."""
        return self.sum / self.count if self.count else 0.0


class Histogram:
    """Observations counted into fixed buckets. Thread-safe."""

    def __init__(self, bounds: tuple[float, ...] = FLUSH_BUCKETS_MS) -> None:
        self.bounds = bounds
        self._counts = [0] * (len(bounds) + 1)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        """Count one observation."""
        i = bisect.bisect_left(self.bounds, value)
        with self._lock:
            self._counts[i] += 1
            self._sum += value

    def snapshot(self) -> HistogramSnapshot:
        """The counts so far, cumulative per bucket as Prometheus wants them."""
        with self._lock:
            counts, total = list(self._counts), self._sum
        cumulative, running = [], 0
        for bound, n in zip(self.bounds + (float("inf"),), counts):
            running += n
            cumulative.append((bound, running))
        return HistogramSnapshot(tuple(cumulative), total, running)


def _prom_name(name: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """``kafka.network:type=RequestMetrics,name=RequestsPerSec,request=Produce`` ->
    (``kafka_network_requestmetrics_requestspersec``, (("request", "Produce"),)): the domain,
    type and name make the metric's name, the other key properties its labels (as Prometheus'
    JMX exporter does)."""
    domain, _, props = name.partition(":")
    pairs = [tuple(p.split("=", 1)) for p in props.split(",") if "=" in p]
    parts = [domain] + [v for k, v in pairs if k in ("type", "name")]
    labels = tuple((re.sub(r"[^a-zA-Z0-9_]", "_", k).lower(), v) for k, v in pairs if k not in ("type", "name"))
    return re.sub(r"[^a-zA-Z0-9_]", "_", "_".join(parts)).lower(), labels


def _jmx_name(name: str) -> str:
    """The ``name`` key property of a JMX name."""
    for prop in name.partition(":")[2].split(","):
        if prop.startswith("name="):
            return prop[5:]
    return ""


_LABELS = {2: ("topic", "partition"), 3: ("topic", "partition", "replica")}


def _escape(value: Any) -> str:
    return str(value).replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34)).replace("\n", "\\n")


def _labels(key: Any, fixed: tuple[tuple[str, str], ...] = ()) -> str:
    names = _LABELS.get(len(key), tuple(f"label{i}" for i in range(len(key))))
    pairs = list(fixed) + list(zip(names, key))
    if not pairs:
        return ""
    return "{" + ",".join(f'{n}="{_escape(v)}"' for n, v in pairs) + "}"


def _with(labels: str, extra: str) -> str:
    return "{" + (labels[1:-1] + "," if labels else "") + extra + "}"


def prometheus_text(metrics: Mapping[str, Any]) -> str:
    """Render a metrics snapshot (``store.metrics()``) in Prometheus' text exposition format
    (version 0.0.4): counters for ``...PerSec`` meters and totals, histograms as ``_bucket``
    / ``_sum`` / ``_count``, gauges for the rest. Key properties besides ``type`` and ``name``
    (``listener``, ``request``) are labels, so that one family holds every request's series."""
    families: dict[str, tuple[str, str, list[str]]] = {}  # name -> (kind, JMX name, lines)
    for name in sorted(metrics):
        value = metrics[name]
        series = value if isinstance(value, dict) else {(): value}
        prom, fixed = _prom_name(name)
        sample = next(iter(series.values()), None)
        if isinstance(sample, HistogramSnapshot):
            kind = "histogram"
        elif _jmx_name(name).endswith(("PerSec", "Out", "-total")) or "Runs" in name:
            kind = "counter"
            prom = prom.removesuffix("persec").removesuffix("_total") + "_total"
        else:
            kind = "gauge"
        lines = families.setdefault(prom, (kind, name.split(",")[0] + f",name={_jmx_name(name)}", []))[2]
        for key in sorted(series, key=lambda k: tuple(str(x) for x in k)):
            v = series[key]
            labels = _labels(key, fixed)
            if isinstance(v, HistogramSnapshot):
                for bound, count in v.buckets:
                    le = "+Inf" if bound == float("inf") else repr(float(bound))
                    lines.append(f"{prom}_bucket{_with(labels, f'le={chr(34)}{le}{chr(34)}')} {count}")
                lines.append(f"{prom}_sum{labels} {v.sum!r}")
                lines.append(f"{prom}_count{labels} {v.count}")
            elif v is not None:
                lines.append(f"{prom}{labels} {float(v)!r}" if isinstance(v, float) else f"{prom}{labels} {int(v)}")
    out: list[str] = []
    for prom in sorted(families):
        kind, jmx, lines = families[prom]
        out += [f"# HELP {prom} {jmx}", f"# TYPE {prom} {kind}", *lines]
    return "\n".join(out) + "\n"
