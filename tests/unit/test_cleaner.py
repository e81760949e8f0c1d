"""Unit tests of the cleaner's offset map (C open addressing behind logstore.cleaner.OffsetMap)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logstore.cleaner import OffsetMap, key_hash


def test_put_then_get_returns_the_latest_offset_per_key() -> None:
    m = OffsetMap(20 * 100)
    assert m.put([b"a", b"b", b"a", b"c"], [0, 1, 2, 3]) == 4
    assert len(m) == 3
    assert m.get([b"a", b"b", b"c", b"zz"]) == [2, 1, 3, -1]


def test_an_older_offset_never_replaces_a_newer_one() -> None:
    m = OffsetMap(20 * 10)
    m.put([b"k"], [10])
    m.put([b"k"], [4])
    assert m.get([b"k"]) == [10]


def test_put_stops_at_the_first_new_key_once_full_and_keeps_updating_known_keys() -> None:
    m = OffsetMap(20 * 10, load_factor=0.5)
    assert (m.capacity, m.max_size) == (10, 5)
    keys = [b"k%d" % i for i in range(8)]
    assert m.put(keys, list(range(8))) == 5
    assert m.full
    assert m.get(keys) == [0, 1, 2, 3, 4, -1, -1, -1]
    # Known keys still update when the map is full; a new key stops the put there.
    assert m.put([b"k1", b"k9", b"k2"], [20, 21, 22]) == 1
    assert m.get([b"k1", b"k2"]) == [20, 2]


def test_memory_is_20_bytes_per_slot_and_clear_empties_the_map() -> None:
    m = OffsetMap(20 * 1000 + 7)
    assert m.capacity == 1000 and m.max_size == 900
    assert m.memory_bytes / m.max_size <= 24  # bytes per distinct key at load factor 0.9
    m.put([b"x"], [1])
    m.clear()
    assert len(m) == 0 and m.get([b"x"]) == [-1]


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError):
        OffsetMap(10)
    with pytest.raises(ValueError):
        OffsetMap(20 * 10, load_factor=0)
    with pytest.raises(TypeError):
        OffsetMap("big")  # type: ignore[arg-type]
    m = OffsetMap(20 * 10)
    with pytest.raises(ValueError):
        m.put([b"a"], [1, 2])
    with pytest.raises(ValueError):
        m.put([b"a"], [-1])
    with pytest.raises(TypeError):
        m.put(["text"], [1])  # type: ignore[list-item]


def test_offsets_are_relative_to_the_base_and_a_pass_spans_under_2_pow_32() -> None:
    base = 10**12
    m = OffsetMap(20 * 10, base_offset=base)
    assert m.put([b"a", b"b"], [base, base + 2**32 - 3]) == 2
    assert m.get([b"a", b"b"]) == [base, base + 2**32 - 3]
    assert m.put([b"c"], [base + 2**32 - 2]) == 0  # the next pass starts there
    with pytest.raises(ValueError):
        m.put([b"d"], [base - 1])


def test_key_hash_is_xxh3_128() -> None:
    assert key_hash(b"a").hex() == "a96faf705af16834e6c632b61e964e1f"


@settings(deadline=None, max_examples=200)
@given(st.lists(st.tuples(st.binary(max_size=8), st.integers(0, 2**32 - 3)), max_size=300),
       st.integers(2, 400))
def test_map_agrees_with_a_dict_model(pairs, slots) -> None:
    m = OffsetMap(20 * slots)
    keys = [k for k, _ in pairs]
    offsets = [o for _, o in pairs]
    recorded = m.put(keys, offsets)
    model: dict[bytes, int] = {}
    for k, o in pairs[:recorded]:
        model[k] = max(o, model.get(k, -1))
    if recorded < len(pairs):
        assert m.full and keys[recorded] not in model
    assert len(m) == len(model) <= m.max_size
    probe = list(model) + [b"\xff" * 9]
    assert m.get(probe) == [model[k] for k in model] + [-1]


def test_a_large_map_stays_short_of_long_probe_runs() -> None:
    rng = random.Random(3)
    n = 90_000
    m = OffsetMap(20 * 100_000)
    keys = [rng.randbytes(16) for _ in range(n)]
    assert m.put(keys, list(range(n))) == n
    before = m.probes
    assert m.get(keys) == list(range(n))
    # Linear probing at load 0.9 averages ~5.5 probes for a hit; far more means bad hashing.
    assert (m.probes - before) / n < 10
