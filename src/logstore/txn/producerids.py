"""A store's producer ids: blocks handed out to InitProducerId (the Kafka server's and the
library's transactional producers'), durable in the store.

``.kafka-producer-ids`` (FORMAT.md §9) holds the exclusive end of the last block of ids taken.
A block's end is made durable before its first id is given, so ids never repeat across
restarts or crashes (Kafka's ProducerIdManager, with the file in the controller's place); a
block is taken under an advisory lock, so servers sharing a store never take the same one.

Thread-safety: :class:`ProducerIds` is thread-safe and process-safe.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Callable

from .. import _fileio
from ..errors import LogstoreError
from ..log.producers import snapshot_offsets, snapshot_path
from ..log.producerstate import CorruptSnapshotError, ProducerStateTable

__all__ = ["PRODUCER_IDS_FILE", "PRODUCER_IDS_LOCK", "ProducerIds"]

logger = logging.getLogger("logstore.txn.producerids")

#: The file in a store's root that keeps the next block of producer ids.
PRODUCER_IDS_FILE = ".kafka-producer-ids"
#: Held (flock) while a process takes a block, so that servers sharing a store never take the same.
PRODUCER_IDS_LOCK = ".lock-kafka-producer-ids"
_ID_BLOCK = 1000


class ProducerIds:
    """Producer ids that never repeat across restarts: handed out from blocks of
    ``_ID_BLOCK`` whose end is made durable (``PRODUCER_IDS_FILE``, written atomically) before
    the first id of the block is given (Kafka's ProducerIdManager). Thread-safe, and
    process-safe: a block is taken under an advisory lock (``PRODUCER_IDS_LOCK``), so servers
    sharing a store never hand out the same id.

    A store's first block starts above every producer id named by the newest producer state
    snapshot of each partition: a Kafka log directory adopted with its producers' state must
    not see their ids handed to new producers (whose sequence numbers would then be out of
    order for the old state)."""

    def __init__(self, root: str, first_at_least: Callable[[], int] | None = None) -> None:
        """``first_at_least``: the least first id of a store without the file (beside the
        producers its snapshots name). A replica set's node passes the clock: its ids are its
        own (each node's id and the set's stride make them unique across the set), and a node
        restarted with an empty disk must not hand out again the ids it gave before the wipe,
        which live on in the other nodes' producer states."""
        self._root = root
        self._first_at_least = first_at_least
        self._path = f"{root}/{PRODUCER_IDS_FILE}"
        self._lock = threading.Lock()
        self._next = 0
        self._end = 0  # exclusive end of the block taken

    def next_id(self) -> int:
        """A new producer id (durable: a restart never gives it again)."""
        with self._lock:
            if self._next >= self._end:
                self._next, self._end = self._take_block()
            pid = self._next
            self._next += 1
            return pid

    def _take_block(self) -> tuple[int, int]:
        ops = _fileio.ops
        with ops.locked(f"{self._root}/{PRODUCER_IDS_LOCK}"):
            if ops.exists(self._path):
                text = ops.read_file(self._path).decode("ascii", "replace").strip()
                if not text.isdigit():
                    raise LogstoreError(f"{self._path}: not a producer id block ({text[:40]!r})")
                start = int(text)
            else:
                start = _above_known_producers(self._root)
                if self._first_at_least is not None:
                    start = max(start, self._first_at_least())
            ops.write_file_atomic(self._path, f"{start + _ID_BLOCK}\n".encode())
        return start, start + _ID_BLOCK


def _above_known_producers(root: str) -> int:
    """The first producer id above those the newest snapshot of each partition directory under
    ``root`` names (0 when there are none); an unreadable snapshot is skipped with a warning."""
    ops = _fileio.ops
    highest = -1
    for name in ops.listdir(root):
        if name.startswith("."):
            continue
        directory = os.path.join(root, name)
        try:
            offsets = snapshot_offsets(directory)
        except NotADirectoryError:  # a file of the store's root (a checkpoint, meta.properties)
            continue
        if not offsets:
            continue
        path = snapshot_path(directory, offsets[-1])
        try:
            table = ProducerStateTable.from_snapshot(ops.read_file(path), path)
        except (OSError, CorruptSnapshotError) as exc:
            logger.warning("producer ids: skipped %s: %s", path, exc)
            continue
        highest = max([highest, *table])
    return highest + 1
