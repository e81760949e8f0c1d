"""What every suite shares.

Forked children (the crash suites' writers, the lock and view tests' second processes) must not
run the garbage collector over what they inherited: an object of an earlier test that is
garbage in a cycle (kept by a failed test's traceback, say) would be finalised in the child,
and a finaliser that owns the parent's threads or handles (a confluent-kafka client joins
librdkafka's threads, which do not exist in the child) crashes it. So the objects alive at a
fork are frozen for the child (``gc.freeze``: never collected there) and unfrozen again in the
parent.
"""

from __future__ import annotations

import gc
import os

os.register_at_fork(before=gc.freeze, after_in_parent=gc.unfreeze)
