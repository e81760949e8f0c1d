"""Fetches below the local segments (tiered storage, KIP-405): :class:`RemoteReader` (Kafka's
RemoteLogReader threads) and :class:`RemoteFetch` (its DelayedRemoteFetch).

A Kafka fetch at an offset that its partition's log holds only in the remote tier is answered
from the object store: a ranged get of whole batches (each CRC-checked by the remote tier,
``Log.read_raw``) and, for read_committed, the aborted transactions of the remote transaction
indexes. Such a read never runs on the thread that handles the request (nor on the network
loop, nor the purgatory's timer): it goes to the reader's threads, and the fetch waits in the
purgatory for at most ``remote.fetch.max.wait.ms``. A read that has not finished by then leaves
that partition's records empty in the answer (the client asks again, and the read it started
may meanwhile have warmed the remote index cache), as Kafka's DelayedRemoteFetch does on
expiration; the other partitions' records go out as read. A read that fails (the object store
down, bytes that fail their checks) answers that partition with UNKNOWN_SERVER_ERROR, as Kafka
answers a RemoteStorageException, and the connection stays up.

Thread-safety: thread-safe.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..errorcodes import ErrorCode
from ..errors import LogstoreError
from ..net.purgatory import Purgatory
from ..records.batch import batch_headers

__all__ = ["RemoteReader", "RemoteFetch", "RemoteRead", "remote_batches"]

logger = logging.getLogger("logstore.kafka")

#: Kafka's remote.log.reader.threads default.
READER_THREADS = 10

#: A fetch answer's partition fields when the partition is in error (no offsets to report).
NO_OFFSETS = {"high_watermark": -1, "last_stable_offset": -1, "log_start_offset": -1, "aborted_transactions": None}


def remote_batches(raw: bytes, visible: int) -> tuple[bytes | None, int]:
    """A fetch's batches from the remote tier, none at or above ``visible`` (whole batches), and
    the offset after the last one (-1 when there is none)."""
    end, after = 0, -1
    for position, header in batch_headers(raw):
        if header.base_offset >= visible:
            break
        end, after = position + header.size, header.last_offset + 1
    return (raw[:end] if end else None), after


class RemoteRead:
    """One partition of a fetch read from the remote tier: where it goes in the answer (its
    ``entry``), what was asked, and the read's Future ((records or None, aborted transactions)).

    ``first``: the partition is the first of the fetch with records (KIP-74: it gets at least one
    batch whatever ``limit`` says; a later one gets none when its first batch is over ``limit``).
    Not thread-safe: the fetch that made it fills its entry once."""

    __slots__ = ("entry", "where", "limit", "first", "future")

    def __init__(self, entry: dict[str, Any], where: str, limit: int, first: bool, future: Future) -> None:
        self.entry = entry
        self.where = where
        self.limit = limit
        self.first = first
        self.future = future

    def fill(self) -> None:
        """Put the read's outcome in the entry: its records, or its error; nothing when it has
        not finished (the records stay empty)."""
        if not self.future.done() or self.future.cancelled():
            return
        exc = self.future.exception()
        if exc is not None:
            logger.error("fetch from %s from the remote tier: %s", self.where, exc)
            self.entry.update(NO_OFFSETS, error_code=ErrorCode.unknown_server_error)
            return
        data, aborted = self.future.result()
        if data is None or (not self.first and len(data) > self.limit):
            return  # a later partition's first batch alone is over what is left: none
        self.entry["records"] = data
        if aborted is not None:
            self.entry["aborted_transactions"] = aborted


class RemoteReader:
    """The threads that read the remote tier for Kafka fetches (Kafka's
    ``remote.log.reader.threads``, 10), started as reads come; :meth:`close` stops them.
    Thread-safe."""

    def __init__(self, name: str, threads: int = READER_THREADS) -> None:
        self.name = name
        self.threads = threads
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._closed = False

    def read(self, log: Any, offset: int, limit: int, visible: int, read_committed: bool) -> Future:
        """Start reading ``log`` at ``offset`` (below its local segments): about ``limit`` bytes
        of whole batches (at least one), none at or above ``visible``; a Future of
        (records or None, the aborted transactions overlapping them for ``read_committed``,
        else None).

        Raises:
            LogstoreError: the reader is closed (the server stops).
        """
        with self._lock:
            if self._closed:
                raise LogstoreError(f"{self.name}: closed")
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix=self.name)
            return self._pool.submit(_read, log, offset, limit, visible, read_committed)

    def close(self) -> None:
        """Stop the threads; the reads not started are dropped (their fetches answer without
        those records). Idempotent."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


def _read(log: Any, offset: int, limit: int, visible: int, read_committed: bool) -> tuple[bytes | None, Any]:
    data, end = remote_batches(log.read_raw(offset, max(limit, 1)), visible)
    if not read_committed:
        return data, None
    aborted = [] if data is None else [{"producer_id": txn.producer_id, "first_offset": txn.first_offset}
                                      for txn in log.aborted_transactions(offset, end)]
    return data, aborted


class RemoteFetch:
    """A fetch waiting for its remote reads (Kafka's DelayedRemoteFetch): answered, through the
    purgatory, once every read finished or ``max_wait_ms`` (``remote.fetch.max.wait.ms``)
    passed, whichever comes first; the reads not finished by then are cancelled if they have not
    started and leave their partitions' records empty. Thread-safe (the purgatory completes it
    once)."""

    def __init__(self, answer: dict[str, Any], reads: list[RemoteRead]) -> None:
        self.answer = answer
        self.reads = reads

    def watch(self, purgatory: Purgatory, max_wait_ms: int) -> Future:
        """The answer's Future: waiting in ``purgatory`` (keyed by this object)."""
        waiting = purgatory.watch(self, self._attempt, max_wait_ms / 1000.0)
        for read in self.reads:
            read.future.add_done_callback(lambda _done: purgatory.check(self))
        return waiting

    def _attempt(self, expired: bool) -> dict[str, Any] | None:
        if not expired and not all(read.future.done() for read in self.reads):
            return None
        for read in self.reads:
            if not read.future.done():
                read.future.cancel()
            read.fill()
        return self.answer
