"""KIP-848's regex subscriptions, compiled as Kafka compiles them: with RE2's syntax (Kafka
uses RE2/J, Google's RE2 for the JVM; here Google's RE2 through ``google-re2``), so a pattern
means the same to logstore as to Kafka: no lookarounds, no backreferences, linear-time
matching whatever the pattern (a member's regex cannot make the coordinator backtrack for
ever). A pattern matches a topic name as a whole (Kafka's ``matcher(topic).matches()``).

Compiled patterns are cached (a group's members send the same one at every heartbeat).
Thread-safe.
"""

from __future__ import annotations

import functools
from typing import Callable

import re2

__all__ = ["InvalidTopicRegex", "topic_matcher"]

#: RE2's options for a subscription: errors raised, never logged on standard error by the C++
#: library; RE2's default memory bound for a compiled pattern (8 MiB) keeps a member's pattern
#: from taking more
_OPTIONS = re2.Options()
_OPTIONS.log_errors = False


class InvalidTopicRegex(ValueError):
    """A subscription regex RE2 refuses (its reason in the message)."""


@functools.lru_cache(maxsize=1024)
def topic_matcher(pattern: str) -> Callable[[str], bool]:
    """A test of whether a topic name matches ``pattern`` as a whole.

    Raises:
        InvalidTopicRegex: RE2 cannot compile it (RE2/J, Kafka's, refuses the same).
    """
    try:
        compiled = re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode("utf-8", "replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise InvalidTopicRegex(reason) from None
    return lambda topic: compiled.fullmatch(topic) is not None
