"""Authorization of every request: one declarative table, :data:`RULES`, from API key to what a
request of that API needs, applied around the handlers by :func:`guard`.

A :class:`Rule` says, as Kafka's KafkaApis does per API:

- ``needs``: what the request as a whole needs (:class:`Need`: an operation on one resource
  named by the request: its group, its transactional id, the cluster), checked in order; the
  first denied refuses the whole request with that resource type's error
  (TOPIC_AUTHORIZATION_FAILED, GROUP_AUTHORIZATION_FAILED, CLUSTER_AUTHORIZATION_FAILED,
  TRANSACTIONAL_ID_AUTHORIZATION_FAILED): every item of the request answered with it, and
  the response's own ``error_code`` when it has one.
- ``items``: the resources the request lists (:class:`Items`: its topics, groups,
  transactional ids, config resources), each checked on its own: a denied one is taken out of
  the request the handler sees and answered with its error, and the rest is served (Kafka's
  ``filterByAuthorized``). The answers are built from the response's schema (kio's class of
  the version asked), so an entry has every field of its version.
- ``answer_filter``: what an answer lists that the principal may not see is dropped from it
  (ListGroups, ListTransactions, OffsetFetch of all of a group's topics, a new topic's configs
  in CreateTopics, a consumer group naming undescribable topics in ConsumerGroupDescribe).
- ``custom``: an API whose rule is more than that (Metadata's hidden topics and auto-creation,
  a follower's Fetch, topics named by id, InitProducerId's IDEMPOTENT_WRITE,
  DescribeTopicPartitions' "all topics", ConsumerGroupHeartbeat's subscribed topics) wraps its
  handler itself.

A replica set's ACLs topic (``__acls``) is the peers' alone: every operation on it needs
CLUSTER_ACTION on the cluster, whatever the ACLs on topics say (:meth:`Access.allowed`).
- ``operations``: KIP-430's authorized operations, filled into the answer when the request
  asks for them (with or without an authorizer: without one, every operation).

A handler another change adds joins by adding its entry to :data:`RULES`; an API without one is
allowed to the principals with CLUSTER_ACTION on the cluster only (Kafka's inter-broker APIs),
so a new API is never open by accident. A rule that cannot read its request (a version whose
shape it does not know) refuses the request, logged.

The principal is the connection's (``User:<name>`` after SASL), else ``User:ANONYMOUS``; the
host is the client's address (an ACL for host ``*`` matches every one, including a Unix
socket's clients, which have no address).

Thread-safety: the guarded handlers may be called from any thread (each request reads one
snapshot of the ACLs).
"""

from __future__ import annotations

import dataclasses
import logging
import typing
import uuid
from dataclasses import dataclass, field
from concurrent.futures import Future
from typing import Any, Callable, Mapping

from ..errorcodes import ErrorCode
from ..net.protocol import Offload
from ..net.purgatory import mapped
from .acls import (ACLS_TOPIC, ANONYMOUS, CLUSTER_NAME, AclOperation, AclView, Authorizer, ResourceType,
                   all_operations)
from .wire import KafkaRequest, fetch_replica_id, response_class
from .writer import field_shape

__all__ = ["RULES", "Rule", "Need", "Items", "Access", "guard", "error_response", "AUTHORIZATION_ERRORS",
           "topic_describer"]

logger = logging.getLogger("logstore.kafka.authorizer")

Op = AclOperation
RT = ResourceType

#: the error of a denied resource, by its type (Kafka's ``AclEntry.authorizationError``)
AUTHORIZATION_ERRORS: dict[ResourceType, int] = {
    RT.TOPIC: ErrorCode.topic_authorization_failed, RT.GROUP: ErrorCode.group_authorization_failed,
    RT.CLUSTER: ErrorCode.cluster_authorization_failed,
    RT.TRANSACTIONAL_ID: ErrorCode.transactional_id_authorization_failed,
    RT.DELEGATION_TOKEN: ErrorCode.delegation_token_authorization_failed,
}
#: DescribeConfigs' (and AlterConfigs') resource types -> the ACL resource they are checked on
_CONFIG_RESOURCES = {2: RT.TOPIC, 4: RT.CLUSTER, 8: RT.CLUSTER, 16: RT.CLUSTER, 32: RT.GROUP}


class Access:
    """What one request's principal may do: the questions of one request, over one snapshot of
    the ACLs (``view`` None: no authorizer, everything allowed). Answers are remembered for the
    request. Not thread-safe: one request's, on the thread that answers it."""

    __slots__ = ("view", "principal", "host", "_answers")

    def __init__(self, view: AclView | None, principal: str, host: str) -> None:
        self.view = view
        self.principal = principal
        self.host = host
        self._answers: dict[tuple[int, int, str], bool] = {}

    @classmethod
    def of(cls, authorizer: Authorizer | None, request: KafkaRequest) -> "Access":
        """The access of ``request``'s principal and host now."""
        host = request.client_host[1:] if request.client_host.startswith("/") else request.client_host
        return cls(None if authorizer is None else authorizer.snapshot(), request.principal or ANONYMOUS, host)

    def allowed(self, operation: AclOperation, resource_type: ResourceType, name: str,
                log_denied: bool = True) -> bool:
        """Whether the principal may do ``operation`` on the resource (a denial logged unless
        ``log_denied`` is false: a filter, as Kafka's ``logIfDenied``)."""
        if self.view is None:
            return True
        if resource_type == RT.TOPIC and name == ACLS_TOPIC:
            # The ACLs' own topic: only the replica peers may touch it (Fetch, ListOffsets,
            # Metadata, DeleteRecords, ...), whatever READ or DESCRIBE on Topic:* says.
            operation, resource_type, name = Op.CLUSTER_ACTION, RT.CLUSTER, CLUSTER_NAME
        key = (operation, resource_type, name)
        answer = self._answers.get(key)
        if answer is None:
            answer = self._answers[key] = self.view.authorize(self.principal, self.host, operation, resource_type,
                                                              name)
            if not answer and log_denied:
                logger.info("Principal = %s is Denied operation = %s from host = %s on resource = %s:LITERAL:%s",
                            self.principal, operation.name, self.host, resource_type.name, name)
        return answer

    def allowed_any(self, operation: AclOperation, resource_type: ResourceType) -> bool:
        """Whether the principal may do ``operation`` on some resource of the type (Kafka's
        ``authorizeByResourceType``)."""
        return self.view is None or self.view.authorize_any(self.principal, self.host, operation, resource_type)

    def operations(self, resource_type: ResourceType, name: str) -> int:
        """KIP-430's bit field of the operations allowed on the resource."""
        if self.view is None:
            return all_operations(resource_type)
        if resource_type == RT.TOPIC and name == ACLS_TOPIC and not self.allowed(Op.CLUSTER_ACTION, RT.CLUSTER,
                                                                                 CLUSTER_NAME):
            return 0
        return self.view.authorized_operations(self.principal, self.host, resource_type, name)


def topic_describer(authorizer: Authorizer | None, request: KafkaRequest) -> Callable[[str], bool] | None:
    """Whether ``request``'s principal (from its host) may DESCRIBE a topic, asked of the
    authorizer's ACLs at each call (so a later change counts); None without an authorizer.
    What a KIP-848 member's regex subscription may resolve to. Thread-safe."""
    if authorizer is None:
        return None
    access = Access.of(authorizer, request)
    principal, host = access.principal, access.host

    def may_describe(name: str) -> bool:
        return Access(authorizer.snapshot(), principal, host).allowed(Op.DESCRIBE, RT.TOPIC, name, log_denied=False)
    return may_describe


@dataclass(frozen=True)
class Need:
    """The request as a whole needs ``operation`` on the resource ``resource(request)`` names
    ((type, name); None: this need does not apply to the request, e.g. a produce without a
    transactional id). Immutable."""

    operation: AclOperation
    resource: Callable[[KafkaRequest], tuple[ResourceType, str] | None]


@dataclass(frozen=True)
class Items:
    """A list of resources in a request, checked one by one (see the module docstring).
    Immutable.

    Args:
        field: the request body's field holding the list (None in it: nothing listed).
        resource: an item's resource, (type, name), or None: not checked here.
        operation: what each item needs.
        response: the response's field answering the items.
        keys: an item's identifying fields in its answer (``{"name": ...}``).
        partitions: for items answered per partition: (the item's field listing them, the
            field of a partition's index in it or None when the list holds the indexes, the
            answer's field listing them, the index field of a partition's answer).
        error_field: the error code's field in an answer (a partition's, with ``partitions``).
        or_cluster: an operation on the cluster that allows every item (CreateTopics' CREATE).
        all_or_nothing: one item denied refuses them all, the others with
            OPERATION_NOT_ATTEMPTED (AddPartitionsToTxn).
    """

    field: str
    resource: Callable[[Any], tuple[ResourceType, str] | None]
    operation: AclOperation
    response: str
    keys: Callable[[Any], dict[str, Any]]
    partitions: tuple[str, str | None, str, str] | None = None
    error_field: str = "error_code"
    or_cluster: AclOperation | None = None
    all_or_nothing: bool = False


Handler = Callable[[KafkaRequest], Any]


@dataclass(frozen=True)
class Rule:
    """What a request of one API needs (see the module docstring). ``custom(access, request,
    handler, context)`` replaces the generic checks; ``operations(access, request, answer)``
    fills KIP-430's fields of an answer; ``answer_filter(access, request, answer)`` drops what
    the principal may not see from an answer (ListGroups, ListTransactions). Immutable."""

    needs: tuple[Need, ...] = ()
    items: tuple[Items, ...] = ()
    custom: Callable[..., Any] | None = None
    operations: Callable[[Access, KafkaRequest, dict[str, Any]], None] | None = None
    answer_filter: Callable[[Access, KafkaRequest, dict[str, Any]], None] | None = None
    open: bool = False  # no authorization (ApiVersions, SASL: answered before a principal exists)


# ---------------------------------------------------------------------- answers from the schema
def _default(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """An answer entry of kio class ``cls``: ``values``, and for every other field its
    default, or for a field without one: an error code 0, an empty list, None for a nullable
    field, -1 for a number, "" for a string, an entity's own defaults."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in values:
            out[f.name] = values[f.name]
            continue
        array, entity = field_shape(f.type)
        kind = f.metadata.get("kafka_type")
        nullable = type(None) in typing.get_args(f.type)
        if array:  # (the writer takes sequences of mappings, never kio's instances)
            out[f.name] = []
        elif entity is not None:
            out[f.name] = None if nullable and f.default is None else _default(entity, {})
        elif f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            out[f.name] = f.default_factory()  # type: ignore[misc]
        elif kind == "error_code":
            out[f.name] = ErrorCode.none
        elif f.name == "throttle_time" or kind in ("timedelta_i32", "timedelta_i64"):
            out[f.name] = 0
        elif nullable:
            out[f.name] = None
        elif kind == "string":
            out[f.name] = ""
        elif kind in ("bytes", "records"):
            out[f.name] = b""
        elif kind == "bool":
            out[f.name] = False
        elif kind == "uuid":
            out[f.name] = uuid.UUID(int=0)
        else:
            out[f.name] = -1
    return out


def _entity(cls: type, path: tuple[str, ...]) -> type:
    """The entity class at ``path`` (array fields) under ``cls``."""
    for name in path:
        hint = next(f.type for f in dataclasses.fields(cls) if f.name == name)
        cls = field_shape(hint)[1]  # type: ignore[assignment]
    return cls


def error_response(request: KafkaRequest, error: int, message: str | None = None) -> dict[str, Any]:
    """The response to ``request`` refusing it all with ``error``: the version's fields with
    their defaults, the top-level ``error_code`` (and ``error_message``) set, lists empty."""
    values: dict[str, Any] = {"error_code": error}
    cls = response_class(request.api_key, request.api_version)
    if any(f.name == "error_message" for f in dataclasses.fields(cls)):
        values["error_message"] = message
    return _default(cls, values)


def _answer_item(request: KafkaRequest, items: Items, item: Any, error: int) -> dict[str, Any]:
    cls = _entity(response_class(request.api_key, request.api_version), (items.response,))
    if items.partitions is None:
        return _default(cls, {**items.keys(item), items.error_field: error})
    listed, index, answers, answer_index = items.partitions
    part_cls = _entity(cls, (answers,))
    parts = getattr(item, listed) or ()
    return _default(cls, {**items.keys(item), answers: [
        _default(part_cls, {answer_index: p if index is None else getattr(p, index), items.error_field: error})
        for p in parts]})


def _refuse_all(request: KafkaRequest, rule: Rule, error: int, message: str) -> dict[str, Any] | None:
    """The whole request refused with ``error``: each listed item too (an acks=0 produce gets
    no answer at all)."""
    if request.api_key == 0 and request.body.acks == 0:
        return None
    answer = error_response(request, error, message)
    for items in rule.items:
        listed = getattr(request.body, items.field, None) or ()
        answer[items.response] = [_answer_item(request, items, item, error) for item in listed]
    return answer


# ---------------------------------------------------------------------- the guard
def _merge(answer: Any, extra: dict[str, list[dict[str, Any]]], post: Callable[[dict[str, Any]], None]) -> Any:
    """Add the denied items' answers to a handler's answer (a mapping, a Future or an Offload of
    one, or None: acks=0) and run ``post`` on it."""
    def finish(fields: Any) -> Any:
        if fields is None:
            return None
        for name, entries in extra.items():
            if entries:
                fields[name] = list(fields[name]) + entries
        post(fields)
        return fields

    if isinstance(answer, Future):
        return mapped(answer, finish)
    if answer.__class__ is Offload:  # (on the network loop) a worker answers: merged there
        call = answer.call
        return Offload(lambda: _merge(call(), extra, post))
    return finish(answer)


class _Guarded:
    """One API's handler behind its rule."""

    def __init__(self, api_key: int, handler: Handler, rule: Rule | None, authorizer: Authorizer | None,
                 context: "GuardContext") -> None:
        self.api_key = api_key
        self.handler = handler
        self.rule = rule if rule is not None else Rule(needs=(Need(Op.CLUSTER_ACTION, _cluster),))
        self.authorizer = authorizer
        self.context = context

    def __call__(self, request: KafkaRequest) -> Any:
        rule = self.rule
        if rule.open:
            return self.handler(request)
        access = Access.of(self.authorizer, request)
        handler = _Traced(self.handler)
        try:
            if rule.custom is not None:
                return rule.custom(access, request, handler, self.context)
            return _apply(rule, access, request, handler)
        except (AttributeError, TypeError, StopIteration) as exc:  # a request shape the rule does not know
            if handler.raised:
                raise
            logger.error("%s v%d: refused: its authorization rule cannot read it: %s", request.name,
                         request.api_version, exc)
            return error_response(request, ErrorCode.cluster_authorization_failed,
                                  f"{request.name} v{request.api_version} cannot be authorized")


def _apply(rule: Rule, access: Access, request: KafkaRequest, handler: Handler) -> Any:
    """``rule``'s needs and items checked, the handler called with what is allowed, the denied
    items' answers merged into its answer."""
    for need in rule.needs:
        resource = need.resource(request)
        if resource is not None and not access.allowed(need.operation, *resource):
            return _refuse_all(request, rule, AUTHORIZATION_ERRORS[resource[0]],
                               f"not authorized to {need.operation.name} {resource[0].name} {resource[1]}")
    body = request.body
    extra: dict[str, list[dict[str, Any]]] = {}
    changes: dict[str, Any] = {}
    for items in rule.items:
        listed = getattr(body, items.field)
        if listed is None:
            continue
        cluster_ok = items.or_cluster is not None and access.allowed(items.or_cluster, RT.CLUSTER, CLUSTER_NAME)
        kept, denied = [], []
        for item in listed:
            resource = items.resource(item)
            if resource is None or cluster_ok or access.allowed(items.operation, *resource):
                kept.append(item)
            else:
                denied.append((item, AUTHORIZATION_ERRORS[resource[0]]))
        if not denied:
            continue
        if items.all_or_nothing:
            answers = [_answer_item(request, items, item, error) for item, error in denied]
            answers += [_answer_item(request, items, item, ErrorCode.operation_not_attempted) for item in kept]
            answer = error_response(request, ErrorCode.none)
            answer[items.response] = answers
            return answer
        changes[items.field] = tuple(kept)
        extra[items.response] = [_answer_item(request, items, item, error) for item, error in denied]
    if changes:
        request = _with_body(request, dataclasses.replace(body, **changes))
    answer = handler(request)
    return _merge(answer, extra, lambda fields: _post(rule, access, request, fields))


def _post(rule: Rule, access: Access, request: KafkaRequest, fields: dict[str, Any]) -> None:
    if rule.answer_filter is not None:
        rule.answer_filter(access, request, fields)
    if rule.operations is not None:
        rule.operations(access, request, fields)


class _Traced:
    """A handler that remembers whether it raised: its own errors pass through the guard."""

    __slots__ = ("handler", "raised")

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.raised = False

    def __call__(self, request: KafkaRequest) -> Any:
        try:
            return self.handler(request)
        except BaseException:
            self.raised = True
            raise


def _with_body(request: KafkaRequest, body: Any) -> KafkaRequest:
    copy = KafkaRequest(request.api_key, request.api_version, request.correlation_id, request.client_id, body)
    copy.client_host = request.client_host
    copy.principal = request.principal
    copy.on_loop = request.on_loop
    return copy


@dataclass
class GuardContext:
    """What the custom rules ask the server: whether a topic exists and whether it creates the
    missing ones a client asks Metadata for (Metadata's auto-creation check), and a topic id's
    name. The server's hooks; thread-safe as they are."""

    topic_exists: Callable[[str], bool] = field(default=lambda name: True)
    auto_create_topics: Callable[[], bool] = field(default=lambda: True)
    #: a topic id's topic name (None: unknown); the server that serves topic ids gives it
    topic_name: Callable[[uuid.UUID], str | None] = field(default=lambda topic_id: None)
    #: the topics an all-topics request lists, sorted (DescribeTopicPartitions' filter)
    topic_names: Callable[[], list[str]] = field(default=lambda: [])


def guard(handlers: Mapping[int, Handler], authorizer: Authorizer | None, context: GuardContext,
          rules: Mapping[int, Rule] | None = None) -> dict[int, Handler]:
    """``handlers`` behind their :data:`RULES` (or ``rules``). Without an authorizer, only the
    rules that fill KIP-430's authorized operations wrap their handlers (every operation is
    allowed), the others are left as they are. The guarded handlers are thread-safe as the
    handlers are; nothing here is durable."""
    table = RULES if rules is None else rules
    out: dict[int, Handler] = {}
    for key, handler in handlers.items():
        rule = table.get(key)
        if authorizer is None:
            if rule is not None and rule.operations is not None:
                out[key] = _OperationsOnly(handler, rule)
            else:
                out[key] = handler
        else:
            out[key] = _Guarded(key, handler, rule, authorizer, context)
    return out


class _OperationsOnly:
    """A handler whose answers get KIP-430's authorized operations (no authorizer: all)."""

    def __init__(self, handler: Handler, rule: Rule) -> None:
        self.handler = handler
        self.rule = rule

    def __call__(self, request: KafkaRequest) -> Any:
        access = Access(None, request.principal or ANONYMOUS, "")
        operations = self.rule.operations
        assert operations is not None
        return _merge(self.handler(request), {}, lambda fields: operations(access, request, fields))


# ---------------------------------------------------------------------- the rules' parts
def _cluster(request: KafkaRequest) -> tuple[ResourceType, str]:
    return RT.CLUSTER, CLUSTER_NAME


def _group(request: KafkaRequest) -> tuple[ResourceType, str]:
    return RT.GROUP, request.body.group_id


def _txn_id(request: KafkaRequest) -> tuple[ResourceType, str] | None:
    tid = request.body.transactional_id
    return None if tid is None else (RT.TRANSACTIONAL_ID, tid)


def _topic(name_field: str) -> Callable[[Any], tuple[ResourceType, str]]:
    return lambda item: (RT.TOPIC, getattr(item, name_field))


def _named(name_field: str, answer_field: str = "name") -> Callable[[Any], dict[str, Any]]:
    return lambda item: {answer_field: getattr(item, name_field)}


def _produce_txn(request: KafkaRequest) -> tuple[ResourceType, str] | None:
    tid = request.body.transactional_id
    return None if tid is None else (RT.TRANSACTIONAL_ID, tid)


def _find_coordinator(access: Access, request: KafkaRequest, handler: Handler, context: GuardContext) -> Any:
    """FindCoordinator: DESCRIBE on the group (key type 0) or the transactional id (1); a
    batched request (v4) answers each denied key with its error."""
    body = request.body
    key_type = getattr(body, "key_type", 0)  # v0 has none: its key is a group
    kind = RT.GROUP if key_type == 0 else RT.TRANSACTIONAL_ID if key_type == 1 else None
    if kind is None:
        return handler(request)
    keys = getattr(body, "coordinator_keys", None)
    if keys is None:  # v0-v3: one key
        if not access.allowed(Op.DESCRIBE, kind, body.key):
            answer = error_response(request, AUTHORIZATION_ERRORS[kind])
            answer.update(node_id=-1, host="", port=-1)
            return answer
        return handler(request)
    rule = Rule(items=(Items("coordinator_keys", lambda key: (kind, key), Op.DESCRIBE, "coordinators",
                             lambda key: {"key": key, "node_id": -1, "host": "", "port": -1}),))
    return _apply(rule, access, request, handler)


def _init_producer_id(access: Access, request: KafkaRequest, handler: Handler, context: GuardContext) -> Any:
    """InitProducerId: WRITE on the transactional id; without one, IDEMPOTENT_WRITE on the
    cluster or WRITE on some topic (KIP-679)."""
    tid = request.body.transactional_id
    if tid is not None:
        if not access.allowed(Op.WRITE, RT.TRANSACTIONAL_ID, tid):
            return error_response(request, ErrorCode.transactional_id_authorization_failed)
    elif not access.allowed(Op.IDEMPOTENT_WRITE, RT.CLUSTER, CLUSTER_NAME) and \
            not access.allowed_any(Op.WRITE, RT.TOPIC):
        return error_response(request, ErrorCode.cluster_authorization_failed)
    return handler(request)


def _metadata(access: Access, request: KafkaRequest, handler: Handler, context: GuardContext) -> Any:
    """Metadata: DESCRIBE on each topic. Listing all topics hides the others; a topic asked
    for and denied is answered TOPIC_AUTHORIZATION_FAILED, exists or not; one that does not
    exist is auto-created only with CREATE on the cluster or on the topic."""
    body = request.body
    requested = None if body.topics is None else list(body.topics)
    if request.api_version == 0 and not requested:
        requested = None
    cls = _entity(response_class(request.api_key, request.api_version), ("topics",))
    denied: list[dict[str, Any]] = []
    if requested is not None:
        kept = []
        creating = getattr(body, "allow_auto_topic_creation", True) and context.auto_create_topics()
        may_create = None
        for topic in requested:
            name = topic.name
            if name is None:  # (by topic id, v10+: the handler names it; checked in the answer)
                kept.append(topic)
            elif not access.allowed(Op.DESCRIBE, RT.TOPIC, name):
                denied.append(_default(cls, {"name": name, "error_code": ErrorCode.topic_authorization_failed}))
            elif creating and not context.topic_exists(name):
                if may_create is None:
                    may_create = access.allowed(Op.CREATE, RT.CLUSTER, CLUSTER_NAME)
                if may_create or access.allowed(Op.CREATE, RT.TOPIC, name):
                    kept.append(topic)
                else:
                    denied.append(_default(cls, {"name": name, "error_code": ErrorCode.topic_authorization_failed}))
            else:
                kept.append(topic)
        if len(kept) != len(requested):
            if not kept and request.api_version == 0:
                return _metadata_answer(access, request, handler, denied, hide_all=True)
            request = _with_body(request, dataclasses.replace(body, topics=tuple(kept)))
    return _metadata_answer(access, request, handler, denied, hide_all=False)


def _metadata_answer(access: Access, request: KafkaRequest, handler: Handler, denied: list[dict[str, Any]],
                     hide_all: bool) -> Any:
    def post(fields: dict[str, Any]) -> None:
        topics = [] if hide_all else [t for t in fields["topics"]
                                      if t.get("name") is None or access.allowed(Op.DESCRIBE, RT.TOPIC, t["name"])
                                      or t["error_code"] != ErrorCode.none]
        fields["topics"] = topics + denied
        _metadata_operations(access, request, fields)
    return _merge(handler(request), {}, post)


def _metadata_operations(access: Access, request: KafkaRequest, fields: dict[str, Any]) -> None:
    body = request.body
    if getattr(body, "include_topic_authorized_operations", False):
        for topic in fields["topics"]:
            if topic["error_code"] == ErrorCode.none and topic.get("name"):
                topic["topic_authorized_operations"] = access.operations(RT.TOPIC, topic["name"])
    if getattr(body, "include_cluster_authorized_operations", False):
        fields["cluster_authorized_operations"] = (access.operations(RT.CLUSTER, CLUSTER_NAME)
                                                   if access.allowed(Op.DESCRIBE, RT.CLUSTER, CLUSTER_NAME) else 0)


def _group_operations(access: Access, request: KafkaRequest, fields: dict[str, Any]) -> None:
    if getattr(request.body, "include_authorized_operations", False):
        for group in fields["groups"]:
            if group["error_code"] == ErrorCode.none:
                group["authorized_operations"] = access.operations(RT.GROUP, group["group_id"])


def _cluster_operations(access: Access, request: KafkaRequest, fields: dict[str, Any]) -> None:
    """DescribeCluster's cluster_authorized_operations (0 without DESCRIBE on the cluster)."""
    if getattr(request.body, "include_cluster_authorized_operations", False):
        fields["cluster_authorized_operations"] = (access.operations(RT.CLUSTER, CLUSTER_NAME)
                                                   if access.allowed(Op.DESCRIBE, RT.CLUSTER, CLUSTER_NAME) else 0)


def _topic_operations(access: Access, request: KafkaRequest, fields: dict[str, Any]) -> None:
    """DescribeTopicPartitions' topic_authorized_operations (always given)."""
    for topic in fields["topics"]:
        if topic["error_code"] == ErrorCode.none and topic.get("name"):
            topic["topic_authorized_operations"] = access.operations(RT.TOPIC, topic["name"])


def _created_topic_configs(access: Access, request: KafkaRequest, fields: dict[str, Any]) -> None:
    """CreateTopics v5+: a created topic's configs, partition count and replication factor only
    with DESCRIBE_CONFIGS on it, else ``topic_config_error_code`` TOPIC_AUTHORIZATION_FAILED (as
    Kafka's ``includeConfigsAndMetadata``)."""
    for topic in fields["topics"]:
        if topic["error_code"] == ErrorCode.none and not access.allowed(Op.DESCRIBE_CONFIGS, RT.TOPIC, topic["name"]):
            topic.update(topic_config_error_code=ErrorCode.topic_authorization_failed, num_partitions=-1,
                         replication_factor=-1, configs=[])


def _list_groups(access: Access, request: KafkaRequest, fields: dict[str, Any]) -> None:
    """ListGroups: all groups with DESCRIBE on the cluster, else those the principal may describe."""
    if not access.allowed(Op.DESCRIBE, RT.CLUSTER, CLUSTER_NAME):
        fields["groups"] = [g for g in fields["groups"] if access.allowed(Op.DESCRIBE, RT.GROUP, g["group_id"])]


def _list_transactions(access: Access, request: KafkaRequest, fields: dict[str, Any]) -> None:
    """ListTransactions: the transactional ids the principal may describe."""
    fields["transaction_states"] = [t for t in fields["transaction_states"]
                                    if access.allowed(Op.DESCRIBE, RT.TRANSACTIONAL_ID, t["transactional_id"])]


def _describe_transactions(access: Access, request: KafkaRequest, fields: dict[str, Any]) -> None:
    """DescribeTransactions: only the topics the principal may describe are listed."""
    for state in fields["transaction_states"]:
        topics = state.get("topics") or []
        state["topics"] = [t for t in topics if access.allowed(Op.DESCRIBE, RT.TOPIC, t["topic"])]


def _config_resource(item: Any) -> tuple[ResourceType, str] | None:
    kind = _CONFIG_RESOURCES.get(item.resource_type)
    if kind is None:
        return None  # (an unknown type: the handler answers it)
    return kind, CLUSTER_NAME if kind == RT.CLUSTER else item.resource_name


def _refuse_acl_changes(field_name: str) -> Callable[..., Any]:
    """CreateAcls and DeleteAcls: ALTER on the cluster, else each creation or filter refused."""
    def custom(access: Access, request: KafkaRequest, handler: Handler, context: GuardContext) -> Any:
        if access.allowed(Op.ALTER, RT.CLUSTER, CLUSTER_NAME):
            return handler(request)
        listed = getattr(request.body, "creations" if field_name == "results" else "filters")
        cls = _entity(response_class(request.api_key, request.api_version), (field_name,))
        answer = error_response(request, ErrorCode.cluster_authorization_failed)
        answer[field_name] = [_default(cls, {"error_code": ErrorCode.cluster_authorization_failed,
                                             "error_message": "not authorized to ALTER the cluster"})
                              for _ in listed]
        return answer
    return custom


_PARTITION_ENTRIES = ("partitions", "partition_index", "partitions", "partition_index")
_OPEN = Rule(open=True)
_CLUSTER_ACTION = Rule(needs=(Need(Op.CLUSTER_ACTION, _cluster),))
_READ_GROUP = Rule(needs=(Need(Op.READ, _group),))
_WRITE_TXN = Rule(needs=(Need(Op.WRITE, _txn_id),))


def _topic_by_name_or_id(context: GuardContext, name_field: str) -> Callable[[Any], tuple[ResourceType, str]]:
    """A listed topic's resource, by its name or (Fetch v13+, DeleteTopics v6) its topic id: an
    id the server cannot name is checked as the topic named by the id's text, which no ACL
    names (denied unless allow.everyone.if.no.acl.found)."""
    def resource(item: Any) -> tuple[ResourceType, str]:
        name = getattr(item, name_field, None)
        if name is None:
            topic_id = item.topic_id
            name = context.topic_name(topic_id) or str(topic_id)
        return RT.TOPIC, name
    return resource


def _fetch(access: Access, request: KafkaRequest, handler: Handler, context: GuardContext) -> Any:
    """Fetch: a follower's (replica id >= 0) needs CLUSTER_ACTION on the cluster (then it reads
    every partition; without, every partition is TOPIC_AUTHORIZATION_FAILED, as in Kafka); a
    consumer's READ on each topic."""
    items = Items("topics", _topic_by_name_or_id(context, "topic"), Op.READ, "responses",
                  lambda t: {"topic": getattr(t, "topic", None), "topic_id": getattr(t, "topic_id", None)},
                  partitions=("partitions", "partition", "partitions", "partition_index"))
    if fetch_replica_id(request) >= 0:
        if access.allowed(Op.CLUSTER_ACTION, RT.CLUSTER, CLUSTER_NAME):
            return handler(request)
        return _refuse_all(request, Rule(items=(items,)), ErrorCode.topic_authorization_failed,
                           "a follower's fetch needs CLUSTER_ACTION on the cluster")
    return _apply(Rule(items=(items,)), access, request, handler)


def _delete_topics(access: Access, request: KafkaRequest, handler: Handler, context: GuardContext) -> Any:
    """DeleteTopics: DELETE on each topic, named (v1-v5) or by name or id (v6)."""
    if hasattr(request.body, "topic_names"):
        items = Items("topic_names", lambda name: (RT.TOPIC, name), Op.DELETE, "responses",
                      lambda name: {"name": name})
    else:
        items = Items("topics", _topic_by_name_or_id(context, "name"), Op.DELETE, "responses",
                      lambda t: {"name": t.name, "topic_id": t.topic_id})
    return _apply(Rule(items=(items,)), access, request, handler)


def _add_partitions_to_txn(access: Access, request: KafkaRequest, handler: Handler, context: GuardContext) -> Any:
    """AddPartitionsToTxn: v4 is a broker's (CLUSTER_ACTION); v0-v3 need WRITE on the
    transactional id and on every topic (one denied: none added)."""
    if request.api_version >= 4:
        rule = _CLUSTER_ACTION
    else:
        rule = Rule(needs=(Need(Op.WRITE, lambda r: (RT.TRANSACTIONAL_ID, r.body.v3_and_below_transactional_id)),),
                    items=(Items("v3_and_below_topics", _topic("name"), Op.WRITE, "results_by_topic_v3_and_below",
                                 _named("name"), partitions=("partitions", None, "results_by_partition",
                                                             "partition_index"),
                                 error_field="partition_error_code", all_or_nothing=True),))
    return _apply(rule, access, request, handler)


def _describe_topic_partitions(access: Access, request: KafkaRequest, handler: Handler,
                               context: GuardContext) -> Any:
    """DescribeTopicPartitions (as Kafka's DescribeTopicPartitionsRequestHandler): "all topics"
    is decided from the request as sent (no topic named) and lists only the topics the
    principal may describe, pages and cursor included (the handler is asked for them by name);
    a named topic denied DESCRIBE is answered TOPIC_AUTHORIZATION_FAILED with the zero topic
    id, exists or not, and when every named topic is denied the handler is not asked at all
    (an empty list would be "all")."""
    body = request.body
    cls = _entity(response_class(request.api_key, request.api_version), ("topics",))
    if not body.topics:
        allowed = [name for name in context.topic_names() if access.allowed(Op.DESCRIBE, RT.TOPIC, name)]
        if not allowed:
            answer = error_response(request, ErrorCode.none)
            answer.update(topics=[], next_cursor=None)
            return answer
        topic_cls = _entity(type(body), ("topics",))
        request = _with_body(request, dataclasses.replace(body, topics=tuple(topic_cls(name=n) for n in allowed)))
        return _merge(handler(request), {}, lambda fields: _topic_operations(access, request, fields))
    kept = [t for t in body.topics if access.allowed(Op.DESCRIBE, RT.TOPIC, t.name)]
    denied = [_default(cls, {"name": t.name, "error_code": ErrorCode.topic_authorization_failed})
              for t in body.topics if not access.allowed(Op.DESCRIBE, RT.TOPIC, t.name)]
    if not kept:
        answer = error_response(request, ErrorCode.none)
        answer.update(topics=denied, next_cursor=None)
        return answer
    if denied:
        request = _with_body(request, dataclasses.replace(body, topics=tuple(kept)))
    return _merge(handler(request), {"topics": denied}, lambda fields: _topic_operations(access, request, fields))


def _consumer_group_heartbeat(access: Access, request: KafkaRequest, handler: Handler,
                              context: GuardContext) -> Any:
    """ConsumerGroupHeartbeat (as Kafka's KafkaApis): READ on the group, and DESCRIBE on every
    topic the subscription names, else the heartbeat is TOPIC_AUTHORIZATION_FAILED. A regex
    resolves only to the topics the member may describe (the handler gives the coordinator
    :func:`topic_describer`)."""
    body = request.body
    if not access.allowed(Op.READ, RT.GROUP, body.group_id):
        return error_response(request, ErrorCode.group_authorization_failed,
                              f"not authorized to READ GROUP {body.group_id}")
    denied = sorted({n for n in body.subscribed_topic_names or () if not access.allowed(Op.DESCRIBE, RT.TOPIC, n)})
    if denied:
        return error_response(request, ErrorCode.topic_authorization_failed,
                              f"not authorized to DESCRIBE the subscribed topic(s) {', '.join(denied)}")
    return handler(request)


def _consumer_group_described_topics(access: Access, request: KafkaRequest, fields: dict[str, Any]) -> None:
    """ConsumerGroupDescribe: a group whose members' subscriptions or assignments name a topic
    the principal may not describe is answered TOPIC_AUTHORIZATION_FAILED, without its members
    (as Kafka's KafkaApis)."""
    for group in fields["groups"]:
        if group["error_code"] != ErrorCode.none:
            continue
        named = set()
        for member in group["members"]:
            named.update(member.get("subscribed_topic_names") or ())
            for kind in ("assignment", "target_assignment"):
                named.update(t["topic_name"] for t in (member.get(kind) or {}).get("topic_partitions", ()))
        if any(not access.allowed(Op.DESCRIBE, RT.TOPIC, name) for name in sorted(named)):
            group.update(error_code=ErrorCode.topic_authorization_failed, members=[],
                         error_message="The group has described topic(s) that the client is not authorized "
                                       "to describe.")


def _offset_for_leader_epoch(access: Access, request: KafkaRequest, handler: Handler, context: GuardContext) -> Any:
    """OffsetForLeaderEpoch: a consumer's (no replica id) needs DESCRIBE on each topic, a
    follower's CLUSTER_ACTION (as Kafka's)."""
    if getattr(request.body, "replica_id", -1) >= 0:
        return _apply(_CLUSTER_ACTION, access, request, handler)
    rule = Rule(items=(Items("topics", _topic("topic"), Op.DESCRIBE, "topics", _named("topic", "topic"),
                             partitions=("partitions", "partition", "partitions", "partition")),))
    return _apply(rule, access, request, handler)


def _offset_fetch_filter(access: Access, request: KafkaRequest, fields: dict[str, Any]) -> None:
    """OffsetFetch of all of a group's offsets: only the topics the principal may describe."""
    if getattr(request.body, "topics", ()) is None:
        fields["topics"] = [t for t in fields["topics"] if access.allowed(Op.DESCRIBE, RT.TOPIC, t["name"])]


#: OffsetFetch v1-v7: one group
_OFFSET_FETCH_ONE = Rule(needs=(Need(Op.DESCRIBE, _group),),
                         items=(Items("topics", _topic("name"), Op.DESCRIBE, "topics", _named("name"),
                                      partitions=("partition_indexes", None, "partitions", "partition_index")),),
                         answer_filter=_offset_fetch_filter)


def _offset_fetch(access: Access, request: KafkaRequest, handler: Handler, context: GuardContext) -> Any:
    """OffsetFetch: DESCRIBE on the group and on each topic asked for (a denied topic's
    partitions answered TOPIC_AUTHORIZATION_FAILED; all of a group's offsets: only the topics
    the principal may describe). From v8 a request names several groups (KIP-709): a denied
    group is answered GROUP_AUTHORIZATION_FAILED and the others are served."""
    if request.api_version < 8:
        return _apply(_OFFSET_FETCH_ONE, access, request, handler)
    body = request.body
    group_cls = _entity(response_class(request.api_key, request.api_version), ("groups",))
    topic_cls = _entity(group_cls, ("topics",))
    partition_cls = _entity(topic_cls, ("partitions",))
    refused_groups: list[dict[str, Any]] = []
    refused_topics: dict[str, list[dict[str, Any]]] = {}
    all_topics: set[str] = set()
    kept_groups = []
    for group in body.groups:
        if not access.allowed(Op.DESCRIBE, RT.GROUP, group.group_id):
            refused_groups.append(_default(group_cls, {"group_id": group.group_id,
                                                       "error_code": ErrorCode.group_authorization_failed}))
            continue
        if group.topics is None:
            all_topics.add(group.group_id)
            kept_groups.append(group)
            continue
        kept = [t for t in group.topics if access.allowed(Op.DESCRIBE, RT.TOPIC, t.name)]
        if len(kept) != len(group.topics):
            refused_topics[group.group_id] = [
                _default(topic_cls, {"name": t.name, "partitions": [
                    _default(partition_cls, {"partition_index": p, "error_code": ErrorCode.topic_authorization_failed})
                    for p in t.partition_indexes]})
                for t in group.topics if not access.allowed(Op.DESCRIBE, RT.TOPIC, t.name)]
            group = dataclasses.replace(group, topics=tuple(kept))
        kept_groups.append(group)

    def post(fields: dict[str, Any]) -> None:
        for answer in fields["groups"]:
            group_id = answer["group_id"]
            if group_id in all_topics:
                answer["topics"] = [t for t in answer["topics"] if access.allowed(Op.DESCRIBE, RT.TOPIC, t["name"])]
            elif group_id in refused_topics:
                answer["topics"] = list(answer["topics"]) + refused_topics[group_id]
        fields["groups"] = list(fields["groups"]) + refused_groups

    if len(kept_groups) != len(body.groups) or refused_topics:
        request = _with_body(request, dataclasses.replace(body, groups=tuple(kept_groups)))
    return _merge(handler(request), {}, post)


#: API key -> what its requests need (see the module docstring). Kafka's table: the "Operations
#: and Resources on Protocols" of its security documentation.
RULES: dict[int, Rule] = {
    0: Rule(needs=(Need(Op.WRITE, _produce_txn),),  # Produce
            items=(Items("topic_data", _topic("name"), Op.WRITE, "responses", _named("name"),
                         partitions=("partition_data", "index", "partition_responses", "index")),)),
    1: Rule(custom=_fetch),
    2: Rule(items=(Items("topics", _topic("name"), Op.DESCRIBE, "topics", _named("name"),  # ListOffsets
                         partitions=_PARTITION_ENTRIES),)),
    3: Rule(custom=_metadata, operations=_metadata_operations),
    8: Rule(needs=(Need(Op.READ, _group),),  # OffsetCommit
            items=(Items("topics", _topic("name"), Op.READ, "topics", _named("name"),
                         partitions=_PARTITION_ENTRIES),)),
    9: Rule(custom=_offset_fetch),
    10: Rule(custom=_find_coordinator),
    11: _READ_GROUP, 12: _READ_GROUP, 13: _READ_GROUP, 14: _READ_GROUP,  # Join, Heartbeat, Leave, Sync
    15: Rule(items=(Items("groups", lambda g: (RT.GROUP, g), Op.DESCRIBE, "groups",  # DescribeGroups
                          lambda g: {"group_id": g}),), operations=_group_operations),
    16: Rule(answer_filter=_list_groups),  # ListGroups
    17: _OPEN, 18: _OPEN, 36: _OPEN,  # SaslHandshake, ApiVersions, SaslAuthenticate
    19: Rule(items=(Items("topics", _topic("name"), Op.CREATE, "topics", _named("name"),  # CreateTopics
                          or_cluster=Op.CREATE),), answer_filter=_created_topic_configs),
    20: Rule(custom=_delete_topics),
    22: Rule(custom=_init_producer_id),
    23: Rule(custom=_offset_for_leader_epoch),
    24: Rule(custom=_add_partitions_to_txn),
    25: Rule(needs=(Need(Op.WRITE, _txn_id), Need(Op.READ, _group))),  # AddOffsetsToTxn
    26: _WRITE_TXN,  # EndTxn
    27: _CLUSTER_ACTION,  # WriteTxnMarkers
    28: Rule(needs=(Need(Op.WRITE, _txn_id), Need(Op.READ, _group)),  # TxnOffsetCommit
             items=(Items("topics", _topic("name"), Op.READ, "topics", _named("name"),
                          partitions=("partitions", "partition_index", "partitions", "partition_index")),)),
    29: Rule(needs=(Need(Op.DESCRIBE, _cluster),)),  # DescribeAcls
    30: Rule(custom=_refuse_acl_changes("results")),  # CreateAcls
    31: Rule(custom=_refuse_acl_changes("filter_results")),  # DeleteAcls
    32: Rule(items=(Items("resources", _config_resource, Op.DESCRIBE_CONFIGS, "results",  # DescribeConfigs
                          lambda r: {"resource_type": r.resource_type, "resource_name": r.resource_name}),)),
    52: _CLUSTER_ACTION, 53: _CLUSTER_ACTION,  # Vote, BeginQuorumEpoch
    55: Rule(needs=(Need(Op.DESCRIBE, _cluster),)),  # DescribeQuorum
    61: Rule(items=(Items("topics", _topic("name"), Op.READ, "topics", _named("name"),  # DescribeProducers
                          partitions=("partition_indexes", None, "partitions", "partition_index")),)),
    65: Rule(items=(Items("transactional_ids", lambda t: (RT.TRANSACTIONAL_ID, t), Op.DESCRIBE,
                          "transaction_states", lambda t: {"transactional_id": t}),),  # DescribeTransactions
             answer_filter=_describe_transactions),
    66: Rule(answer_filter=_list_transactions),  # ListTransactions
    # The admin APIs and KIP-848's, as Kafka authorizes them (for the handlers that serve them)
    21: Rule(items=(Items("topics", _topic("name"), Op.DELETE, "topics", _named("name"),  # DeleteRecords
                          partitions=_PARTITION_ENTRIES),)),
    33: Rule(items=(Items("resources", _config_resource, Op.ALTER_CONFIGS, "responses",  # AlterConfigs
                          lambda r: {"resource_type": r.resource_type, "resource_name": r.resource_name}),)),
    35: Rule(needs=(Need(Op.DESCRIBE, _cluster),)),  # DescribeLogDirs
    37: Rule(items=(Items("topics", _topic("name"), Op.ALTER, "results", _named("name")),)),  # CreatePartitions
    42: Rule(items=(Items("groups_names", lambda g: (RT.GROUP, g), Op.DELETE, "results",  # DeleteGroups
                          lambda g: {"group_id": g}),)),
    43: Rule(needs=(Need(Op.ALTER, _cluster),)),  # ElectLeaders
    44: Rule(items=(Items("resources", _config_resource, Op.ALTER_CONFIGS, "responses",  # IncrementalAlterConfigs
                          lambda r: {"resource_type": r.resource_type, "resource_name": r.resource_name}),)),
    47: Rule(needs=(Need(Op.DELETE, _group),),  # OffsetDelete
             items=(Items("topics", _topic("name"), Op.READ, "topics", _named("name"),
                          partitions=_PARTITION_ENTRIES),)),
    50: Rule(needs=(Need(Op.DESCRIBE, _cluster),)),  # DescribeUserScramCredentials
    51: Rule(needs=(Need(Op.ALTER, _cluster),)),  # AlterUserScramCredentials
    60: Rule(operations=_cluster_operations),  # DescribeCluster
    68: Rule(custom=_consumer_group_heartbeat),  # ConsumerGroupHeartbeat
    69: Rule(items=(Items("group_ids", lambda g: (RT.GROUP, g), Op.DESCRIBE, "groups",  # ConsumerGroupDescribe
                          lambda g: {"group_id": g}),), answer_filter=_consumer_group_described_topics,
             operations=_group_operations),
    75: Rule(custom=_describe_topic_partitions, operations=_topic_operations),  # DescribeTopicPartitions
}
