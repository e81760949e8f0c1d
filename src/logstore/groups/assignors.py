"""The server-side assignors of Kafka's consumer group protocol (KIP-848): ``uniform`` and ``range``.

A consumer group's coordinator computes the group's target assignment itself: given every
member's subscribed topics, each topic's partition count and the members' current target
assignment, an assignor returns a new one. Both assignors here are *sticky*, as Kafka's: a
partition stays with the member that holds it whenever the balance allows, so that a rebalance
moves (and makes members revoke) as few partitions as it can.

- ``uniform`` (Kafka's UniformAssignor, the default): the partitions of all subscribed topics
  are spread over the members subscribed to them. With one subscription shared by every member
  (the common case), the counts differ by at most one and a member keeps
  ``min(current, quota)`` of its partitions, where its quota is the count it ends with. With
  different subscriptions, each unassigned partition goes to the least-loaded member subscribed
  to its topic, then partitions move from a member to one subscribed to their topic with at
  least two fewer, until no such move is left.
- ``range`` (Kafka's RangeAssignor): topic by topic, the members subscribed to a topic (in
  member-id order) get ``n // m`` of its partitions, the first ``n % m`` one more, each member
  keeping those of its current ones that fit its quota. Co-partitioned topics (the same count,
  the same subscribers) end with the same partition numbers on the same member once settled.

Thread-safety: pure functions over their arguments.
"""

from __future__ import annotations

import uuid
from typing import Mapping

__all__ = ["Assignment", "ASSIGNORS", "UNIFORM", "RANGE", "assign"]

#: topic id -> partitions
Assignment = dict[uuid.UUID, frozenset[int]]

UNIFORM = "uniform"
RANGE = "range"
#: the assignors this server has, by Kafka's names
ASSIGNORS = (UNIFORM, RANGE)


def assign(assignor: str, subscriptions: Mapping[str, frozenset[uuid.UUID]], partitions: Mapping[uuid.UUID, int],
           current: Mapping[str, Mapping[uuid.UUID, frozenset[int]]]) -> dict[str, Assignment]:
    """A new target assignment.

    Args:
        assignor: ``uniform`` or ``range``.
        subscriptions: member id -> the ids of the topics it subscribes to (those that exist).
        partitions: topic id -> its partition count (every subscribed topic).
        current: member id -> its current target assignment (stickiness); members absent or
            partitions that no longer exist are ignored.

    Returns:
        member id -> topic id -> partitions, for every member of ``subscriptions`` (an empty
        assignment for a member with nothing); every partition of a subscribed topic once.

    Raises:
        ValueError: an unknown assignor.
    """
    if assignor == UNIFORM:
        flat = _uniform(subscriptions, partitions, current)
    elif assignor == RANGE:
        flat = _range(subscriptions, partitions, current)
    else:
        raise ValueError(f"unknown assignor {assignor!r}: this server has {', '.join(ASSIGNORS)}")
    out: dict[str, Assignment] = {}
    for member in subscriptions:
        grouped: dict[uuid.UUID, set[int]] = {}
        for topic, partition in flat.get(member, ()):
            grouped.setdefault(topic, set()).add(partition)
        out[member] = {topic: frozenset(parts) for topic, parts in grouped.items()}
    return out


_TP = tuple[uuid.UUID, int]


def _retained(subscriptions: Mapping[str, frozenset[uuid.UUID]], partitions: Mapping[uuid.UUID, int],
              current: Mapping[str, Mapping[uuid.UUID, frozenset[int]]]) -> dict[str, list[_TP]]:
    """What each member holds that it may keep: a partition that exists, of a topic it still
    subscribes to, claimed by no member before it (in member-id order)."""
    taken: set[_TP] = set()
    out: dict[str, list[_TP]] = {}
    for member in sorted(subscriptions):
        keep = []
        for topic, parts in sorted(current.get(member, {}).items()):
            if topic not in subscriptions[member] or topic not in partitions:
                continue
            for p in sorted(parts):
                if p < partitions[topic] and (topic, p) not in taken:
                    taken.add((topic, p))
                    keep.append((topic, p))
        out[member] = keep
    return out


def _uniform(subscriptions: Mapping[str, frozenset[uuid.UUID]], partitions: Mapping[uuid.UUID, int],
             current: Mapping[str, Mapping[uuid.UUID, frozenset[int]]]) -> dict[str, list[_TP]]:
    members = sorted(subscriptions)
    if not members:
        return {}
    held = _retained(subscriptions, partitions, current)
    wanted = sorted({(t, p) for m in members for t in subscriptions[m] if t in partitions
                     for p in range(partitions[t])})
    if len({subscriptions[m] for m in members}) == 1:
        return _uniform_homogeneous(members, held, wanted)
    return _uniform_heterogeneous(members, subscriptions, held, wanted)


def _uniform_homogeneous(members: list[str], held: dict[str, list[_TP]], wanted: list[_TP]) -> dict[str, list[_TP]]:
    """Every member subscribes to the same topics: quotas ``n // m`` and ``n // m + 1``, the
    larger ones to the members that hold the most (so the fewest partitions move)."""
    base, extra = divmod(len(wanted), len(members))
    by_holding = sorted(members, key=lambda m: (-len(held[m]), m))
    quota = {m: base + (1 if i < extra else 0) for i, m in enumerate(by_holding)}
    out = {m: held[m][:quota[m]] for m in members}
    assigned = {tp for parts in out.values() for tp in parts}
    free = iter(tp for tp in wanted if tp not in assigned)
    for m in members:
        while len(out[m]) < quota[m]:
            out[m].append(next(free))
    return out


def _uniform_heterogeneous(members: list[str], subscriptions: Mapping[str, frozenset[uuid.UUID]],
                           held: dict[str, list[_TP]], wanted: list[_TP]) -> dict[str, list[_TP]]:
    out = {m: list(held[m]) for m in members}
    owner = {tp: m for m in members for tp in out[m]}
    eligible = {t: [m for m in members if t in subscriptions[m]] for t in {t for t, _ in wanted}}
    # The partitions with the fewest candidates first, each to its least-loaded candidate.
    for tp in sorted((tp for tp in wanted if tp not in owner), key=lambda tp: (len(eligible[tp[0]]), tp)):
        m = min(eligible[tp[0]], key=lambda c: (len(out[c]), c))
        out[m].append(tp)
        owner[tp] = m
    # Then move partitions from a member to a candidate with at least two fewer; each move
    # lowers the sum of squared counts, so this ends.
    moved = True
    while moved:
        moved = False
        for tp in sorted(owner):
            m = owner[tp]
            target = min(eligible[tp[0]], key=lambda c: (len(out[c]), c))
            if len(out[target]) + 1 < len(out[m]):
                out[m].remove(tp)
                out[target].append(tp)
                owner[tp] = target
                moved = True
    return out


def _range(subscriptions: Mapping[str, frozenset[uuid.UUID]], partitions: Mapping[uuid.UUID, int],
           current: Mapping[str, Mapping[uuid.UUID, frozenset[int]]]) -> dict[str, list[_TP]]:
    out: dict[str, list[_TP]] = {m: [] for m in subscriptions}
    for topic in sorted(partitions):
        members = sorted(m for m in subscriptions if topic in subscriptions[m])
        if not members:
            continue
        count = partitions[topic]
        base, extra = divmod(count, len(members))
        quota = {m: base + (1 if i < extra else 0) for i, m in enumerate(members)}
        taken: set[int] = set()
        mine: dict[str, list[int]] = {}
        for m in members:
            keep = sorted(p for p in current.get(m, {}).get(topic, ()) if p < count and p not in taken)[:quota[m]]
            taken.update(keep)
            mine[m] = keep
        free = iter(p for p in range(count) if p not in taken)
        for m in members:
            while len(mine[m]) < quota[m]:
                mine[m].append(next(free))
            out[m].extend((topic, p) for p in mine[m])
    return out
