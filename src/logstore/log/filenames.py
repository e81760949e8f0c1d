"""File names of a segment's artefacts: the suffixes and the 20-digit base-offset stem.

A segment with base offset 42 is ``00000000000000000042.log`` with ``.index`` and ``.timeindex``
(and ``.txnindex`` once a transaction aborted in it) beside it, as Kafka names them, and a producer state snapshot taken at offset 42 is
``00000000000000000042.snapshot`` (:mod:`logstore.log.producers`); the other suffixes mark a file
on its way somewhere (``.deleted`` awaiting removal, ``.cleaned`` and ``.swap`` during a
compaction swap, ``.truncating`` the journal of an unfinished truncation). Thread-safe:
constants and pure functions.
"""

from __future__ import annotations

from .._native import lib

__all__ = ["LOG_SUFFIX", "INDEX_SUFFIX", "TIMEINDEX_SUFFIX", "TXNINDEX_SUFFIX", "DELETED_SUFFIX", "CLEANED_SUFFIX",
           "SWAP_SUFFIX", "TRUNCATION_SUFFIX", "SNAPSHOT_SUFFIX", "segment_name", "parse_segment_name"]

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIMEINDEX_SUFFIX = ".timeindex"
TXNINDEX_SUFFIX = ".txnindex"
DELETED_SUFFIX = ".deleted"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
TRUNCATION_SUFFIX = ".truncating"
SNAPSHOT_SUFFIX = ".snapshot"

_DIGITS = lib.LS_SEGMENT_NAME_DIGITS


def segment_name(base_offset: int) -> str:
    """The 20-digit zero-padded file stem Kafka uses for a segment's base offset."""
    return f"{base_offset:0{_DIGITS}d}"


def parse_segment_name(filename: str) -> tuple[int, str] | None:
    """Split ``00000000000000000042.log.deleted`` into (42, ".log.deleted"); None if not ours."""
    stem, dot, rest = filename.partition(".")
    if not dot or len(stem) != _DIGITS or not (stem.isascii() and stem.isdigit()):
        return None
    return int(stem), "." + rest
