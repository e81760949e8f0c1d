"""Kafka's CurrentAssignmentBuilder (logstore.groups.reconciliation): revoke first, assign once released."""

from __future__ import annotations

import uuid

from logstore.groups.reconciliation import (STABLE, UNRELEASED_PARTITIONS, UNREVOKED_PARTITIONS, MemberAssignment,
                                            reconcile)

T = uuid.UUID(int=7)
FREE = lambda topic, partition: -1  # noqa: E731


def test_a_new_member_gets_its_free_target_at_the_target_epoch():
    member = MemberAssignment(0, 0, STABLE, {}, {})
    out = reconcile(member, 3, {T: frozenset({0, 1})}, FREE, {})
    assert out == MemberAssignment(3, 0, STABLE, {T: frozenset({0, 1})}, {})


def test_partitions_that_move_are_revoked_first_at_the_same_epoch():
    member = MemberAssignment(3, 2, STABLE, {T: frozenset({0, 1, 2})}, {})
    out = reconcile(member, 4, {T: frozenset({0, 5})}, FREE, {T: frozenset({0, 1, 2})})
    assert out.state == UNREVOKED_PARTITIONS and out.epoch == 3
    assert out.assigned == {T: frozenset({0})} and out.pending_revocation == {T: frozenset({1, 2})}
    # still holding one: no progress
    assert reconcile(out, 4, {T: frozenset({0, 5})}, FREE, {T: frozenset({0, 2})}) == out
    # not reported (None): taken as still held
    assert reconcile(out, 4, {T: frozenset({0, 5})}, FREE, None) == out
    # revoked: the new epoch, with the free partition
    done = reconcile(out, 4, {T: frozenset({0, 5})}, FREE, {T: frozenset({0})})
    assert done == MemberAssignment(4, 3, STABLE, {T: frozenset({0, 5})}, {})


def test_a_partition_still_held_by_another_member_is_unreleased_until_freed():
    member = MemberAssignment(3, 2, STABLE, {T: frozenset({0})}, {})
    held = {(T, 1): 3}
    out = reconcile(member, 4, {T: frozenset({0, 1})}, lambda t, p: held.get((t, p), -1), {T: frozenset({0})})
    assert out == MemberAssignment(4, 3, UNRELEASED_PARTITIONS, {T: frozenset({0})}, {})
    held.clear()
    assert reconcile(out, 4, {T: frozenset({0, 1})}, FREE, {T: frozenset({0})}) == \
        MemberAssignment(4, 3, STABLE, {T: frozenset({0, 1})}, {})


def test_a_stable_member_at_the_target_epoch_is_left_alone():
    member = MemberAssignment(4, 3, STABLE, {T: frozenset({0})}, {})
    assert reconcile(member, 4, {T: frozenset({0, 1})}, FREE, None) is member


def test_nothing_to_revoke_when_the_member_no_longer_reports_the_partitions():
    member = MemberAssignment(3, 2, STABLE, {T: frozenset({0, 1})}, {})
    out = reconcile(member, 4, {T: frozenset({0})}, FREE, {T: frozenset({0})})
    assert out == MemberAssignment(4, 3, STABLE, {T: frozenset({0})}, {})
