"""The server-side assignors of KIP-848 (logstore.groups.assignors): balance, coverage, stickiness."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings, strategies as st

from logstore.groups.assignors import RANGE, UNIFORM, assign

T1, T2, T3 = (uuid.UUID(int=i) for i in (1, 2, 3))


def _flat(assignment):
    return [(t, p) for parts in assignment.values() for t, ps in parts.items() for p in ps]


def _sizes(assignment):
    return [sum(len(ps) for ps in parts.values()) for parts in assignment.values()]


topic_counts = st.dictionaries(st.sampled_from([T1, T2, T3]), st.integers(1, 12), min_size=1)
member_names = st.lists(st.text("abcdef", min_size=1, max_size=4), min_size=1, max_size=7, unique=True)


@settings(max_examples=300, deadline=None)
@given(topic_counts, member_names, st.data())
def test_uniform_with_one_subscription_covers_every_partition_once_and_balances(partitions, members, data):
    subs = {m: frozenset(partitions) for m in members}
    # an arbitrary current assignment (possibly overlapping, possibly stale)
    current = {m: {t: frozenset(data.draw(st.sets(st.integers(0, 14), max_size=6))) for t in partitions}
               for m in data.draw(st.lists(st.sampled_from(members + ["gone"]), unique=True))}
    out = assign(UNIFORM, subs, partitions, current)
    flat = _flat(out)
    assert sorted(flat) == sorted((t, p) for t, n in partitions.items() for p in range(n))
    sizes = _sizes(out)
    assert max(sizes) - min(sizes) <= 1
    assert set(out) == set(members)


@settings(max_examples=300, deadline=None)
@given(topic_counts, member_names, st.text("xyz", min_size=1, max_size=3))
def test_uniform_is_sticky_when_a_member_joins(partitions, members, newcomer):
    subs = {m: frozenset(partitions) for m in members}
    before = assign(UNIFORM, subs, partitions, {})
    after = assign(UNIFORM, {**subs, newcomer: frozenset(partitions)}, partitions, before)
    total = sum(partitions.values())
    floor = total // (len(members) + 1)
    for m in members:
        kept = sum(len(before[m].get(t, frozenset()) & ps) for t, ps in after[m].items())
        assert kept >= min(_sizes({m: before[m]})[0], floor)  # a member keeps what its new quota allows


@settings(max_examples=200, deadline=None)
@given(topic_counts, member_names, st.data())
def test_uniform_with_different_subscriptions_assigns_only_subscribed_topics_once(partitions, members, data):
    subs = {m: frozenset(data.draw(st.sets(st.sampled_from(sorted(partitions)), min_size=1))) for m in members}
    out = assign(UNIFORM, subs, partitions, {})
    flat = _flat(out)
    wanted = {t for s in subs.values() for t in s}
    assert sorted(flat) == sorted((t, p) for t in wanted for p in range(partitions[t]))
    for m, parts in out.items():
        assert set(parts) <= subs[m]
    # no partition could move to a member subscribed to its topic with two fewer
    for m, parts in out.items():
        for t in parts:
            for other in out:
                if t in subs[other]:
                    assert _sizes({other: out[other]})[0] + 1 >= _sizes({m: parts})[0]


@settings(max_examples=200, deadline=None)
@given(topic_counts, member_names)
def test_range_gives_each_topic_in_ranges_of_n_over_m(partitions, members):
    subs = {m: frozenset(partitions) for m in members}
    out = assign(RANGE, subs, partitions, {})
    for t, n in partitions.items():
        counts = sorted(len(out[m].get(t, ())) for m in members)
        assert sum(counts) == n and counts[-1] - counts[0] <= 1
    ordered = sorted(members)
    for t, n in partitions.items():  # the first n % m members in id order get one more
        base, extra = divmod(n, len(members))
        assert [len(out[m].get(t, ())) for m in ordered] == [base + (i < extra) for i in range(len(ordered))]


def test_range_co_partitioned_topics_land_on_the_same_member():
    out = assign(RANGE, {"a": frozenset({T1, T2}), "b": frozenset({T1, T2})}, {T1: 4, T2: 4}, {})
    assert out["a"][T1] == out["a"][T2] == frozenset({0, 1})
    assert out["b"][T1] == out["b"][T2] == frozenset({2, 3})


def test_range_keeps_current_partitions_within_quota():
    out = assign(RANGE, {"a": frozenset({T1}), "b": frozenset({T1})}, {T1: 4}, {"b": {T1: frozenset({0, 1})}})
    assert out["b"][T1] == frozenset({0, 1}) and out["a"][T1] == frozenset({2, 3})


def test_unknown_assignor_is_refused():
    with pytest.raises(ValueError, match="unknown assignor"):
        assign("sticky", {"a": frozenset({T1})}, {T1: 1}, {})


def test_a_member_without_subscribed_topics_gets_an_empty_assignment():
    out = assign(UNIFORM, {"a": frozenset({T1}), "b": frozenset()}, {T1: 2}, {})
    assert out["b"] == {} and out["a"] == {T1: frozenset({0, 1})}
