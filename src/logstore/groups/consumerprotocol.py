"""The topics of a consumer protocol subscription (Kafka's ``ConsumerProtocolSubscription``).

A classic group whose protocol type is ``consumer`` carries, as each member's JoinGroup
metadata, an ``int16 version`` followed by the subscription of that version (kio's generated
classes give the schema; versions after 3 are read as version 3 and what follows is ignored, as
Kafka's clients do). The coordinator reads the topics to answer OffsetDelete
(GROUP_SUBSCRIBED_TO_TOPIC), and the group client (:mod:`logstore.kafka.groupclient`) the
leader's view of its members.

Thread-safety: pure functions.
"""

from __future__ import annotations

import struct

from kio.serial import entity_reader
from kio.serial.errors import SerialError

__all__ = ["subscribed_topics", "MAX_READ_VERSION"]

#: the newest version of the consumer protocol's schemas read as such
MAX_READ_VERSION = 3
_I16 = struct.Struct(">h")


def subscribed_topics(data: bytes) -> list[str]:
    """The topics of a consumer protocol subscription (any version).

    Raises:
        ValueError: the subscription is truncated, malformed or of a negative version.
    """
    if len(data) < 2:
        raise ValueError(f"a consumer protocol subscription of {len(data)} bytes")
    (version,) = _I16.unpack_from(data, 0)
    if version < 0:
        raise ValueError(f"a consumer protocol subscription of version {version}")
    module = __import__(f"kio.schema.consumer_protocol_subscription.v{min(version, MAX_READ_VERSION)}.data",
                        fromlist=["ConsumerProtocolSubscription"])
    try:
        parsed, _ = entity_reader(module.ConsumerProtocolSubscription)(memoryview(data)[2:].toreadonly(), 0)
    except (SerialError, ValueError, struct.error, IndexError) as exc:
        raise ValueError(f"a malformed consumer protocol subscription: {exc}") from None
    return [str(t) for t in parsed.topics]
