"""KIP-848's regex subscriptions are RE2's, as Kafka's RE2/J: what RE2 accepts and refuses,
matched against whole topic names; checked against Python's ``re`` where the two agree, and
where they differ, RE2's answer is the one Kafka gives."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, strategies as st

from logstore.groups.topicregex import InvalidTopicRegex, topic_matcher


@pytest.mark.parametrize("pattern", [
    r"(?=a)t",      # lookahead: no RE2
    r"(?<!a)t",     # lookbehind
    r"(a)\1",       # backreference
    r"(?P<x>a)(?P=x)",
    r"t[",          # unclosed class
    r"(a",
    r"a{2,1}",
])
def test_what_re2_refuses_is_refused_with_its_reason(pattern):
    with pytest.raises(InvalidTopicRegex) as refused:
        topic_matcher(pattern)
    assert str(refused.value)  # RE2's reason, not an empty message


def test_a_pattern_matches_whole_names_only():
    matches = topic_matcher(r"orders\..*")
    assert matches("orders.eu") and matches("orders.")
    assert not matches("x.orders.eu") and not matches("orders")


def test_re2_syntax_python_lacks_is_served():
    """RE2 (and RE2/J) know Unicode classes (\\pL) and POSIX classes, which Python's ``re``
    refuses: a Kafka client's pattern means the same here as on Kafka."""
    assert topic_matcher(r"\pL+-[[:digit:]]+")("événements-42")
    with pytest.raises(re.error):
        re.compile(r"\pL+")


@given(st.text(alphabet="ab.-_", max_size=8), st.sampled_from(["a.*", "[ab]+", "a|b", "(ab)*", "a?b+", "[^.]+"]))
def test_agrees_with_python_on_their_common_syntax(name, pattern):
    assert topic_matcher(pattern)(name) == (re.fullmatch(pattern, name) is not None)
