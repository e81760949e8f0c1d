"""Incremental reconciliation of a consumer-group member (Kafka's CurrentAssignmentBuilder, KIP-848).

A member of a consumer group moves from its current assignment to its target one in steps, so
that no partition is ever consumed by two members at once:

- *STABLE*: the member holds its assignment at the target assignment epoch (or at its own epoch
  when the target has not moved since).
- *UNREVOKED_PARTITIONS*: the target took partitions away from the member. It keeps its epoch
  and is told to revoke those (they stay its own, "pending revocation", until it reports, in a
  heartbeat's owned partitions, that it no longer holds them); only then does it move on.
- *UNRELEASED_PARTITIONS*: the member is at the target epoch but some partitions of its target
  are still held by another member (assigned to it or pending its revocation); it gets them
  once they are released.

A partition is given to a member iff no other member holds it (``owner_epoch`` says -1). A
member is given a new epoch (the target assignment epoch) only once it holds nothing the target
takes away. The rules are Kafka's: a heartbeat that comes with the owned partitions lets
the member advance from UNREVOKED_PARTITIONS when none of the partitions pending revocation is
among them; one without them (None) is taken as still holding them.

Thread-safety: pure functions over immutable values.
"""

from __future__ import annotations

import uuid
from typing import Callable, NamedTuple

from .assignors import Assignment

__all__ = ["STABLE", "UNREVOKED_PARTITIONS", "UNRELEASED_PARTITIONS", "MemberAssignment", "reconcile",
           "holds_any", "subset"]

#: Kafka's MemberState values, as ConsumerGroupCurrentMemberAssignmentValue stores them
STABLE = 0
UNREVOKED_PARTITIONS = 1
UNRELEASED_PARTITIONS = 2
STATE_NAMES = {STABLE: "STABLE", UNREVOKED_PARTITIONS: "UNREVOKED_PARTITIONS",
               UNRELEASED_PARTITIONS: "UNRELEASED_PARTITIONS"}


class MemberAssignment(NamedTuple):
    """Where a member stands: its epoch, the epoch before the last bump, its state, the
    partitions it holds and may consume, and those it must revoke."""

    epoch: int
    previous_epoch: int
    state: int
    assigned: Assignment
    pending_revocation: Assignment


def holds_any(owned: Assignment | None, partitions: Assignment) -> bool:
    """Whether a member that reports ``owned`` (None: it did not say) still holds any of
    ``partitions``."""
    if owned is None:
        return any(partitions.values())
    return any(owned.get(topic, frozenset()) & parts for topic, parts in partitions.items())


def subset(owned: Assignment | None, assigned: Assignment) -> bool:
    """Whether every partition of ``owned`` (None: nothing said) is in ``assigned``."""
    return owned is None or all(parts <= assigned.get(topic, frozenset()) for topic, parts in owned.items())


def reconcile(member: MemberAssignment, target_epoch: int, target: Assignment,
              owner_epoch: Callable[[uuid.UUID, int], int], owned: Assignment | None) -> MemberAssignment:
    """The member's next step toward ``target`` (see the module docstring).

    Args:
        member: where it stands.
        target_epoch, target: the group's target assignment epoch and the member's target.
        owner_epoch: ``(topic id, partition) -> epoch`` of the *other* member holding it, -1
            when none does.
        owned: the partitions the member reports it holds (None: not reported).
    """
    if member.state == UNREVOKED_PARTITIONS:
        if holds_any(owned, member.pending_revocation):
            return member
        return _next(member, member.epoch, target_epoch, target, owner_epoch, owned)
    if member.state == STABLE and member.epoch == target_epoch:
        return member
    return _next(member, member.epoch, target_epoch, target, owner_epoch, owned)


def _next(member: MemberAssignment, epoch: int, target_epoch: int, target: Assignment,
          owner_epoch: Callable[[uuid.UUID, int], int], owned: Assignment | None) -> MemberAssignment:
    assigned: dict[uuid.UUID, frozenset[int]] = {}
    revoke: dict[uuid.UUID, frozenset[int]] = {}
    unreleased = False
    for topic in set(target) | set(member.assigned):
        want = target.get(topic, frozenset())
        have = member.assigned.get(topic, frozenset())
        keep = set(have & want)
        for p in want - have:
            if owner_epoch(topic, p) == -1:
                keep.add(p)
            else:
                unreleased = True
        if keep:
            assigned[topic] = frozenset(keep)
        if have - want:
            revoke[topic] = have - want
    if revoke and holds_any(owned, revoke):
        # Revoke first; the member keeps its epoch until it has.
        return MemberAssignment(epoch, epoch, UNREVOKED_PARTITIONS,
                                {t: p & target.get(t, frozenset()) for t, p in member.assigned.items()
                                 if p & target.get(t, frozenset())}, revoke)
    state = UNRELEASED_PARTITIONS if unreleased else STABLE
    previous = epoch if target_epoch != epoch else member.previous_epoch
    return MemberAssignment(target_epoch, previous, state, assigned, {})
