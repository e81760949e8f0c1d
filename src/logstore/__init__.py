"""logstore: Apache Kafka's log layer as an embeddable Python library with a C core.

>>> import logstore, tempfile, os
>>> with logstore.Log.open(os.path.join(tempfile.mkdtemp(), "events-0")) as log:
...     log.append(b"hello", key=b"k")
...     [r.value for r in log.read(0)]
0
[b'hello']

The on-disk format is Kafka's own (RecordBatch v2 segments with sparse offset and time indexes),
so Kafka's tools can read logstore's files and logstore can open Kafka's. See FORMAT.md.
"""

from __future__ import annotations

from .log.config import LogConfig
from .errors import (
    CorruptIndexError,
    CorruptRecordError,
    InvalidConfigError,
    InvalidProducerEpochError,
    InvalidRecordError,
    InvalidTopicError,
    LogClosedError,
    LogLockedError,
    LogOfflineError,
    LogstoreError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    RecordTooLargeError,
    TopicExistsError,
    UnknownTopicOrPartitionError,
    UnsupportedCodecError,
)
from .log.log import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, Log, RecoveryReport
from .records.batch import Record, TimestampType
from .segment import SegmentInfo
from .store.store import LogStore, TopicDescription
from .client.producer import Producer, RecordMetadata, SendFuture
from .client.consumer import CommitFailedError, Consumer, ConsumerRecord, PartitionNotAssignedError, TopicPartition
from .client.queue import Message, Queue

__version__ = "0.1.0"

__all__ = [
    "LogStore",
    "KafkaServer",
    "TopicDescription",
    "Producer",
    "SendFuture",
    "RecordMetadata",
    "Consumer",
    "ConsumerRecord",
    "TopicPartition",
    "PartitionNotAssignedError",
    "CommitFailedError",
    "Queue",
    "Message",
    "Log",
    "LogConfig",
    "Record",
    "TimestampType",
    "SegmentInfo",
    "RecoveryReport",
    "EARLIEST_TIMESTAMP",
    "LATEST_TIMESTAMP",
    "LogstoreError",
    "CorruptRecordError",
    "CorruptIndexError",
    "OffsetOutOfRangeError",
    "RecordTooLargeError",
    "LogClosedError",
    "LogLockedError",
    "LogOfflineError",
    "InvalidTopicError",
    "InvalidConfigError",
    "InvalidRecordError",
    "UnsupportedCodecError",
    "UnknownTopicOrPartitionError",
    "TopicExistsError",
    "InvalidProducerEpochError",
    "OutOfOrderSequenceError",
    "__version__",
]


def __getattr__(name: str) -> object:
    # KafkaServer is imported on first use: ``import logstore`` does not load the Kafka codec.
    if name == "KafkaServer":
        from .kafka.server import KafkaServer

        return KafkaServer
    raise AttributeError(f"module 'logstore' has no attribute {name!r}")
