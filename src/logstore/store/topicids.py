"""Topic ids (KIP-516): Kafka's text form of a topic's UUID and the ``partition.metadata`` file.

Every topic has a random UUID, fixed when it is created: a topic deleted and created again
under the same name is another topic, with another id, and a client that addresses the old
one by id (Fetch v13+) is told UNKNOWN_TOPIC_ID instead of reading the new one's records.

Where the id lives (one home, one derived copy):

- **The home** is the topic's file in the store's ``.topics/`` directory (a ``topic.id=`` line
  beside ``partitions=``): it is written atomically with the topic itself, so a topic never
  exists without its id, and a deleted topic's id goes with its file.
- **The copy** is Kafka's ``partition.metadata`` in each partition directory, where a Kafka
  broker keeps it (``PartitionMetadataFile``), so that a directory the store wrote reads as
  Kafka's does. The store writes it when it opens a partition that has none, and checks it
  when there is one: a partition directory of another topic id is
  :class:`~logstore.errors.InconsistentTopicIdError` (Kafka's INCONSISTENT_TOPIC_ID), never
  taken up as this topic's.
- A Kafka log directory adopted by a store (:mod:`logstore.store.kafkadirs`) keeps the id of
  its partitions' ``partition.metadata``; a store written before topic ids gets one per topic
  when it is opened (durable, under the store's topic lock; an id found in a partition
  directory wins over a new one).

The file, as Kafka writes it (no newline after the id; Kafka's reader takes ``:`` followed
by whitespace as the separator, and any version from 0 up)::

    version: 0
    topic_id: 6zOrJqXzRGaOFBVjEtnVdA

The id's text form is Kafka's ``Uuid.toString``: the 16 bytes in URL-safe base64, without
padding (22 characters). Kafka never hands out the all-zero id (its "no id") nor 1 (its
metadata topic's), nor one whose text starts with ``-`` (which command lines would take for an
option).

Thread-safety: the functions share no state. ``write_partition_metadata`` replaces the file
atomically (a reader sees the old file or the new one).
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import uuid

from .. import _fileio
from ..errors import LogstoreError

__all__ = ["PARTITION_METADATA_FILE", "ZERO_TOPIC_ID", "new_topic_id", "topic_id_text", "parse_topic_id",
           "encode_partition_metadata", "decode_partition_metadata", "read_partition_metadata",
           "write_partition_metadata"]

#: Kafka's file name (PartitionMetadataFile), in each partition directory
PARTITION_METADATA_FILE = "partition.metadata"
#: the version this store writes (Kafka's CURRENT_VERSION)
PARTITION_METADATA_VERSION = 0
#: Kafka's "no topic id" (Uuid.ZERO_UUID): what a request without one carries
ZERO_TOPIC_ID = uuid.UUID(int=0)
_RESERVED = (ZERO_TOPIC_ID, uuid.UUID(int=1))  # Kafka's ZERO_UUID and METADATA_TOPIC_ID
_SEPARATOR = re.compile(r":\s+")


def new_topic_id() -> uuid.UUID:
    """A random topic id, as Kafka's ``Uuid.randomUuid``: never a reserved one, never one whose
    text starts with ``-``."""
    while True:
        candidate = uuid.uuid4()
        if candidate not in _RESERVED and not topic_id_text(candidate).startswith("-"):
            return candidate


def topic_id_text(topic_id: uuid.UUID) -> str:
    """Kafka's text form of an id: URL-safe base64 of its 16 bytes, unpadded.

    >>> topic_id_text(uuid.UUID(int=1))
    'AAAAAAAAAAAAAAAAAAAAAQ'
    """
    return base64.urlsafe_b64encode(topic_id.bytes).decode("ascii").rstrip("=")


def parse_topic_id(text: str) -> uuid.UUID:
    """The id of Kafka's text form (see :func:`topic_id_text`).

    Raises:
        ValueError: not 22 characters of URL-safe base64 making 16 bytes.
    """
    if not isinstance(text, str) or len(text) != 22 or not re.fullmatch(r"[A-Za-z0-9_-]+", text):
        raise ValueError(f"not a topic id (22 characters of URL-safe base64): {text!r}")
    try:
        raw = base64.urlsafe_b64decode(text + "==")
    except (binascii.Error, ValueError):
        raise ValueError(f"not a topic id (22 characters of URL-safe base64): {text!r}") from None
    if len(raw) != 16:
        raise ValueError(f"not a topic id (16 bytes): {text!r}")
    return uuid.UUID(bytes=raw)


def encode_partition_metadata(topic_id: uuid.UUID) -> bytes:
    """The ``partition.metadata`` file's bytes, exactly as Kafka writes them."""
    return f"version: {PARTITION_METADATA_VERSION}\ntopic_id: {topic_id_text(topic_id)}".encode()


def decode_partition_metadata(data: bytes, path: str) -> uuid.UUID:
    """The topic id of a ``partition.metadata`` file's bytes, read by Kafka's rules (a version
    of 0 or more; lines ``<key>: <value>``; the zero id refused).

    Raises:
        LogstoreError: a malformed file (naming ``path`` and the line), a negative version, or
            the zero id.
    """
    try:
        lines = data.decode("utf-8").splitlines()
    except UnicodeDecodeError:
        raise LogstoreError(f"{path}: partition metadata is not UTF-8 text") from None
    line = lines[0] if lines else ""
    parts = _SEPARATOR.split(line)
    if len(parts) != 2 or not parts[1].strip().lstrip("-").isdigit():
        raise LogstoreError(f"{path}: malformed line in partition metadata: {line!r}")
    version = int(parts[1])
    if version < PARTITION_METADATA_VERSION:
        raise LogstoreError(f"{path}: unrecognized partition metadata version {version}")
    line = lines[1] if len(lines) > 1 else ""
    parts = _SEPARATOR.split(line)
    if len(parts) != 2:
        raise LogstoreError(f"{path}: malformed line in partition metadata: {line!r}")
    try:
        topic_id = parse_topic_id(parts[1].strip())
    except ValueError as exc:
        raise LogstoreError(f"{path}: malformed line in partition metadata: {line!r} ({exc})") from None
    if topic_id == ZERO_TOPIC_ID:
        raise LogstoreError(f"{path}: invalid topic id (all zeros) in partition metadata")
    return topic_id


def read_partition_metadata(directory: str) -> uuid.UUID | None:
    """The topic id in ``directory``'s ``partition.metadata``, or None when it has none.

    Raises:
        LogstoreError: the file is malformed (see :func:`decode_partition_metadata`).
    """
    path = os.path.join(directory, PARTITION_METADATA_FILE)
    try:
        data = _fileio.ops.read_file(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not data:  # two processes wrote it at once and one crashed between truncate and write: as missing
        return None
    return decode_partition_metadata(data, path)


def write_partition_metadata(directory: str, topic_id: uuid.UUID) -> None:
    """Write ``directory``'s ``partition.metadata`` (Kafka's format). Durable on return:
    written to a temporary file, fsynced, renamed over the old one, the directory fsynced.

    Several processes opening a shared store may write the same file at once, with the same
    bytes (the id comes from the topic file): whichever rename lands, the file is whole; one
    whose temporary file was renamed by the other finds the file in place."""
    path = os.path.join(directory, PARTITION_METADATA_FILE)
    try:
        _fileio.ops.write_file_atomic(path, encode_partition_metadata(topic_id), tmp=path + ".tmp")
    except FileNotFoundError:
        if read_partition_metadata(directory) != topic_id:
            raise
