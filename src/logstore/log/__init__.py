"""The partition: :class:`~logstore.log.log.Log` and the objects it owns (segments, offsets, producer state, flushing)."""
