"""Kafka's ACLs: the model (resource types, pattern types, operations, permissions, bindings and
their filters), the matcher, and :class:`Authorizer`, the policy around them.

An ACL binding says: ``principal`` from ``host`` is ALLOWed (or DENYed) ``operation`` on the
resources of ``resource_type`` whose name matches ``name`` by ``pattern_type`` -- LITERAL (the
name itself; ``*`` is every name) or PREFIXED (every name that starts with it). The numbers are
Kafka's (``org.apache.kafka.common.acl.AclOperation``, ``resource.ResourceType``,
``resource.PatternType``, ``acl.AclPermissionType``), the ones CreateAcls, DescribeAcls and
DeleteAcls carry.

The rules, as Kafka's StandardAuthorizer applies them to one action (a principal, its host, an
operation, one resource named literally):

- A super user (``super.users``) may do everything.
- The ACLs of the resource are those whose pattern matches its name (the literal name, the
  literal ``*``, every prefix of the name), whoever they are for. If there are none, the
  action is allowed iff ``allow.everyone.if.no.acl.found`` (false by default).
- Of those, the ones that apply name the principal or ``User:*``, the host or ``*``, and the
  operation or ALL; an ALLOW of READ, WRITE, DELETE or ALTER also applies to DESCRIBE, and one
  of ALTER_CONFIGS to DESCRIBE_CONFIGS (a DENY applies to its own operation only).
- The action is allowed iff an ALLOW applies and no DENY does: deny wins. A resource with ACLs
  none of which applies is denied.

Thread-safety: the enums, :class:`AclBinding`, :class:`AclBindingFilter` and :class:`AclSet`
are immutable; :class:`Authorizer` is thread-safe (it reads one :class:`AclSet` snapshot per
question; changes go through its store). Nothing here is durable: :mod:`.aclfile` stores the
bindings.
"""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, Protocol, TypeVar

from ..errors import LogstoreError

__all__ = ["ResourceType", "PatternType", "AclOperation", "AclPermissionType", "AclBinding", "AclBindingFilter",
           "AclError", "AclSet", "AclSource", "MemoryAcls", "Authorizer", "CLUSTER_NAME", "WILDCARD", "WILDCARD_PRINCIPAL",
           "ANONYMOUS", "SUPPORTED_OPERATIONS", "AclView", "all_operations", "parse_principal", "ACLS_TOPIC"]

#: The one name of the CLUSTER resource (Kafka's ``kafka-cluster``).
CLUSTER_NAME = "kafka-cluster"
#: A LITERAL resource name, or a host, that matches every one.
WILDCARD = "*"
#: The principal an ACL names to apply to everyone.
WILDCARD_PRINCIPAL = "User:*"
#: The principal of a connection that did not authenticate (Kafka's ``User:ANONYMOUS``).
ANONYMOUS = "User:ANONYMOUS"
#: The internal topic a replica set keeps its ACLs in (one partition): only the replica peers
#: (CLUSTER_ACTION on the cluster) may read it, whatever the ACLs on topics say.
ACLS_TOPIC = "__acls"


class ResourceType(enum.IntEnum):
    """Kafka's resource types (``ANY`` only in filters; ``UNKNOWN`` never valid)."""

    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    """How a binding's name matches resource names (``ANY`` and ``MATCH`` only in filters)."""

    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class AclOperation(enum.IntEnum):
    """Kafka's operations (``ANY`` only in filters; ``ALL`` in a binding is every operation)."""

    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class AclPermissionType(enum.IntEnum):
    """ALLOW or DENY (``ANY`` only in filters)."""

    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


_Op = AclOperation
#: The operations each resource type has (Kafka's ``AclEntry.supportedOperations``): what
#: KIP-430's authorized operations are computed over.
SUPPORTED_OPERATIONS: dict[ResourceType, frozenset[AclOperation]] = {
    ResourceType.TOPIC: frozenset({_Op.READ, _Op.WRITE, _Op.CREATE, _Op.DESCRIBE, _Op.DELETE, _Op.ALTER,
                                   _Op.DESCRIBE_CONFIGS, _Op.ALTER_CONFIGS}),
    ResourceType.GROUP: frozenset({_Op.READ, _Op.DESCRIBE, _Op.DELETE, _Op.DESCRIBE_CONFIGS, _Op.ALTER_CONFIGS}),
    ResourceType.CLUSTER: frozenset({_Op.CREATE, _Op.CLUSTER_ACTION, _Op.DESCRIBE_CONFIGS, _Op.ALTER_CONFIGS,
                                     _Op.IDEMPOTENT_WRITE, _Op.ALTER, _Op.DESCRIBE}),
    ResourceType.TRANSACTIONAL_ID: frozenset({_Op.DESCRIBE, _Op.WRITE}),
    ResourceType.DELEGATION_TOKEN: frozenset({_Op.DESCRIBE}),
    ResourceType.USER: frozenset({_Op.CREATE_TOKENS, _Op.DESCRIBE_TOKENS}),
}
#: An ALLOW of one of these applies to DESCRIBE too; of the second set, to DESCRIBE_CONFIGS.
_IMPLY_DESCRIBE = frozenset({_Op.DESCRIBE, _Op.READ, _Op.WRITE, _Op.DELETE, _Op.ALTER})
_IMPLY_DESCRIBE_CONFIGS = frozenset({_Op.DESCRIBE_CONFIGS, _Op.ALTER_CONFIGS})


class AclError(LogstoreError, ValueError):
    """A binding or filter that cannot be used (Kafka answers INVALID_REQUEST): the message says
    which field and why."""


def parse_principal(text: str) -> tuple[str, str]:
    """``TYPE:NAME`` -> (type, name), as Kafka's ``SecurityUtils.parseKafkaPrincipal``.

    >>> parse_principal("User:alice")
    ('User', 'alice')

    Raises:
        AclError: no ``:``, or an empty type or name.
    """
    kind, sep, name = text.partition(":")
    if not sep or not kind or not name:
        raise AclError(f"a principal is TYPE:NAME (User:alice), not {text!r}")
    return kind, name


@dataclass(frozen=True, order=True)
class AclBinding:
    """One ACL: a resource pattern and an access control entry. Immutable. A binding is valid
    iff its types are concrete (no ANY, MATCH or UNKNOWN), its name is not empty (CLUSTER's is
    ``kafka-cluster``), its principal is ``TYPE:NAME`` and its host is not empty
    (:meth:`validate`)."""

    resource_type: ResourceType
    name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: AclOperation
    permission: AclPermissionType

    def validate(self) -> "AclBinding":
        """Return self if valid (see the class docstring).

        Raises:
            AclError: why not, as Kafka's ``AclControlManager.validateNewAcl`` says it.
        """
        if self.resource_type in (ResourceType.ANY, ResourceType.UNKNOWN):
            raise AclError(f"Invalid resourceType {self.resource_type.name}")
        if self.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            raise AclError(f"Invalid patternType {self.pattern_type.name}")
        if self.operation in (AclOperation.ANY, AclOperation.UNKNOWN):
            raise AclError(f"Invalid operation {self.operation.name}")
        if self.permission not in (AclPermissionType.ALLOW, AclPermissionType.DENY):
            raise AclError(f"Invalid permissionType {self.permission.name}")
        if not self.name:
            raise AclError("Resource name should not be empty")
        if self.resource_type == ResourceType.CLUSTER and self.name != CLUSTER_NAME:
            raise AclError(f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}")
        parse_principal(self.principal)
        if not self.host:
            raise AclError("Host should not be empty (* is every host)")
        return self

    @classmethod
    def of(cls, resource_type: int, name: str, pattern_type: int, principal: str, host: str, operation: int,
           permission: int) -> "AclBinding":
        """A valid binding from Kafka's numbers (or the enums).

        Raises:
            AclError: an unknown number, or an invalid binding (see :meth:`validate`).
        """
        return cls(_enum(ResourceType, resource_type), name, _enum(PatternType, pattern_type),  # type: ignore[arg-type]
                   principal, host, _enum(AclOperation, operation),  # type: ignore[arg-type]
                   _enum(AclPermissionType, permission)).validate()  # type: ignore[arg-type]

    def __str__(self) -> str:
        return (f"(principal={self.principal}, host={self.host}, operation={self.operation.name}, "
                f"permissionType={self.permission.name}) on {self.resource_type.name}:"
                f"{self.pattern_type.name}:{self.name}")


def _enum(kind: type[enum.IntEnum], value: int) -> enum.IntEnum:
    try:
        return kind(value)
    except ValueError:
        raise AclError(f"unknown {kind.__name__} {value}") from None


@dataclass(frozen=True)
class AclBindingFilter:
    """Which bindings DescribeAcls lists and DeleteAcls removes. Immutable.

    A binding matches iff each field matches (Kafka's ``AclBindingFilter.matches``): the
    resource type (ANY: all); the pattern: with pattern type ANY, the name (None: all) equals
    the binding's; with LITERAL or PREFIXED, the binding has that pattern type and the name (if
    any) equals its; with MATCH, every binding that would match a resource of that name (the
    literal name, the literal ``*``, a prefix of it); principal and host (None: all) equal; the
    operation and the permission (ANY: all) equal.
    """

    resource_type: ResourceType = ResourceType.ANY
    name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission: AclPermissionType = AclPermissionType.ANY

    @classmethod
    def of(cls, resource_type: int, name: str | None, pattern_type: int, principal: str | None, host: str | None,
           operation: int, permission: int) -> "AclBindingFilter":
        """A filter from Kafka's numbers.

        Raises:
            AclError: an unknown number or an UNKNOWN (Kafka refuses those filters).
        """
        made = cls(_enum(ResourceType, resource_type), name, _enum(PatternType, pattern_type),  # type: ignore[arg-type]
                   principal, host, _enum(AclOperation, operation),  # type: ignore[arg-type]
                   _enum(AclPermissionType, permission))  # type: ignore[arg-type]
        for field, value in (("resource type", made.resource_type), ("pattern type", made.pattern_type),
                             ("operation", made.operation), ("permission type", made.permission)):
            if value == 0:
                raise AclError(f"a filter's {field} may not be UNKNOWN")
        return made

    def matches(self, acl: AclBinding) -> bool:
        """Whether ``acl`` is one of the bindings this filter selects (see the class docstring)."""
        if self.resource_type != ResourceType.ANY and self.resource_type != acl.resource_type:
            return False
        pattern = self.pattern_type
        if pattern not in (PatternType.ANY, PatternType.MATCH) and pattern != acl.pattern_type:
            return False
        if self.name is not None:
            if pattern in (PatternType.ANY, acl.pattern_type):
                if self.name != acl.name:
                    return False
            elif acl.pattern_type == PatternType.LITERAL:  # MATCH
                if acl.name not in (self.name, WILDCARD):
                    return False
            elif not self.name.startswith(acl.name):  # MATCH of a PREFIXED binding
                return False
        if self.principal is not None and self.principal != acl.principal:
            return False
        if self.host is not None and self.host != acl.host:
            return False
        if self.operation != AclOperation.ANY and self.operation != acl.operation:
            return False
        return self.permission == AclPermissionType.ANY or self.permission == acl.permission


class AclSet:
    """A set of bindings indexed for the authorizer's questions. Immutable: a change makes a new
    set (:meth:`with_added`, :meth:`without`), so a reader holds one consistent snapshot
    without a lock.

    The index: per resource type, the LITERAL bindings by name and the PREFIXED ones by prefix,
    with the lengths of the prefixes present; a question about a name of n characters costs
    two dict lookups plus one per prefix length present (at most n), whatever the number of
    bindings.
    """

    __slots__ = ("_bindings", "_literal", "_prefixed", "_prefix_lengths")

    def __init__(self, bindings: Iterable[AclBinding] = ()) -> None:
        self._bindings: frozenset[AclBinding] = frozenset(bindings)
        literal: dict[tuple[ResourceType, str], list[AclBinding]] = {}
        prefixed: dict[tuple[ResourceType, str], list[AclBinding]] = {}
        lengths: dict[ResourceType, set[int]] = {}
        for acl in sorted(self._bindings):
            if acl.pattern_type == PatternType.PREFIXED:
                prefixed.setdefault((acl.resource_type, acl.name), []).append(acl)
                lengths.setdefault(acl.resource_type, set()).add(len(acl.name))
            else:
                literal.setdefault((acl.resource_type, acl.name), []).append(acl)
        self._literal = {k: tuple(v) for k, v in literal.items()}
        self._prefixed = {k: tuple(v) for k, v in prefixed.items()}
        self._prefix_lengths = {k: tuple(sorted(v)) for k, v in lengths.items()}

    def __len__(self) -> int:
        return len(self._bindings)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(sorted(self._bindings))

    def __contains__(self, acl: object) -> bool:
        return acl in self._bindings

    @property
    def bindings(self) -> frozenset[AclBinding]:
        """The bindings, as a set."""
        return self._bindings

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AclSet) and other.bindings == self._bindings

    def __hash__(self) -> int:
        return hash(self._bindings)

    def with_added(self, bindings: Iterable[AclBinding]) -> "AclSet":
        """This set and ``bindings`` (a binding already here is no change, as in Kafka)."""
        return AclSet(self._bindings | frozenset(bindings))

    def without(self, bindings: Iterable[AclBinding]) -> "AclSet":
        """This set less ``bindings``."""
        return AclSet(self._bindings - frozenset(bindings))

    def matching(self, acl_filter: AclBindingFilter) -> list[AclBinding]:
        """The bindings ``acl_filter`` selects, in a stable order."""
        return [acl for acl in sorted(self._bindings) if acl_filter.matches(acl)]

    def resource_acls(self, resource_type: ResourceType, name: str) -> list[AclBinding]:
        """The bindings whose pattern matches the resource ``name`` of ``resource_type``, for
        any principal, host and operation."""
        found = list(self._literal.get((resource_type, name), ()))
        if name != WILDCARD:
            found += self._literal.get((resource_type, WILDCARD), ())
        for length in self._prefix_lengths.get(resource_type, ()):
            if length > len(name):
                break
            found += self._prefixed.get((resource_type, name[:length]), ())
        return found

    def decide(self, principal: str, host: str, operation: AclOperation, resource_type: ResourceType, name: str,
               allow_if_no_acls: bool) -> bool:
        """Whether the ACLs allow the action (the rules of the module docstring, super users
        aside)."""
        acls = self.resource_acls(resource_type, name)
        if not acls:
            return allow_if_no_acls
        allowed = False
        for acl in acls:
            if acl.principal != principal and acl.principal != WILDCARD_PRINCIPAL:
                continue
            if acl.host != WILDCARD and acl.host != host:
                continue
            if not _applies(acl, operation):
                continue
            if acl.permission == AclPermissionType.DENY:
                return False
            allowed = True
        return allowed

    def any_allowed(self, principal: str, host: str, operation: AclOperation, resource_type: ResourceType) -> bool:
        """Whether an ALLOW of ``operation`` (or ALL) applies to the principal and host on some
        resource of ``resource_type`` that no DENY covers (Kafka's
        ``Authorizer.authorizeByResourceType``, the ACLs part): a wildcard DENY denies, a
        wildcard ALLOW allows; a literal ALLOW counts unless a literal DENY of the same name
        or a prefixed DENY of a prefix of it applies; a prefixed ALLOW unless a prefixed DENY
        of a prefix of it does."""
        deny_literal: set[str] = set()
        deny_prefixed: set[str] = set()
        allows: list[AclBinding] = []
        for acl in sorted(self._bindings):
            if acl.resource_type != resource_type:
                continue
            if acl.host != WILDCARD and acl.host != host:
                continue
            if acl.principal != principal and acl.principal != WILDCARD_PRINCIPAL:
                continue
            if acl.operation != operation and acl.operation != AclOperation.ALL:
                continue
            if acl.permission == AclPermissionType.DENY:
                if acl.pattern_type == PatternType.LITERAL and acl.name == WILDCARD:
                    return False
                (deny_literal if acl.pattern_type == PatternType.LITERAL else deny_prefixed).add(acl.name)
            else:
                allows.append(acl)
        if any(acl.pattern_type == PatternType.LITERAL and acl.name == WILDCARD for acl in allows):
            return True
        for acl in allows:
            if acl.pattern_type == PatternType.LITERAL and acl.name in deny_literal:
                continue
            if not any(acl.name[:i] in deny_prefixed for i in range(1, len(acl.name) + 1)):
                return True
        return False


def _applies(acl: AclBinding, operation: AclOperation) -> bool:
    """Whether ``acl``'s operation covers ``operation`` (ALL covers every one; an ALLOW also
    covers what its operation implies)."""
    if acl.operation == AclOperation.ALL or acl.operation == operation:
        return True
    if acl.permission != AclPermissionType.ALLOW:
        return False
    if operation == AclOperation.DESCRIBE:
        return acl.operation in _IMPLY_DESCRIBE
    if operation == AclOperation.DESCRIBE_CONFIGS:
        return acl.operation in _IMPLY_DESCRIBE_CONFIGS
    return False


R = TypeVar("R")


class AclSource(Protocol):
    """Where an :class:`Authorizer`'s bindings live (:class:`~logstore.kafka.aclfile.AclFile`):
    the current set, and an atomic change of it."""

    def current(self) -> AclSet:
        """The bindings now (another process's change included)."""
        ...

    def update(self, change: Callable[[AclSet], tuple[AclSet, R]]) -> R:
        """Apply ``change`` (the newest set -> the new set and a result) atomically and durably;
        return its result."""
        ...


class MemoryAcls:
    """An :class:`AclSource` in memory (nothing durable): ACLs given by the program, e.g. to
    embed a server whose ACLs are fixed, or in tests. Thread-safe."""

    def __init__(self, bindings: Iterable[AclBinding] = ()) -> None:
        self._acls = AclSet(acl.validate() for acl in bindings)
        self._lock = threading.Lock()

    def current(self) -> AclSet:
        """The bindings now."""
        return self._acls

    def update(self, change: Callable[[AclSet], tuple[AclSet, R]]) -> R:
        """Apply ``change`` atomically (in memory only)."""
        with self._lock:
            self._acls, result = change(self._acls)
            return result


class Authorizer:
    """Kafka's authorizer over an :class:`AclSource`: who may do what (module docstring).

    Args:
        source: the bindings (:class:`~logstore.kafka.aclfile.AclFile`).
        super_users: principals that may do everything (Kafka's ``super.users``,
            ``User:admin``).
        allow_everyone_if_no_acl_found: Kafka's ``allow.everyone.if.no.acl.found`` (False: a
            resource without ACLs is denied to everyone but the super users).

    Thread-safety: thread-safe; each question reads the source's current set (no cache of its
    own). Durability: :meth:`create` and :meth:`delete` return once the source has made the
    change durable.
    """

    def __init__(self, source: AclSource, super_users: Iterable[str] = (),
                 allow_everyone_if_no_acl_found: bool = False) -> None:
        self.source = source
        self.super_users = frozenset(super_users)
        for principal in self.super_users:
            parse_principal(principal)
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found

    def snapshot(self) -> "AclView":
        """The bindings now, to answer several questions of one request consistently."""
        return AclView(self, self.source.current())

    def authorize(self, principal: str, host: str, operation: AclOperation, resource_type: ResourceType,
                  name: str) -> bool:
        """Whether ``principal`` from ``host`` may do ``operation`` on the resource."""
        return self.snapshot().authorize(principal, host, operation, resource_type, name)

    def create(self, bindings: Iterable[AclBinding]) -> None:
        """Add valid bindings (ones already present are no change).

        Raises:
            AclError: a binding is not valid (nothing is added).
        """
        wanted = [acl.validate() for acl in bindings]
        self.source.update(lambda acls: (acls.with_added(wanted), None))

    def delete(self, filters: Iterable[AclBindingFilter]) -> list[list[AclBinding]]:
        """Remove the bindings each filter matches, all in one change; the bindings each one
        removed (a binding two filters match is listed under both, as in Kafka)."""
        wanted = list(filters)

        def change(acls: AclSet) -> tuple[AclSet, list[list[AclBinding]]]:
            removed = [acls.matching(f) for f in wanted]
            return acls.without(acl for found in removed for acl in found), removed
        return self.source.update(change)

    def describe(self, acl_filter: AclBindingFilter) -> list[AclBinding]:
        """The bindings ``acl_filter`` matches now."""
        return self.source.current().matching(acl_filter)


class AclView:
    """One snapshot of an :class:`Authorizer`'s bindings with its policy: the questions of one
    request. Immutable."""

    __slots__ = ("authorizer", "acls")

    def __init__(self, authorizer: Authorizer, acls: AclSet) -> None:
        self.authorizer = authorizer
        self.acls = acls

    def authorize(self, principal: str, host: str, operation: AclOperation, resource_type: ResourceType,
                  name: str) -> bool:
        """Whether ``principal`` from ``host`` may do ``operation`` on the resource."""
        if principal in self.authorizer.super_users:
            return True
        return self.acls.decide(principal, host, operation, resource_type, name,
                                self.authorizer.allow_everyone_if_no_acl_found)

    def authorize_any(self, principal: str, host: str, operation: AclOperation, resource_type: ResourceType) -> bool:
        """Whether ``principal`` may do ``operation`` on some resource of ``resource_type``
        (Kafka's ``authorizeByResourceType``, used by InitProducerId without a transactional id)."""
        if self.authorize(principal, host, operation, resource_type, "hardcode"):
            return True  # a super user, or no ACLs and allow.everyone.if.no.acl.found
        return self.acls.any_allowed(principal, host, operation, resource_type)

    def authorized_operations(self, principal: str, host: str, resource_type: ResourceType, name: str) -> int:
        """KIP-430's bit field of the operations ``principal`` may do on the resource (bit n set:
        the operation with code n allowed), over the operations the resource type has."""
        bits = 0
        for operation in SUPPORTED_OPERATIONS[resource_type]:
            if self.authorize(principal, host, operation, resource_type, name):
                bits |= 1 << operation
        return bits


def all_operations(resource_type: ResourceType) -> int:
    """KIP-430's bit field of every operation ``resource_type`` has (what a broker without an
    authorizer answers)."""
    bits = 0
    for operation in SUPPORTED_OPERATIONS[resource_type]:
        bits |= 1 << operation
    return bits
