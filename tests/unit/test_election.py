"""Election rules and the quorum-state file (Raft as KRaft applies it)."""

from __future__ import annotations

import json
import os
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logstore import LogstoreError
from logstore.replica.quorum import NONE, Election, QuorumStateFile, Role


def node(tmp_path, node_id, voters=(1, 2, 3)):
    d = tmp_path / f"n{node_id}"
    d.mkdir(exist_ok=True)
    return Election(node_id, voters, QuorumStateFile(str(d), voters))


def test_campaign_majority_and_persistence(tmp_path):
    a = node(tmp_path, 1)
    state = a.start_campaign()
    assert (state.epoch, state.voted_for, a.role) == (1, 1, Role.CANDIDATE)
    assert a.on_vote_response(1, 2, granted=False) is False
    assert a.on_vote_response(1, 2, granted=True) is True
    assert a.role is Role.LEADER and a.leader == 1
    saved = json.load(open(os.path.join(tmp_path, "n1", "quorum-state")))
    assert (saved["leaderEpoch"], saved["leaderId"], saved["votedId"]) == (1, 1, 1)
    restarted = node(tmp_path, 1)  # a restarted leader does not resume leading
    assert restarted.role is Role.FOLLOWER and restarted.epoch == 1 and restarted.leader == NONE


def test_one_vote_per_epoch_even_across_restarts(tmp_path):
    b = node(tmp_path, 2)
    assert b.on_vote_request(5, 1, 0, 0, 0, 0) == (True, 5)
    assert b.on_vote_request(5, 1, 0, 0, 0, 0) == (True, 5)   # the same candidate again
    assert b.on_vote_request(5, 3, 9, 99, 0, 0) == (False, 5)  # another candidate, same epoch
    b = node(tmp_path, 2)                                      # crash and restart
    assert b.on_vote_request(5, 3, 9, 99, 0, 0) == (False, 5)
    assert b.on_vote_request(6, 3, 9, 99, 0, 0) == (True, 6)   # a new epoch, a new vote


def test_vote_only_for_an_up_to_date_log(tmp_path):
    c = node(tmp_path, 3)
    assert c.on_vote_request(2, 1, last_epoch=1, end_offset=10, my_last_epoch=1, my_end_offset=11) == (False, 2)
    assert c.on_vote_request(3, 1, last_epoch=2, end_offset=5, my_last_epoch=1, my_end_offset=11) == (True, 3)
    assert c.on_vote_request(4, 9, 9, 9, 0, 0) == (False, 3)  # not a voter
    assert c.on_vote_request(1, 2, 9, 9, 0, 0) == (False, 3)  # stale epoch


def test_higher_epoch_turns_a_leader_into_a_follower(tmp_path):
    a = node(tmp_path, 1)
    a.start_campaign()
    a.on_vote_response(1, 3, True)
    assert a.role is Role.LEADER
    assert a.observe_epoch(4, leader=2) is True
    assert (a.role, a.epoch, a.leader) == (Role.FOLLOWER, 4, 2)
    assert a.on_vote_response(1, 2, True) is False  # an old campaign's vote counts for nothing


def test_single_voter_leads_at_once(tmp_path):
    solo = node(tmp_path, 7, voters=(7,))
    solo.start_campaign()
    assert solo.role is Role.LEADER


def test_damaged_state_file_is_refused(tmp_path):
    (tmp_path / "n1").mkdir()
    (tmp_path / "n1" / "quorum-state").write_text("{not json")
    with pytest.raises(LogstoreError, match="damaged"):
        node(tmp_path, 1)


def test_election_timeouts_are_randomised():
    rng = random.Random(1)
    values = {round(Election.election_timeout(1.0, rng), 6) for _ in range(50)}
    assert len(values) > 40 and all(1.0 <= v < 2.0 for v in values)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 3), st.integers(1, 6), st.integers(0, 3), st.integers(0, 20),
                          st.integers(0, 3), st.integers(0, 20)), max_size=25))
def test_at_most_one_vote_per_epoch(tmp_path_factory, requests):
    d = tmp_path_factory.mktemp("v")
    voter = Election(2, (1, 2, 3), QuorumStateFile(str(d), (1, 2, 3)))
    granted: dict[int, set[int]] = {}
    for candidate, epoch, le, eo, my_le, my_eo in requests:
        ok, _ = voter.on_vote_request(epoch, candidate, le, eo, my_le, my_eo)
        if ok:
            granted.setdefault(epoch, set()).add(candidate)
            assert (le, eo) >= (my_le, my_eo)
        # restart between requests: the vote must be remembered
        voter = Election(2, (1, 2, 3), QuorumStateFile(str(d), (1, 2, 3)))
    assert all(len(c) == 1 for c in granted.values())


def test_pre_vote_checks_the_log_and_epoch_and_persists_nothing(tmp_path):
    from logstore.replica.quorum import Election, QuorumStateFile

    path = tmp_path / "p"
    path.mkdir()
    e = Election(0, [0, 1, 2], QuorumStateFile(str(path), [0, 1, 2]))
    e.observe_epoch(4, 1)
    before = (path / "quorum-state").read_bytes()
    assert e.would_grant_pre_vote(5, 2, 3, 10, 3, 10)          # next epoch, log as long
    assert not e.would_grant_pre_vote(4, 2, 3, 10, 3, 10)      # not past the current epoch
    assert not e.would_grant_pre_vote(5, 2, 3, 9, 3, 10)       # log behind
    assert not e.would_grant_pre_vote(5, 2, 2, 99, 3, 10)      # older last epoch
    assert not e.would_grant_pre_vote(5, 7, 3, 10, 3, 10)      # not a voter
    assert (e.epoch, e.leader) == (4, 1) and (path / "quorum-state").read_bytes() == before
