"""A store's directory layout: the ``.topics/`` directory and its topic files, Java properties.

What the store (:class:`~logstore.store.store.LogStore`), its read-only views and the tools all
need to know of a data directory without opening it: kept apart from the store so that a reader
does not load the log layer for it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Mapping

from .. import _fileio
from ..errors import LogstoreError
from .topicids import parse_topic_id, topic_id_text

__all__ = ["REMOTE_STORAGE_FILE", "read_remote_storage", "remote_storage_text", "TOPICS_DIR", "TOPIC_ID_KEY", "TopicEntry", "read_topic_entry", "read_topic_file", "topic_file_text",
           "parse_properties"]

#: the directory of a store's topic files (``.topics/<topic>``: partitions, topic id, config overrides)
TOPICS_DIR = ".topics"
#: the topic file's entry holding the topic id (Kafka's text form; the id's home, see
#: :mod:`logstore.store.topicids`); a store written before topic ids has none until it is opened
TOPIC_ID_KEY = "topic.id"


@dataclass(frozen=True)
class TopicEntry:
    """What a ``.topics/<topic>`` file says: the partition count, the topic id (None in a file
    written before topic ids) and the config overrides by Kafka's names."""

    partitions: int
    topic_id: uuid.UUID | None
    overrides: dict[str, str]


def read_topic_entry(path: str) -> TopicEntry | None:
    """A ``.topics/<topic>`` file's entry; None when the file is missing.

    Raises:
        LogstoreError: the file has no usable ``partitions`` entry, or a malformed topic id.
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
    topic_id = None
    if TOPIC_ID_KEY in props:
        text_id = props.pop(TOPIC_ID_KEY)
        try:
            topic_id = parse_topic_id(text_id)
        except ValueError as exc:
            raise LogstoreError(f"{path}: bad {TOPIC_ID_KEY!r} entry: {exc}") from None
    return TopicEntry(partitions, topic_id, props)


def read_topic_file(path: str) -> tuple[int, dict[str, str]] | None:
    """(partition count, config overrides) from a ``.topics/<topic>`` file; None when missing
    (:func:`read_topic_entry` without the topic id).

    Raises:
        LogstoreError: the file has no usable ``partitions`` entry.
    """
    entry = read_topic_entry(path)
    return None if entry is None else (entry.partitions, entry.overrides)


def topic_file_text(partitions: int, topic_id: uuid.UUID, overrides: Mapping[str, str]) -> bytes:
    """A ``.topics/<topic>`` file: the partition count, the topic id, then the config
    overrides, sorted. The id is required: a rewrite of the file (a new partition count, new
    overrides) must carry the topic's id over."""
    lines = [f"partitions={partitions}", f"{TOPIC_ID_KEY}={topic_id_text(topic_id)}"]
    lines += [f"{k}={v}" for k, v in sorted(overrides.items())]
    return ("\n".join(lines) + "\n").encode()


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


#: where a store remembers its remote tier (tiered storage): the object store's URL and options
REMOTE_STORAGE_FILE = ".remote-storage"
_URL_KEY = "url"
#: option names never written down: credentials come from the environment
_SECRET_WORDS = ("secret", "password", "token", "access_key", "credential", "sas")


def remote_storage_text(url: str, options: Mapping[str, str]) -> bytes:
    """The ``.remote-storage`` file's bytes: the URL, and the options but credentials (an option
    whose name says secret, password, token, access key, credential or SAS is left out)."""
    if "\n" in url or any("\n" in f"{k}{v}" or "=" in k for k, v in options.items()):
        raise LogstoreError("the remote storage URL and options must be single lines without '=' in names")
    kept = {k: str(v) for k, v in options.items() if not any(w in k.lower() for w in _SECRET_WORDS)}
    lines = [f"{_URL_KEY}={url}"] + [f"option.{k}={v}" for k, v in sorted(kept.items())]
    return ("".join(line + "\n" for line in lines)).encode()


def read_remote_storage(root: str) -> tuple[str, dict[str, str]] | None:
    """The remote tier a store remembers (``.remote-storage``): (URL, options), None when it has
    none. Thread-safe; reads the file once."""
    path = f"{root}/{REMOTE_STORAGE_FILE}"
    try:
        text = _fileio.ops.read_file(path).decode("utf-8")
    except FileNotFoundError:
        return None
    props = parse_properties(text, path)
    url = props.get(_URL_KEY)
    if not url:
        raise LogstoreError(f"{path}: no {_URL_KEY}= line")
    return url, {k[len("option."):]: v for k, v in props.items() if k.startswith("option.")}
