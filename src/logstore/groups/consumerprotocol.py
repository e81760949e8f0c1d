"""The topics of a consumer protocol subscription (Kafka's ``ConsumerProtocolSubscription``).

A classic group whose protocol type is ``consumer`` carries, as each member's JoinGroup
metadata, an ``int16 version`` followed by the subscription of that version (kio's generated
classes give the schema; versions after 3 are read as version 3 and what follows is ignored, as
Kafka's clients do). The coordinator reads the topics to answer OffsetDelete
(GROUP_SUBSCRIBED_TO_TOPIC), and the group client (:mod:`logstore.kafka.groupclient`) the
leader's view of its members. A classic member of a KIP-848 consumer group
(:mod:`~logstore.groups.consumergroup`) is read whole (:func:`parse_subscription`: its topics,
the partitions it owns, its rack) and handed its assignment as a ``ConsumerProtocolAssignment``
of its subscription's version (:func:`encode_assignment`).

Thread-safety: pure functions.
"""

from __future__ import annotations

import io
import struct
from typing import Any, Iterable, Mapping, NamedTuple

from kio.serial import entity_reader, entity_writer
from kio.serial.errors import SerialError

__all__ = ["subscribed_topics", "MAX_READ_VERSION", "Subscription", "parse_subscription", "encode_assignment",
           "assigned_partitions", "subscription_version"]

#: the newest version of the consumer protocol's schemas read as such
MAX_READ_VERSION = 3
_I16 = struct.Struct(">h")


class Subscription(NamedTuple):
    """A consumer protocol subscription: its version, topics, owned partitions (v1+: topic ->
    partitions) and rack (v3+)."""

    version: int
    topics: tuple[str, ...]
    owned: dict[str, frozenset[int]]
    rack_id: str | None


def subscription_version(data: bytes) -> int:
    """The version a consumer protocol subscription (or assignment) starts with.

    Raises:
        ValueError: fewer than two bytes, or a negative version.
    """
    if len(data) < 2:
        raise ValueError(f"a consumer protocol subscription of {len(data)} bytes")
    (version,) = _I16.unpack_from(data, 0)
    if version < 0:
        raise ValueError(f"a consumer protocol subscription of version {version}")
    return int(version)


def _parse(data: bytes) -> tuple[int, Any]:
    version = subscription_version(data)
    module = __import__(f"kio.schema.consumer_protocol_subscription.v{min(version, MAX_READ_VERSION)}.data",
                        fromlist=["ConsumerProtocolSubscription"])
    try:
        parsed, _ = entity_reader(module.ConsumerProtocolSubscription)(memoryview(data)[2:].toreadonly(), 0)
    except (SerialError, ValueError, struct.error, IndexError) as exc:
        raise ValueError(f"a malformed consumer protocol subscription: {exc}") from None
    return version, parsed


def subscribed_topics(data: bytes) -> list[str]:
    """The topics of a consumer protocol subscription (any version).

    Raises:
        ValueError: the subscription is truncated, malformed or of a negative version.
    """
    return [str(t) for t in _parse(data)[1].topics]


def parse_subscription(data: bytes) -> Subscription:
    """A consumer protocol subscription whole (any version).

    Raises:
        ValueError: the subscription is truncated, malformed or of a negative version.
    """
    version, parsed = _parse(data)
    owned: dict[str, frozenset[int]] = {}
    for tp in getattr(parsed, "owned_partitions", ()):
        owned[str(tp.topic)] = owned.get(str(tp.topic), frozenset()) | frozenset(int(p) for p in tp.partitions)
    return Subscription(version, tuple(str(t) for t in parsed.topics), owned, getattr(parsed, "rack_id", None))


def encode_assignment(partitions: Mapping[str, Iterable[int]], version: int = 0) -> bytes:
    """A ``ConsumerProtocolAssignment`` of ``version`` (a newer one written as the newest
    known, with its own version number, as Kafka's clients read it) for ``{topic: partitions}``."""
    module = __import__(f"kio.schema.consumer_protocol_assignment.v{min(max(version, 0), MAX_READ_VERSION)}.data",
                        fromlist=["ConsumerProtocolAssignment"])
    out = io.BytesIO()
    out.write(_I16.pack(max(version, 0)))
    assigned = tuple(module.TopicPartition(topic=topic, partitions=tuple(sorted(parts)))
                     for topic, parts in sorted(partitions.items()))
    entity_writer(module.ConsumerProtocolAssignment)(out, module.ConsumerProtocolAssignment(
        assigned_partitions=assigned, user_data=None))
    return out.getvalue()


def assigned_partitions(data: bytes) -> dict[str, list[int]]:
    """``{topic: partitions}`` of a ``ConsumerProtocolAssignment`` (any version); no bytes (what
    a member the leader named nothing for is handed) is {}.

    Raises:
        ValueError: the assignment is truncated, malformed or of a negative version.
    """
    if not data:
        return {}
    version = subscription_version(data)
    module = __import__(f"kio.schema.consumer_protocol_assignment.v{min(version, MAX_READ_VERSION)}.data",
                        fromlist=["ConsumerProtocolAssignment"])
    try:
        parsed, _ = entity_reader(module.ConsumerProtocolAssignment)(memoryview(data)[2:].toreadonly(), 0)
    except (SerialError, ValueError, struct.error, IndexError) as exc:
        raise ValueError(f"a malformed consumer protocol assignment: {exc}") from None
    out: dict[str, list[int]] = {}
    for tp in parsed.assigned_partitions:
        out.setdefault(str(tp.topic), []).extend(int(p) for p in tp.partitions)
    return out
