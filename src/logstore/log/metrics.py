"""The meter of what was appended to a Log since this process opened it.

The names and meanings of a log's metrics are listed in :mod:`logstore.metrics`. The appended
bytes are counted from the segments' sizes (what the active segment grew by, plus what the
segments it replaced had grown by), so that appends, in any process, pay nothing for them.

Thread-safety: an :class:`AppendMeter` is used with its log's lock held.
"""

from __future__ import annotations

from ..segment import LogSegment

__all__ = ["AppendMeter"]


class AppendMeter:
    """Records and bytes appended to one log since this process opened it (by any process)."""

    __slots__ = ("end_at_open", "_sealed_bytes", "_counted_from")

    def __init__(self) -> None:
        #: the log end offset when the log was opened
        self.end_at_open = 0
        self._sealed_bytes = 0  # appended into segments that are no longer active
        self._counted_from = 0  # the size the active segment had when this process began counting it

    def switch(self, old: LogSegment | None, new: LogSegment) -> None:
        """``new`` becomes the active segment in place of ``old``."""
        if old is not None and old is not new:
            self._sealed_bytes += max(0, old.size - self._counted_from)
        self._counted_from = new.size

    def bytes_in(self, active: LogSegment) -> int:
        """Bytes of batches appended so far, ``active`` being the active segment."""
        return self._sealed_bytes + max(0, active.size - self._counted_from)
