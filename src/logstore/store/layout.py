"""A store's directory layout: the ``.topics/`` directory and its topic files, Java properties.

What the store (:class:`~logstore.store.store.LogStore`), its read-only views and the tools all
need to know of a data directory without opening it: kept apart from the store so that a reader
does not load the log layer for it.
"""

from __future__ import annotations

from .. import _fileio
from ..errors import LogstoreError

__all__ = ["TOPICS_DIR", "read_topic_file", "parse_properties"]

#: the directory of a store's topic files (``.topics/<topic>``: partitions and config overrides)
TOPICS_DIR = ".topics"


def read_topic_file(path: str) -> tuple[int, dict[str, str]] | None:
    """(partition count, config overrides) from a ``.topics/<topic>`` file; None when missing.

    Raises:
        LogstoreError: the file has no usable ``partitions`` entry.
    """
    try:
        text = _fileio.ops.read_file(path).decode("utf-8")
    except FileNotFoundError:
        return None
    props = parse_properties(text, path)
    try:
        partitions = int(props.pop("partitions"))
    except (KeyError, ValueError):
        raise LogstoreError(f"{path}: missing or bad 'partitions' entry") from None
    return partitions, props


def parse_properties(text: str, path: str) -> dict[str, str]:
    """Java properties, the simple subset logstore writes: ``key=value`` lines, ``#`` comments."""
    props = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise LogstoreError(f"{path}, line {number}: expected key=value, got {line!r}")
        props[key.strip()] = value.strip()
    return props
