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

import importlib
from typing import TYPE_CHECKING

from . import _native  # noqa: F401 - the C core: a missing or stale build fails ``import logstore``
from .errors import (
    CommitFailedError,
    CorruptIndexError,
    CorruptRecordError,
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidProducerEpochError,
    InvalidTxnStateError,
    ProducerFencedError,
    TransactionCoordinatorFencedError,
    InvalidRecordError,
    InvalidTopicError,
    LogClosedError,
    LogLockedError,
    LogOfflineError,
    LogstoreError,
    NotLeaderOrFollowerError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    RecordTooLargeError,
    RequestTimedOutError,
    RemoteStorageError,
    RemoteResourceNotFoundError,
    OffsetMovedToTieredStorageError,
    DataLossError,
    InconsistentTopicIdError,
    TopicExistsError,
    UnknownTopicIdError,
    UnknownTopicOrPartitionError,
    UnsupportedCodecError,
)

if TYPE_CHECKING:
    from .client.consumer import Consumer, ConsumerRecord, PartitionNotAssignedError, TopicPartition
    from .client.producer import Producer, RecordMetadata, SendFuture
    from .client.queue import Message, Queue
    from .kafka.server import KafkaServer
    from .log.config import LogConfig
    from .log.log import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, Log, RecoveryReport
    from .records.batch import Record, TimestampType
    from .segment import SegmentInfo
    from .store.store import LogStore, TopicDescription

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
    "InvalidPartitionsError",
    "InvalidRecordError",
    "UnsupportedCodecError",
    "UnknownTopicOrPartitionError",
    "UnknownTopicIdError",
    "InconsistentTopicIdError",
    "TopicExistsError",
    "InvalidProducerEpochError",
    "InvalidTxnStateError",
    "ProducerFencedError",
    "TransactionCoordinatorFencedError",
    "OutOfOrderSequenceError",
    "NotLeaderOrFollowerError",
    "RequestTimedOutError",
    "RemoteStorageError",
    "RemoteResourceNotFoundError",
    "OffsetMovedToTieredStorageError",
    "DataLossError",
    "__version__",
]

#: The public names defined in the wings, by the module that defines them. ``import logstore``
#: loads none of them: each is imported on first use (PEP 562), so that the ``logstore``
#: command and a program that needs one wing do not pay for the others (the Kafka codec alone,
#: kio, costs about 300 ms; tests/unit/test_import_cost.py keeps it, pyarrow and pyspark out).
_LAZY = {
    "LogStore": ".store.store", "TopicDescription": ".store.store",
    "Log": ".log.log", "RecoveryReport": ".log.log", "EARLIEST_TIMESTAMP": ".log.log", "LATEST_TIMESTAMP": ".log.log",
    "LogConfig": ".log.config",
    "Record": ".records.batch", "TimestampType": ".records.batch",
    "SegmentInfo": ".segment",
    "Producer": ".client.producer", "SendFuture": ".client.producer", "RecordMetadata": ".client.producer",
    "Consumer": ".client.consumer", "ConsumerRecord": ".client.consumer", "TopicPartition": ".client.consumer",
    "PartitionNotAssignedError": ".client.consumer",
    "Queue": ".client.queue", "Message": ".client.queue",
    "KafkaServer": ".kafka.server",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module, __name__), name)
    elif name.startswith("__"):
        raise AttributeError(f"module 'logstore' has no attribute {name!r}")
    else:  # a wing or module (``logstore.tools.inspect`` after a bare ``import logstore``)
        try:
            value = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
            raise AttributeError(f"module 'logstore' has no attribute {name!r}") from None
    globals()[name] = value  # later uses find it without coming here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
