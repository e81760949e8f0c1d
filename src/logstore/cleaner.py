"""Log compaction: the key -> latest offset map of a cleaning pass.

Semantics (Kafka's): a record with key K at offset O is obsolete iff the log holds a record with
key K at an offset O' > O. A cleaning pass first indexes the dirty section of the log into an
:class:`OffsetMap` (key -> latest offset), then copies each record whose offset is the one the
map holds for its key. The map is bounded by a memory budget (``cleaner_dedupe_buffer_size``);
when the dirty section has more distinct keys than fit, the pass cleans the prefix that fit and
the next pass continues.

The map itself is mechanism in C (``ls_offset_map_*``): open addressing with linear probing
over 24-byte slots (the key's 128-bit xxh3 hash and its offset), so memory per distinct key is
24 bytes / load factor (26.7 bytes at Kafka's default load factor of 0.9).
"""

from __future__ import annotations

from typing import Iterable, Sequence

import xxhash

from ._native import check, ffi, lib

__all__ = ["OffsetMap", "key_hash"]

SLOT_SIZE: int = lib.LS_OFFSET_MAP_SLOT_SIZE
HASH_SIZE: int = lib.LS_OFFSET_MAP_HASH_SIZE

#: The 128-bit key hash the map stores (xxh3_128, as the xxhash package computes it).
key_hash = xxhash.xxh3_128_digest


class OffsetMap:
    """Key -> latest offset over a fixed memory budget, for one cleaning pass.

    Args:
        memory_bytes: the budget; the map holds ``memory_bytes // 24`` slots.
        load_factor: the fraction of slots that may hold keys (Kafka's
            ``log.cleaner.io.buffer.load.factor``, default 0.9).

    Keys are bytes (a compacted log has no null keys). Not thread-safe: one pass owns a map.
    """

    def __init__(self, memory_bytes: int, load_factor: float = 0.9) -> None:
        if isinstance(memory_bytes, bool) or not isinstance(memory_bytes, int):
            raise TypeError(f"memory_bytes must be an int, got {type(memory_bytes).__name__}")
        if memory_bytes < 2 * SLOT_SIZE:
            raise ValueError(f"memory_bytes must be at least {2 * SLOT_SIZE}, got {memory_bytes}")
        if not 0.0 < load_factor <= 1.0:
            raise ValueError(f"load_factor must be in (0, 1], got {load_factor}")
        self._memory = bytearray(memory_bytes)
        self._map = ffi.new("ls_offset_map *")
        self._permille = max(1, round(load_factor * 1000))
        self.clear()

    def clear(self) -> None:
        """Forget every key (the memory is reused)."""
        check(lib.ls_offset_map_init(self._map, ffi.from_buffer(self._memory), len(self._memory), self._permille))

    def __len__(self) -> int:
        return self._map.size

    @property
    def capacity(self) -> int:
        """Slots in the map."""
        return self._map.capacity

    @property
    def max_size(self) -> int:
        """Distinct keys the map accepts before put() stops."""
        return self._map.max_size

    @property
    def full(self) -> bool:
        return self._map.size >= self._map.max_size

    @property
    def probes(self) -> int:
        """Slots examined so far by puts and gets (a measure of clustering)."""
        return self._map.probes

    @property
    def memory_bytes(self) -> int:
        return len(self._memory)

    def put(self, keys: Sequence[bytes], offsets: Sequence[int]) -> int:
        """Record each key's offset in order (a later, larger offset wins).

        Returns how many (key, offset) pairs were recorded: fewer than given when the map
        filled up, in which case the caller cleans up to the first pair not recorded.
        """
        if len(keys) != len(offsets):
            raise ValueError(f"{len(keys)} keys but {len(offsets)} offsets")
        if not keys:
            return 0
        hashes = _hashes(keys)
        packed = ffi.new("int64_t[]", list(offsets))
        return check(lib.ls_offset_map_put(self._map, hashes, packed, len(keys)))

    def get(self, keys: Iterable[bytes]) -> list[int]:
        """The offset recorded for each key, -1 for a key not in the map."""
        keys = list(keys)
        if not keys:
            return []
        out = ffi.new("int64_t[]", len(keys))
        check(lib.ls_offset_map_get(self._map, _hashes(keys), out, len(keys)))
        return ffi.unpack(out, len(keys))


def _hashes(keys: Sequence[bytes]) -> bytes:
    try:
        return b"".join(map(key_hash, keys))
    except TypeError:
        bad = next(k for k in keys if not isinstance(k, (bytes, bytearray, memoryview)))
        raise TypeError(f"offset map keys must be bytes, got {type(bad).__name__}") from None
