"""The ACL model and matcher (logstore.kafka.acls): Kafka's rules case by case, and a hypothesis
property test of the indexed matcher against a naive reading of the rules over every binding."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from logstore.kafka.acls import (
    ANONYMOUS, CLUSTER_NAME, SUPPORTED_OPERATIONS, AclBinding, AclBindingFilter, AclError, AclOperation as Op,
    AclPermissionType as Perm, AclSet, Authorizer, MemoryAcls, PatternType as PT, ResourceType as RT, all_operations,
    parse_principal)


def acl(name, principal="User:alice", op=Op.READ, perm=Perm.ALLOW, pattern=PT.LITERAL, kind=RT.TOPIC, host="*"):
    return AclBinding(kind, name, pattern, principal, host, op, perm)


def may(acls, principal="User:alice", op=Op.READ, name="orders", kind=RT.TOPIC, host="10.0.0.1", **kwargs):
    return Authorizer(MemoryAcls(acls), **kwargs).authorize(principal, host, op, kind, name)


# ---------------------------------------------------------------------- the rules
def test_no_acls_denies_unless_allow_everyone_if_no_acl_found():
    assert not may([])
    assert may([], allow_everyone_if_no_acl_found=True)


def test_acls_on_the_resource_for_someone_else_deny_even_with_allow_everyone():
    assert not may([acl("orders", "User:bob")], allow_everyone_if_no_acl_found=True)
    assert may([acl("other", "User:bob")], allow_everyone_if_no_acl_found=True)


def test_deny_wins_over_allow():
    assert may([acl("orders")])
    assert not may([acl("orders"), acl("orders", perm=Perm.DENY)])
    assert not may([acl("ord", pattern=PT.PREFIXED), acl("orders", perm=Perm.DENY)])
    assert not may([acl("orders"), acl("*", "User:*", op=Op.ALL, perm=Perm.DENY)])


def test_literal_wildcard_and_prefixed_patterns():
    assert may([acl("*")])
    assert may([acl("ord", pattern=PT.PREFIXED)])
    assert may([acl("orders", pattern=PT.PREFIXED)])
    assert not may([acl("orders-x", pattern=PT.PREFIXED)])
    assert not may([acl("ord")])  # a literal name is not a prefix
    assert not may([acl("*", pattern=PT.PREFIXED)])  # "*" is a wildcard only as a literal


def test_principal_wildcard_and_host():
    assert may([acl("orders", "User:*")])
    assert not may([acl("orders", "User:bob")])
    assert may([acl("orders", host="10.0.0.1")])
    assert not may([acl("orders", host="10.0.0.2")])


def test_implied_operations_only_for_allow():
    for implying in (Op.READ, Op.WRITE, Op.DELETE, Op.ALTER):
        assert may([acl("orders", op=implying)], op=Op.DESCRIBE)
    assert not may([acl("orders", op=Op.CREATE)], op=Op.DESCRIBE)
    assert may([acl("orders", op=Op.ALTER_CONFIGS)], op=Op.DESCRIBE_CONFIGS)
    # a DENY of READ does not deny DESCRIBE
    assert may([acl("orders", op=Op.DESCRIBE), acl("orders", op=Op.READ, perm=Perm.DENY)], op=Op.DESCRIBE)
    assert not may([acl("orders", op=Op.DESCRIBE), acl("orders", op=Op.ALL, perm=Perm.DENY)], op=Op.DESCRIBE)


def test_super_users_may_do_everything_even_when_denied():
    acls = [acl("orders", "User:root", perm=Perm.DENY, op=Op.ALL)]
    assert may(acls, "User:root", super_users=["User:root"])
    assert not may(acls, "User:root")


def test_resource_types_do_not_mix():
    assert not may([acl("orders", kind=RT.GROUP)])
    assert may([acl("orders", kind=RT.GROUP)], kind=RT.GROUP)


def test_authorize_any_of_a_type_as_kafkas_authorize_by_resource_type():
    view = lambda acls: Authorizer(MemoryAcls(acls)).snapshot()  # noqa: E731
    assert view([acl("a", op=Op.WRITE)]).authorize_any("User:alice", "h", Op.WRITE, RT.TOPIC)
    assert not view([acl("a", op=Op.READ)]).authorize_any("User:alice", "h", Op.WRITE, RT.TOPIC)
    # a literal allow denied by the same literal, or by a prefix of it
    assert not view([acl("a", op=Op.WRITE), acl("a", op=Op.WRITE, perm=Perm.DENY)]).authorize_any(
        "User:alice", "h", Op.WRITE, RT.TOPIC)
    assert not view([acl("abc", op=Op.WRITE), acl("ab", op=Op.WRITE, perm=Perm.DENY, pattern=PT.PREFIXED)]
                    ).authorize_any("User:alice", "h", Op.WRITE, RT.TOPIC)
    assert not view([acl("*", op=Op.WRITE), acl("*", op=Op.WRITE, perm=Perm.DENY)]).authorize_any(
        "User:alice", "h", Op.WRITE, RT.TOPIC)
    assert view([], ).authorize_any("User:alice", "h", Op.WRITE, RT.TOPIC) is False


def test_authorized_operations_bit_field():
    view = Authorizer(MemoryAcls([acl("orders", op=Op.READ)])).snapshot()
    assert view.authorized_operations("User:alice", "h", RT.TOPIC, "orders") == (1 << Op.READ) | (1 << Op.DESCRIBE)
    assert all_operations(RT.TRANSACTIONAL_ID) == (1 << Op.DESCRIBE) | (1 << Op.WRITE)
    assert Authorizer(MemoryAcls(), super_users=["User:alice"]).snapshot().authorized_operations(
        "User:alice", "h", RT.CLUSTER, CLUSTER_NAME) == all_operations(RT.CLUSTER)


# ---------------------------------------------------------------------- validation and filters
@pytest.mark.parametrize("binding, reason", [
    (acl("t", kind=RT.ANY), "resourceType"),
    (acl("t", pattern=PT.MATCH), "patternType"),
    (acl("t", op=Op.ANY), "operation"),
    (acl("t", perm=Perm.ANY), "permissionType"),
    (acl(""), "empty"),
    (acl("c", kind=RT.CLUSTER, op=Op.ALTER), "kafka-cluster"),
    (acl("t", principal="alice"), "TYPE:NAME"),
    (acl("t", host=""), "Host"),
])
def test_an_invalid_binding_says_why(binding, reason):
    with pytest.raises(AclError, match=reason):
        binding.validate()


def test_binding_from_kafkas_numbers():
    made = AclBinding.of(2, "t", 4, "User:a", "*", 3, 3)
    assert made == acl("t", "User:a", pattern=PT.PREFIXED)
    with pytest.raises(AclError, match="unknown"):
        AclBinding.of(99, "t", 3, "User:a", "*", 3, 3)
    with pytest.raises(AclError, match="UNKNOWN"):
        AclBindingFilter.of(2, None, 0, None, None, 1, 1)
    assert parse_principal("User:a:b") == ("User", "a:b")


def test_filters_select_as_kafkas():
    acls = AclSet([acl("orders"), acl("ord", pattern=PT.PREFIXED), acl("*", "User:bob"),
                   acl("g", kind=RT.GROUP, perm=Perm.DENY)])
    names = lambda f: sorted(a.name for a in acls.matching(f))  # noqa: E731
    assert names(AclBindingFilter()) == ["*", "g", "ord", "orders"]
    assert names(AclBindingFilter(RT.TOPIC, "orders", PT.ANY)) == ["orders"]
    assert names(AclBindingFilter(RT.TOPIC, "orders", PT.MATCH)) == ["*", "ord", "orders"]
    assert names(AclBindingFilter(RT.TOPIC, None, PT.PREFIXED)) == ["ord"]
    assert names(AclBindingFilter(principal="User:bob")) == ["*"]
    assert names(AclBindingFilter(permission=Perm.DENY)) == ["g"]
    assert names(AclBindingFilter(operation=Op.WRITE)) == []


def test_create_is_idempotent_and_delete_lists_what_each_filter_removed():
    source = MemoryAcls()
    authorizer = Authorizer(source)
    authorizer.create([acl("a"), acl("a"), acl("b")])
    authorizer.create([acl("a")])
    assert len(source.current()) == 2
    removed = authorizer.delete([AclBindingFilter(name="a"), AclBindingFilter(RT.TOPIC)])
    assert [[x.name for x in found] for found in removed] == [["a"], ["a", "b"]]
    assert len(source.current()) == 0
    with pytest.raises(AclError):
        authorizer.create([acl("ok"), acl("", "User:x")])
    assert len(source.current()) == 0  # nothing of a refused creation


# ---------------------------------------------------------------------- the matcher vs a naive reading
NAMES = st.text(alphabet="ab*", min_size=1, max_size=3)
PRINCIPALS = st.sampled_from(["User:alice", "User:bob", "User:*"])
HOSTS = st.sampled_from(["*", "10.0.0.1", "10.0.0.2"])
OPS = st.sampled_from([op for op in Op if op not in (Op.UNKNOWN, Op.ANY)])
BINDINGS = st.builds(AclBinding, st.sampled_from([RT.TOPIC, RT.GROUP]), NAMES,
                     st.sampled_from([PT.LITERAL, PT.PREFIXED]), PRINCIPALS, HOSTS, OPS,
                     st.sampled_from([Perm.ALLOW, Perm.DENY]))


def naive(acls, super_users, allow_if_none, principal, host, op, kind, name):
    """The rules of the module docstring, read literally over every binding."""
    if principal in super_users:
        return True
    on_resource = [a for a in acls if a.resource_type == kind and (
        (a.pattern_type == PT.LITERAL and a.name in (name, "*")) or
        (a.pattern_type == PT.PREFIXED and name.startswith(a.name)))]
    if not on_resource:
        return allow_if_none
    applying = [a for a in on_resource if a.principal in (principal, "User:*") and a.host in (host, "*")]

    def covers(a):
        if a.operation in (Op.ALL, op):
            return True
        if a.permission == Perm.DENY:
            return False
        return (op == Op.DESCRIBE and a.operation in (Op.READ, Op.WRITE, Op.DELETE, Op.ALTER)) or \
            (op == Op.DESCRIBE_CONFIGS and a.operation == Op.ALTER_CONFIGS)
    applying = [a for a in applying if covers(a)]
    if any(a.permission == Perm.DENY for a in applying):
        return False
    return any(a.permission == Perm.ALLOW for a in applying)


@settings(max_examples=400, deadline=None)
@given(acls=st.lists(BINDINGS, max_size=12), principal=st.sampled_from(["User:alice", "User:bob", ANONYMOUS]),
       host=st.sampled_from(["10.0.0.1", "10.0.0.2"]), op=OPS.filter(lambda o: o != Op.ALL),
       kind=st.sampled_from([RT.TOPIC, RT.GROUP]), name=NAMES, allow_if_none=st.booleans(),
       super_user=st.booleans())
def test_the_indexed_matcher_agrees_with_the_naive_rules(acls, principal, host, op, kind, name, allow_if_none,
                                                         super_user):
    supers = ["User:bob"] if super_user else []
    authorizer = Authorizer(MemoryAcls(acls), supers, allow_if_none)
    assert authorizer.authorize(principal, host, op, kind, name) == naive(set(acls), supers, allow_if_none,
                                                                          principal, host, op, kind, name)
    # MATCH selects exactly the bindings that apply to the resource's name
    matched = set(AclSet(acls).matching(AclBindingFilter(kind, name, PT.MATCH)))
    assert matched == set(AclSet(acls).resource_acls(kind, name))


def test_supported_operations_are_kafkas():
    assert SUPPORTED_OPERATIONS[RT.GROUP] == {Op.READ, Op.DESCRIBE, Op.DELETE, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS}
