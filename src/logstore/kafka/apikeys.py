"""Kafka's API keys: the one home of the request-type numbers on the wire.

The numbers of the requests logstore sends or answers by key, as Kafka's protocol guide lists
them (``ApiKeys`` in Kafka's clients). kio's message classes carry theirs as ``__api_key__``; these
names are for the code that switches on a key or sends a request by it.
"""

from __future__ import annotations

__all__ = ["PRODUCE", "FETCH", "LIST_OFFSETS", "METADATA", "OFFSET_COMMIT", "JOIN_GROUP", "HEARTBEAT",
           "LEAVE_GROUP", "SYNC_GROUP", "SASL_HANDSHAKE", "API_VERSIONS", "CREATE_TOPICS", "SASL_AUTHENTICATE",
           "INIT_PRODUCER_ID", "ADD_PARTITIONS_TO_TXN", "WRITE_TXN_MARKERS", "DESCRIBE_ACLS",
           "CREATE_ACLS", "DELETE_ACLS", "VOTE", "BEGIN_QUORUM_EPOCH",
           "DESCRIBE_QUORUM", "ENVELOPE", "CONSUMER_GROUP_HEARTBEAT", "CONSUMER_GROUP_DESCRIBE"]

PRODUCE = 0
FETCH = 1
LIST_OFFSETS = 2
METADATA = 3
OFFSET_COMMIT = 8
JOIN_GROUP = 11
HEARTBEAT = 12
LEAVE_GROUP = 13
SYNC_GROUP = 14
SASL_HANDSHAKE = 17
API_VERSIONS = 18
CREATE_TOPICS = 19
INIT_PRODUCER_ID = 22
ADD_PARTITIONS_TO_TXN = 24
WRITE_TXN_MARKERS = 27
DESCRIBE_ACLS = 29
CREATE_ACLS = 30
DELETE_ACLS = 31
SASL_AUTHENTICATE = 36
VOTE = 52
BEGIN_QUORUM_EPOCH = 53
DESCRIBE_QUORUM = 55
ENVELOPE = 58
CONSUMER_GROUP_HEARTBEAT = 68
CONSUMER_GROUP_DESCRIBE = 69
