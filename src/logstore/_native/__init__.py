"""Bindings to logstore's C core (cffi, API mode).

Exports ``ffi`` and ``lib`` from the compiled extension, the constants of ``logstore.h`` (read
from ``lib``, never retyped), and :func:`check`, the one place where a native error code becomes
a Python exception. Stateless; safe to use from any thread (cffi releases the GIL during calls).
"""

from __future__ import annotations

from ..errors import CorruptRecordError, LogstoreError, RecordTooLargeError

try:
    from ._lib import ffi, lib
except ImportError as exc:  # pragma: no cover - only on a broken install
    raise ImportError(
        "logstore's C core is not built; install the package (pip install .) so that cffi "
        f"compiles it: {exc}"
    ) from exc

#: The ABI version the Python layer was written against; must equal the compiled header's.
EXPECTED_ABI_VERSION = 13

if lib.LS_ABI_VERSION != EXPECTED_ABI_VERSION:  # pragma: no cover - only on a stale build
    raise ImportError(
        f"logstore C core ABI version {lib.LS_ABI_VERSION} does not match the Python package "
        f"(expects {EXPECTED_ABI_VERSION}); rebuild with pip install ."
    )

_REASONS = {
    lib.LS_ERR_TRUNCATED: "batch is truncated",
    lib.LS_ERR_CORRUPT: "malformed batch or record",
    lib.LS_ERR_CRC: "CRC32C mismatch",
    lib.LS_ERR_MAGIC: "unsupported magic (only RecordBatch v2 is supported)",
    lib.LS_ERR_NOSPACE: "output buffer too small",
    lib.LS_ERR_ARG: "invalid argument",
    lib.LS_ERR_TOO_LARGE: "batch larger than the size limit",
    lib.LS_ERR_FULL: "segment full",
    lib.LS_ERR_ZERO: "zero-filled tail",
}


def reason(rc: int) -> str:
    """Return the words for native error code ``rc``."""
    return _REASONS.get(rc, f"native error {rc}")


def check(
    rc: int,
    path: str | None = None,
    position: int | None = None,
    *,
    stored_crc: int | None = None,
    computed_crc: int | None = None,
    size: int | None = None,
    limit: int | None = None,
) -> int:
    """Return ``rc`` when it is not an error; otherwise raise the matching exception.

    Every native call whose failure reaches the user goes through here, so that messages are
    uniform: file, position and reason, plus the stored and computed CRC for CRC failures.

    Raises:
        CorruptRecordError: for TRUNCATED, CORRUPT, CRC, MAGIC and ZERO.
        RecordTooLargeError: for TOO_LARGE (needs ``size`` and ``limit``).
        ValueError: for ARG (a caller bug, never data on disk).
        LogstoreError: for anything else.
    """
    if rc >= 0:
        return rc
    if rc in (lib.LS_ERR_TRUNCATED, lib.LS_ERR_CORRUPT, lib.LS_ERR_MAGIC, lib.LS_ERR_ZERO):
        raise CorruptRecordError(path, position, reason(rc))
    if rc == lib.LS_ERR_CRC:
        raise CorruptRecordError(path, position, reason(rc), stored_crc, computed_crc)
    if rc == lib.LS_ERR_TOO_LARGE:
        raise RecordTooLargeError(size if size is not None else -1, limit if limit is not None else -1)
    if rc == lib.LS_ERR_ARG:
        raise ValueError(f"invalid argument to the C core ({path or 'no file'})")
    raise LogstoreError(f"{reason(rc)} ({path or 'no file'}, position {position})")


__all__ = ["ffi", "lib", "check", "reason", "EXPECTED_ABI_VERSION"]
