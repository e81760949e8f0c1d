"""A store's transaction coordinator: one per LogStore object, shared by its Kafka listener and
its transactional producers, over the store's ``__transaction_state`` and partitions.

:func:`store_coordinator` makes it on first use: the topic is created (compacted, as Kafka's),
producer ids come from the store's :class:`~logstore.txn.producerids.ProducerIds`, and markers
are appended to the store's partitions by :class:`LocalMarkers`. When the store is shared by
several processes (``LogStore(shared=True)``, the default), each process has its own
coordinator over the same state log, and every operation of each holds ``.lock-txn-coordinator``
(an flock in the store's root, :class:`StoreFlock`): the processes see one state in one order
(see :mod:`logstore.txn.coordinator`, "Processes"). The coordinator closes with the store.

Thread-safety: thread-safe and process-safe.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import weakref
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any, Iterator

from .. import _fileio
from ..errorcodes import ErrorCode, code_for
from ..errors import (InvalidProducerEpochError, InvalidTopicError, LogstoreError, TransactionCoordinatorFencedError,
                      UnknownTopicOrPartitionError)
from .coordinator import TransactionCoordinator, TxnConfig
from .metadata import TRANSACTION_STATE_TOPIC, TRANSACTION_STATE_TOPIC_CONFIG
from .producerids import ProducerIds

__all__ = ["store_coordinator", "LocalMarkers", "StoreFlock", "TXN_LOCK_FILE"]

logger = logging.getLogger("logstore.txn.local")

#: The flock in a store's root held by the process changing transaction state.
TXN_LOCK_FILE = ".lock-txn-coordinator"

_COORDINATORS: "weakref.WeakKeyDictionary[Any, TransactionCoordinator]" = weakref.WeakKeyDictionary()
_COORDINATORS_LOCK = threading.Lock()


class StoreFlock:
    """An exclusive flock on ``<root>/.lock-txn-coordinator``, taken (blocking) by each call of
    the object as a context manager. One descriptor per object: threads of one process must
    not share it at once (the coordinator's section lock serialises them)."""

    def __init__(self, root: str) -> None:
        self.path = os.path.join(root, TXN_LOCK_FILE)
        self._fd = _fileio.ops.open(self.path, os.O_RDWR | os.O_CREAT)

    @contextmanager
    def __call__(self) -> Iterator[None]:
        _fileio.ops.lock(self._fd, blocking=True)
        try:
            yield
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Close the descriptor (releasing the flock). Idempotent."""
        if self._fd >= 0:
            _fileio.ops.close(self._fd)
            self._fd = -1


class LocalMarkers:
    """The coordinator's marker writer over a store's partitions: appends the COMMIT or ABORT
    marker to each partition's log (``Log.append_txn_marker``), fsynced with ``fsync``, and
    returns a completed future of each partition's error (Kafka's WriteTxnMarkers answers).
    A partition that no longer exists answers UNKNOWN_TOPIC_OR_PARTITION (nothing left to
    mark). Thread-safe."""

    def __init__(self, store: Any, fsync: bool) -> None:
        self.store = store
        self.fsync = fsync

    def __call__(self, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int,
                 partitions: list[tuple[str, int]]) -> "Future[dict[tuple[str, int], int]]":
        results: dict[tuple[str, int], int] = {}
        for topic, partition in partitions:
            try:
                log = self.store.partition(topic, partition)
                log.append_txn_marker(producer_id, producer_epoch, commit, coordinator_epoch)
                if self.fsync:
                    log.flush()  # (durable before the Complete record says the transaction is done)
            except (UnknownTopicOrPartitionError, InvalidTopicError):
                results[(topic, partition)] = ErrorCode.unknown_topic_or_partition
            except (InvalidProducerEpochError, TransactionCoordinatorFencedError) as exc:
                results[(topic, partition)] = code_for(exc)
            except (LogstoreError, OSError) as exc:
                logger.warning("writing a transaction marker to %s-%d failed: %s", topic, partition, exc)
                results[(topic, partition)] = ErrorCode.kafka_storage_error
            else:
                results[(topic, partition)] = ErrorCode.none
        done: Future[dict[tuple[str, int], int]] = Future()
        done.set_result(results)
        return done


def store_coordinator(store: Any, config: TxnConfig | None = None) -> TransactionCoordinator:
    """The store's one transaction coordinator, made and loaded on first use (``config``
    applies then, by default fsyncing as the store's ``transaction_fsync`` says; later calls
    return the same coordinator whatever they pass). It closes with the store.

    Raises:
        TxnRecordError: ``__transaction_state`` holds a record that cannot be read.

    Thread-safe.
    """
    with _COORDINATORS_LOCK:
        found = _COORDINATORS.get(store)
        if found is not None:
            return found
        config = config or TxnConfig(fsync=bool(getattr(store, "transaction_fsync", False)))
        store.create_topic(TRANSACTION_STATE_TOPIC, 1, exist_ok=True, internal=True, **TRANSACTION_STATE_TOPIC_CONFIG)
        flock = StoreFlock(store.root) if store.shared else None
        coordinator = TransactionCoordinator(store.partition(TRANSACTION_STATE_TOPIC, 0), ProducerIds(store.root).next_id,
                                             LocalMarkers(store, config.fsync), config=config, shared_lock=flock)
        try:
            coordinator.load()
        except BaseException:
            if flock is not None:
                flock.close()
            raise

        def close() -> None:
            coordinator.close()
            if flock is not None:
                flock.close()

        store.add_closer(close)
        _COORDINATORS[store] = coordinator
        return coordinator
