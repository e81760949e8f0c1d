"""The authorization table (logstore.kafka.aclguard): every API served has a rule; every
rule's fields exist in every version served (so a version raised elsewhere shows here first);
the refusals built from the response schemas encode for every API and version; and the guard
filters, refuses and fills in as the rules say, read back through kio's own reader."""

from __future__ import annotations

import dataclasses

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader

from logstore import LogStore
from logstore.errorcodes import ErrorCode
from logstore.kafka.aclguard import RULES, Access, GuardContext, error_response, guard
from logstore.kafka.acls import (AclBinding, AclOperation as Op, AclPermissionType as Perm, Authorizer, MemoryAcls,
                                 PatternType as PT, ResourceType as RT)
from logstore.kafka.apis import KafkaApis
from logstore.kafka.wire import SUPPORTED, KafkaRequest, encode
from logstore.kafka.writer import field_shape


def allow(name, op, kind=RT.TOPIC, principal="User:alice", perm=Perm.ALLOW, pattern=PT.LITERAL):
    return AclBinding(kind, name, pattern, principal, "*", op, perm)


def served(key):
    low, high = SUPPORTED[key]
    return range(max(low, 3) if key == 0 else low, high + 1)  # (Produce v0-v2: refused before any handler)


def read_back(key, version, frame):
    """The response as kio reads it (frame: size, header, body)."""
    data = b"".join(bytes(p) for p in frame)[4:]
    cls = load_response_schema(key, version)
    header_size = 4 + (1 if getattr(cls, "__flexible__", False) and key != 18 else 0)
    body, _ = entity_reader(cls)(memoryview(data), header_size)
    return body


def test_every_api_served_has_a_rule(tmp_path):
    with LogStore(str(tmp_path)) as store:
        apis = KafkaApis(store, node_id=0, host="h", port=1, cluster_id="c")
        try:
            assert sorted(set(apis.handlers) - set(RULES)) == []
            assert sorted(set(apis.supported) - set(apis.handlers)) == []  # every API advertised is answered
        finally:
            apis.close()


def _has(cls, path):
    for name in path:
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if name not in fields:
            return False
        entity = field_shape(fields[name].type)[1]
        cls = entity if entity is not None else cls
    return True


@pytest.mark.parametrize("key", sorted(k for k, r in RULES.items() if r.items and k in SUPPORTED))
def test_each_rules_fields_exist_in_every_version_served(key):
    for version in served(key):
        request, response = load_request_schema(key, version), load_response_schema(key, version)
        for items in RULES[key].items:
            assert _has(request, (items.field,)), (key, version, items.field)
            assert _has(response, (items.response,)), (key, version, items.response)
            if items.partitions is not None:
                listed, index, answers, answer_index = items.partitions
                assert _has(request, (items.field, listed)), (key, version, listed)
                assert _has(response, (items.response, answers, answer_index)), (key, version, answers)


def kio_versions(key):
    version = 0
    while True:
        try:
            load_request_schema(key, version)
        except Exception:  # noqa: BLE001 - kio has no more
            return range(version)
        version += 1


@pytest.mark.parametrize("key", sorted(k for k, r in RULES.items() if r.items and k not in SUPPORTED))
def test_the_rules_of_apis_served_elsewhere_fit_every_version_kio_has(key):
    """The rules written for the handlers other changes add (DeleteRecords, AlterConfigs, ...)."""
    for version in kio_versions(key):
        request, response = load_request_schema(key, version), load_response_schema(key, version)
        for items in RULES[key].items:
            assert _has(request, (items.field,)) and _has(response, (items.response,)), (key, version)
            if items.partitions is not None:
                assert _has(response, (items.response, items.partitions[2], items.partitions[3])), (key, version)


@pytest.mark.parametrize("key", sorted(set(SUPPORTED) | {k for k in RULES if k not in (17, 36)}))
def test_a_refusal_built_from_the_schema_encodes_for_every_version(key):
    for version in served(key) if key in SUPPORTED else kio_versions(key):
        request = KafkaRequest(key, version, 7, "c", None)
        answer = error_response(request, ErrorCode.cluster_authorization_failed, "no")
        body = read_back(key, version, encode(7, key, version, answer))
        if hasattr(body, "error_code"):
            assert body.error_code == ErrorCode.cluster_authorization_failed


def request_of(key, version, client_id="c", principal="User:alice", **fields):
    cls = load_request_schema(key, version)
    req = KafkaRequest(key, version, 1, client_id, cls(**fields))
    req.principal = principal
    req.client_host = "/127.0.0.1"
    return req


def test_a_denied_topic_is_answered_and_the_rest_served():
    from kio.schema.list_offsets.v5.request import ListOffsetsPartition, ListOffsetsTopic
    seen = []

    def handler(request):
        seen.append([t.name for t in request.body.topics])
        return {"throttle_time": 0, "topics": [{"name": t.name, "partitions": [
            {"partition_index": 0, "error_code": 0, "timestamp": -1, "offset": 5, "leader_epoch": 0}]}
            for t in request.body.topics]}

    authorizer = Authorizer(MemoryAcls([allow("yes", Op.DESCRIBE)]))
    guarded = guard({2: handler}, authorizer, GuardContext())[2]
    import datetime
    part = ListOffsetsPartition(partition_index=0, current_leader_epoch=-1,
                                timestamp=datetime.datetime.fromtimestamp(0, datetime.timezone.utc))
    req = request_of(2, 5, replica_id=-1, isolation_level=0,
                     topics=(ListOffsetsTopic(name="yes", partitions=(part,)),
                             ListOffsetsTopic(name="no", partitions=(part,))))
    answer = guarded(req)
    assert seen == [["yes"]]
    body = read_back(2, 5, encode(1, 2, 5, answer))
    assert {t.name: t.partitions[0].error_code for t in body.topics} == {
        "yes": ErrorCode.none, "no": ErrorCode.topic_authorization_failed}


def test_a_whole_request_refused_answers_each_item_and_never_calls_the_handler():
    from kio.schema.offset_commit.v7.request import OffsetCommitRequestPartition, OffsetCommitRequestTopic
    called = []
    guarded = guard({8: lambda r: called.append(r)}, Authorizer(MemoryAcls([allow("t", Op.READ)])), GuardContext())[8]
    part = OffsetCommitRequestPartition(partition_index=3, committed_offset=1, committed_leader_epoch=-1,
                                        committed_metadata="")
    req = request_of(8, 7, group_id="g", generation_id_or_member_epoch=1, member_id="m", group_instance_id=None,
                     topics=(OffsetCommitRequestTopic(name="t", partitions=(part,)),))
    body = read_back(8, 7, encode(1, 8, 7, guarded(req)))
    assert called == []
    assert [(t.name, p.partition_index, p.error_code) for t in body.topics for p in t.partitions] == [
        ("t", 3, ErrorCode.group_authorization_failed)]


def test_offset_fetch_of_several_groups_answers_each_denied_group_and_topic_and_serves_the_rest():
    from kio.schema.offset_fetch.v8.request import OffsetFetchRequestGroup, OffsetFetchRequestTopics
    seen = []

    def handler(request):
        seen.append([(g.group_id, None if g.topics is None else [t.name for t in g.topics])
                     for g in request.body.groups])
        return {"throttle_time": 0, "groups": [
            {"group_id": g.group_id, "error_code": 0, "topics": [
                {"name": name, "partitions": [{"partition_index": 0, "committed_offset": 7,
                                               "committed_leader_epoch": -1, "metadata": "", "error_code": 0}]}
                for name in ([t.name for t in g.topics] if g.topics is not None else ["yes", "no"])]}
            for g in request.body.groups]}

    acls = [allow("g1", Op.DESCRIBE, RT.GROUP), allow("g2", Op.DESCRIBE, RT.GROUP), allow("yes", Op.DESCRIBE)]
    guarded = guard({9: handler}, Authorizer(MemoryAcls(acls)), GuardContext())[9]
    asked = (OffsetFetchRequestTopics(name="yes", partition_indexes=(0,)),
             OffsetFetchRequestTopics(name="no", partition_indexes=(0, 1)))
    req = request_of(9, 8, groups=(OffsetFetchRequestGroup(group_id="g1", topics=asked),
                                   OffsetFetchRequestGroup(group_id="g2", topics=None),
                                   OffsetFetchRequestGroup(group_id="denied", topics=asked)),
                     require_stable=False)
    body = read_back(9, 8, encode(1, 9, 8, guarded(req)))
    assert seen == [[("g1", ["yes"]), ("g2", None)]]
    answers = {g.group_id: (g.error_code, {(t.name, p.partition_index): p.error_code for t in g.topics
                                           for p in t.partitions}) for g in body.groups}
    assert answers == {
        "g1": (0, {("yes", 0): 0, ("no", 0): ErrorCode.topic_authorization_failed,
                   ("no", 1): ErrorCode.topic_authorization_failed}),
        "g2": (0, {("yes", 0): 0}),  # all of a group's offsets: only the topics it may describe
        "denied": (ErrorCode.group_authorization_failed, {})}


def test_an_api_without_a_rule_needs_cluster_action():
    guarded = guard({18: lambda r: "served"}, Authorizer(MemoryAcls()), GuardContext(), rules={})[18]
    answer = guarded(request_of(18, 2))
    assert answer["error_code"] == ErrorCode.cluster_authorization_failed
    supers = Authorizer(MemoryAcls(), super_users=["User:alice"])
    assert guard({18: lambda r: "served"}, supers, GuardContext(), rules={})[18](request_of(18, 2)) == "served"


def test_without_an_authorizer_only_kip430_rules_wrap_and_everything_is_allowed():
    handlers = {0: lambda r: "produce", 15: lambda r: {"throttle_time": 0, "groups": [
        {"error_code": 0, "group_id": "g", "authorized_operations": -2147483648}]}}
    out = guard(handlers, None, GuardContext())
    assert out[0] is handlers[0]
    answer = out[15](request_of(15, 4, groups=("g",), include_authorized_operations=True))
    assert answer["groups"][0]["authorized_operations"] == sum(1 << op for op in (
        Op.READ, Op.DESCRIBE, Op.DELETE, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS))


def test_access_remembers_its_answers_and_takes_anonymous_without_sasl():
    req = request_of(18, 2, principal=None)
    access = Access.of(Authorizer(MemoryAcls([allow("t", Op.READ, principal="User:ANONYMOUS")])), req)
    assert access.principal == "User:ANONYMOUS" and access.host == "127.0.0.1"
    assert access.allowed(Op.READ, RT.TOPIC, "t") and not access.allowed(Op.WRITE, RT.TOPIC, "t")


def test_fetch_by_topic_id_is_checked_on_the_topic_the_id_names():
    """Fetch v13+ names topics by id: the guard asks the server for the name (GuardContext's
    topic_name); an id it cannot name is denied."""
    import datetime
    import uuid
    from kio.schema.fetch.v13.request import FetchPartition, FetchTopic
    ids = {uuid.UUID(int=1): "readable", uuid.UUID(int=2): "secret"}
    seen = []

    def handler(request):
        seen.append([t.topic_id for t in request.body.topics])
        return {"throttle_time": 0, "error_code": 0, "session_id": 0, "responses": [
            {"topic_id": t.topic_id, "partitions": []} for t in request.body.topics]}

    authorizer = Authorizer(MemoryAcls([allow("readable", Op.READ)]))
    guarded = guard({1: handler}, authorizer, GuardContext(topic_name=ids.get))[1]
    part = FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1024)
    req = request_of(1, 13, max_wait=datetime.timedelta(0), min_bytes=1, forgotten_topics_data=(),
                     topics=tuple(FetchTopic(topic_id=i, partitions=(part,)) for i in (*ids, uuid.UUID(int=3))))
    body = read_back(1, 13, encode(1, 1, 13, guarded(req)))
    assert seen == [[uuid.UUID(int=1)]]
    assert {t.topic_id.int: [p.error_code for p in t.partitions] for t in body.responses} == {
        1: [], 2: [ErrorCode.topic_authorization_failed], 3: [ErrorCode.topic_authorization_failed]}


def test_a_followers_fetch_needs_cluster_action_only():
    from kio.schema.fetch.v11.request import FetchPartition, FetchTopic
    import datetime
    part = FetchPartition(partition=0, current_leader_epoch=-1, fetch_offset=0, log_start_offset=-1,
                          partition_max_bytes=1024)
    req = request_of(1, 11, replica_id=2, max_wait=datetime.timedelta(0), min_bytes=1, max_bytes=1 << 20,
                     isolation_level=0, session_id=0, session_epoch=-1, rack_id="", forgotten_topics_data=(),
                     topics=(FetchTopic(topic="t", partitions=(part,)),))
    served = lambda r: "served"  # noqa: E731
    assert guard({1: served}, Authorizer(MemoryAcls([allow("kafka-cluster", Op.CLUSTER_ACTION, RT.CLUSTER)])),
                 GuardContext())[1](req) == "served"
    refused = guard({1: served}, Authorizer(MemoryAcls([allow("t", Op.READ)])), GuardContext())[1](req)
    assert [p["error_code"] for t in refused["responses"] for p in t["partitions"]] == [
        ErrorCode.topic_authorization_failed]
