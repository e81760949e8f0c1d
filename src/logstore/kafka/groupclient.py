"""A consumer group member's side of Kafka's classic group protocol, and the consumer protocol.

:class:`GroupClient` sends JoinGroup v5, SyncGroup v3, Heartbeat v3, LeaveGroup v3 and
OffsetCommit v7 to a group coordinator over one connection (the kio codec of
:mod:`logstore.kafka.client`), and answers with Kafka's error codes as ints; a connection that
fails or answers garbage raises :class:`~logstore.kafka.client.KafkaClientError` and is closed.
The library's consumers in different processes speak it to their store's coordinator
(:mod:`logstore.client.groupservice`).

The consumer protocol is Kafka's (``ConsumerProtocolSubscription``/``ConsumerProtocolAssignment``,
version 0, with kio's generated classes): a member's JoinGroup metadata lists its topics; the
leader's SyncGroup hands each member its partitions. Later versions are read as far as version
3 goes, and what follows is ignored, as Kafka's clients do. :func:`range_assign` is Kafka's
RangeAssignor: per topic, the members subscribed to it in member id order, each taking
``n // m`` consecutive partitions and the first ``n % m`` one more.

Not thread-safe: one request at a time per client (the caller serialises).
"""

from __future__ import annotations

import io
import socket
import struct
from typing import Any, Iterable, Mapping, NamedTuple

from kio.schema.consumer_protocol_subscription.v0.data import ConsumerProtocolSubscription
from kio.serial import entity_writer

from ..errorcodes import ErrorCode
from ..groups import consumerprotocol
from ..groups.consumerprotocol import subscribed_topics
from .apikeys import HEARTBEAT, JOIN_GROUP, LEAVE_GROUP, OFFSET_COMMIT, SYNC_GROUP
from .client import Connection, KafkaClientError, Security

__all__ = ["GroupClient", "JoinAnswer", "encode_subscription", "decode_subscription", "encode_assignment",
           "decode_assignment", "range_assign", "PROTOCOL_TYPE", "RANGE"]

PROTOCOL_TYPE = "consumer"
RANGE = "range"
_I16 = struct.Struct(">h")


class JoinAnswer(NamedTuple):
    """A JoinGroup's answer: the error code, and on success the generation, its protocol, its
    leader, this member's id and (to the leader only) every member's subscribed topics."""

    error: int
    generation: int
    protocol: str
    leader: str
    member_id: str
    members: dict[str, list[str]]


def encode_subscription(topics: Iterable[str]) -> bytes:
    """JoinGroup metadata of the consumer protocol (version 0) for ``topics``."""
    out = io.BytesIO()
    out.write(_I16.pack(0))
    entity_writer(ConsumerProtocolSubscription)(out, ConsumerProtocolSubscription(topics=tuple(sorted(topics)),
                                                                                   user_data=None))
    return out.getvalue()


def decode_subscription(data: bytes) -> list[str]:
    """The topics of a consumer protocol subscription (any version)."""
    try:
        return subscribed_topics(data)
    except ValueError as exc:
        raise KafkaClientError(str(exc)) from None


def encode_assignment(partitions: Mapping[str, Iterable[int]]) -> bytes:
    """SyncGroup assignment of the consumer protocol (version 0): ``{topic: partitions}``."""
    return consumerprotocol.encode_assignment(partitions, 0)


def decode_assignment(data: bytes) -> dict[str, list[int]]:
    """``{topic: partitions}`` of a consumer protocol assignment (any version); an empty
    assignment (no bytes, as a coordinator hands a member the leader named nothing for) is {}."""
    try:
        return consumerprotocol.assigned_partitions(data)
    except ValueError as exc:
        raise KafkaClientError(str(exc)) from None


def range_assign(subscriptions: Mapping[str, Iterable[str]],
                 partitions: Mapping[str, int]) -> dict[str, dict[str, list[int]]]:
    """Kafka's RangeAssignor: ``{member: {topic: partitions}}`` from each member's topics and
    each topic's partition count (topics missing from ``partitions`` are skipped)."""
    out: dict[str, dict[str, list[int]]] = {member: {} for member in subscriptions}
    topics = sorted({t for ts in subscriptions.values() for t in ts})
    for topic in topics:
        if topic not in partitions:
            continue
        members = sorted(m for m, ts in subscriptions.items() if topic in ts)
        per, extra = divmod(partitions[topic], len(members))
        start = 0
        for i, member in enumerate(members):
            n = per + (1 if i < extra else 0)
            if n:
                out[member][topic] = list(range(start, start + n))
            start += n
    return out


class GroupClient:
    """A group member's connection to its coordinator (see the module docstring).

    Args:
        sock: a connected socket (a Unix socket to the store's coordinator).
        address: what to call the coordinator in errors.
        client_id: the client id of the requests.
        timeout: seconds to wait for an answer (a JoinGroup waits its rebalance timeout more).
    """

    def __init__(self, sock: socket.socket, address: str, client_id: str, timeout: float = 30.0) -> None:
        sock.settimeout(timeout)
        self.timeout = timeout
        self._conn = Connection(address, 0, timeout, client_id, Security(), sock=sock)

    def _call(self, api_key: int, fields: Mapping[str, Any], timeout: float | None = None) -> Any:
        try:
            self._conn.sock.settimeout(timeout or self.timeout)
            return self._conn.request(api_key, fields)
        except BaseException:
            self.close()
            raise

    def join(self, group: str, member_id: str, session_ms: int, rebalance_ms: int, topics: Iterable[str],
             instance_id: str | None = None) -> JoinAnswer:
        """A JoinGroup with the range protocol; a MEMBER_ID_REQUIRED answer is joined again with
        the id it hands out (KIP-394), so the answer is the join's outcome."""
        metadata = encode_subscription(topics)
        for _ in range(2):
            answer = self._call(JOIN_GROUP, {
                "group_id": group, "session_timeout": session_ms, "rebalance_timeout": rebalance_ms,
                "member_id": member_id, "group_instance_id": instance_id, "protocol_type": PROTOCOL_TYPE,
                "protocols": [{"name": RANGE, "metadata": metadata}]}, timeout=self.timeout + rebalance_ms / 1000)
            error = int(answer.error_code.value)
            member_id = answer.member_id
            if error != ErrorCode.member_id_required:
                break
        members = ({m.member_id: decode_subscription(bytes(m.metadata)) for m in answer.members}
                   if error == ErrorCode.none else {})
        return JoinAnswer(error, int(answer.generation_id), answer.protocol_name, answer.leader, member_id, members)

    def sync(self, group: str, generation: int, member_id: str,
             assignments: Mapping[str, Mapping[str, Iterable[int]]], rebalance_ms: int) -> tuple[int, dict[str, list[int]]]:
        """A SyncGroup (the leader passes every member's partitions): the error code and this
        member's ``{topic: partitions}``."""
        answer = self._call(SYNC_GROUP, {
            "group_id": group, "generation_id": generation, "member_id": member_id, "group_instance_id": None,
            "assignments": [{"member_id": m, "assignment": encode_assignment(parts)}
                            for m, parts in assignments.items()]}, timeout=self.timeout + rebalance_ms / 1000)
        error = int(answer.error_code.value)
        return error, (decode_assignment(bytes(answer.assignment)) if error == ErrorCode.none else {})

    def heartbeat(self, group: str, generation: int, member_id: str) -> int:
        """A Heartbeat: its error code (REBALANCE_IN_PROGRESS: join again)."""
        answer = self._call(HEARTBEAT, {"group_id": group, "generation_id": generation, "member_id": member_id,
                                        "group_instance_id": None})
        return int(answer.error_code.value)

    def leave(self, group: str, member_id: str) -> int:
        """A LeaveGroup of this member: its error code."""
        answer = self._call(LEAVE_GROUP, {"group_id": group,
                                          "members": [{"member_id": member_id, "group_instance_id": None}]})
        error = int(answer.error_code.value)
        return error or next((int(m.error_code.value) for m in answer.members), ErrorCode.none)

    def commit(self, group: str, generation: int, member_id: str,
               offsets: Mapping[tuple[str, int], tuple[int, str]]) -> dict[tuple[str, int], int]:
        """An OffsetCommit of ``{(topic, partition): (offset, metadata)}``: an error code for each."""
        topics: dict[str, list[dict[str, Any]]] = {}
        for (topic, partition), (offset, metadata) in offsets.items():
            topics.setdefault(topic, []).append({"partition_index": partition, "committed_offset": offset,
                                                 "committed_leader_epoch": -1, "committed_metadata": metadata})
        answer = self._call(OFFSET_COMMIT, {"group_id": group, "generation_id_or_member_epoch": generation,
                                            "member_id": member_id, "group_instance_id": None,
                                            "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()]})
        return {(str(t.name), int(p.partition_index)): int(p.error_code.value)
                for t in answer.topics for p in t.partitions}

    def close(self) -> None:
        """Close the connection. Idempotent."""
        try:
            self._conn.close()
        except OSError:
            pass
