"""The object store under the remote tier (KIP-405): every remote byte goes through one
:class:`ObjectStore`, so a test injects faults by wrapping or subclassing it.

An ObjectStore is a flat namespace of keys (``a/b/c``, no leading slash) holding immutable
objects, over obstore (Rust's object_store): a local directory (``file:///abs/path``, the
embedded default: no server), memory (``memory://``, tests), S3 and everything that speaks it
(``s3://bucket[/prefix]``), Google Cloud Storage (``gs://``) and Azure Blob Storage (``az://``).
A URL's path below the bucket (or the directory) is a prefix of every key. (In a local
directory a key cannot also be a directory of other keys, ``a/b`` beside ``a/b/c``: the remote
tier's layout never needs that.)

What it promises, for every store:

- A put is atomic: a reader sees the whole object or none (S3's PUT and multipart completion; a
  local directory's rename of a staged file). A put that fails, however far it got, leaves no
  object (an aborted multipart upload's parts are removed by the store's abort, or by the
  bucket's lifecycle rule for incomplete uploads if the process died).
- A put is durable when it returns, as far as the store promises durability: S3, GCS and Azure
  acknowledge only stored objects; a local directory's object is fsynced, with its directories,
  before the put returns (obstore's own local store renames without fsync).
- Every failure is a :class:`~logstore.errors.RemoteStorageError` (an absent object:
  :class:`~logstore.errors.RemoteResourceNotFoundError`) naming the key and the store's URL
  (never credentials). Requests are bounded by a timeout (``request_timeout``, 30 s by
  default, per attempt) and transient failures (5xx answers, refused or reset connections,
  timeouts of reads) are retried ``max_retries`` times with exponential backoff, all within
  ``(max_retries + 1) * request_timeout``; past that the caller (the copy task) retries the
  whole operation later.

Thread-safety: an ObjectStore is safe to share between threads (obstore's stores are; this
class keeps no mutable state but its closed flag).
"""

from __future__ import annotations

import datetime
import logging
import os
import re
from typing import Iterable, Iterator, Mapping
from urllib.parse import urlsplit, urlunsplit

import obstore
from obstore.exceptions import BaseError as ObstoreError
from obstore.store import LocalStore, MemoryStore
from obstore.store import from_url as obstore_from_url

from .. import _fileio
from ..errors import InvalidConfigError, RemoteResourceNotFoundError, RemoteStorageError

__all__ = [
    "ObjectStore",
    "open_object_store",
    "DEFAULT_REQUEST_TIMEOUT",
    "DEFAULT_MAX_RETRIES",
    "PART_SIZE",
    "parse_options",
]

logger = logging.getLogger("logstore.tiered")

#: Seconds one request (one attempt: connect, send, answer) may take before it fails.
DEFAULT_REQUEST_TIMEOUT = 30.0
#: Retries of a request that failed transiently (5xx, connection refused or reset, a read's timeout).
DEFAULT_MAX_RETRIES = 3
#: A file larger than this is uploaded in parts of this size (a multipart upload); smaller ones
#: in one request. Also the size of each read of the local file. S3 wants parts of >= 5 MiB.
PART_SIZE = 8 << 20
#: Parts of one multipart upload in flight at once (memory: up to this many parts).
UPLOAD_CONCURRENCY = 8
#: Staging names (``key#1``...) a local directory's delete looks for: one per put of the key
#: in flight when the process died.
STAGED_PUTS_PROBED = 4

#: obstore's HTTP client options (ClientConfig); every other option is the store's own config
#: (S3Config, GCSConfig, AzureConfig), which obstore checks. obstore panics on a client option
#: passed as store config, so the two are split here.
_CLIENT_OPTIONS = frozenset({
    "allow_http", "allow_invalid_certificates", "connect_timeout", "default_content_type",
    "default_headers", "http1_only", "http2_keep_alive_interval", "http2_keep_alive_timeout",
    "http2_keep_alive_while_idle", "http2_only", "pool_idle_timeout", "pool_max_idle_per_host",
    "proxy_url", "proxy_ca_certificate", "proxy_excludes", "root_certificate",
    "randomize_addresses", "read_timeout", "user_agent",
})
_CLOUD_SCHEMES = frozenset({"s3", "s3a", "gs", "az", "azure", "abfs", "abfss", "adl"})
_ENDPOINT_OPTIONS = ("aws_endpoint_url_s3", "endpoint", "aws_endpoint", "aws_endpoint_url")
_ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT")
_USERINFO = re.compile(r"(//)[^/@\s]*@")


def _without_userinfo(text: str) -> str:
    """``text`` with any ``user:password@`` of a URL in it removed."""
    return _USERINFO.sub(r"\1", text)


def _reason(exc: BaseException) -> str:
    """An obstore error's message without its debug dump, on one line."""
    text = str(exc).split("\n\nDebug source:", 1)[0]
    return _without_userinfo(" ".join(text.split())) or type(exc).__name__


def _check_key(key: str) -> None:
    if not isinstance(key, str) or not key:
        raise ValueError(f"object key {key!r}: a non-empty string is needed")
    parts = key.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"object key {key!r}: a key is '/'-separated names, none empty, '.' or '..'")


class _LocalReadError(RemoteStorageError):
    """The local file a put streams failed to read (raised through obstore's upload, which
    aborts it; put_file re-raises it as it is)."""


class ObjectStore:
    """One object store, by URL: the one layer every remote byte goes through.

    Args:
        url: ``file:///abs/path`` (a local directory, made, durably, if missing),
            ``memory://``, ``s3://bucket[/prefix]``, ``gs://bucket[/prefix]``,
            ``az://container[/prefix]`` (and obstore's other Azure spellings).
        options: the store's settings by obstore's names: S3's ``endpoint``, ``region``,
            ``access_key_id``, ``secret_access_key``, ``virtual_hosted_style_request``, ...
            (GCS's and Azure's likewise) and the HTTP client's ``allow_http``,
            ``connect_timeout``, ``proxy_url``, ... Credentials and settings missing here are
            read from the environment as the cloud's tools read them (``AWS_ACCESS_KEY_ID``,
            ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``,
            ``AWS_ENDPOINT_URL``, ...; ``GOOGLE_*``, ``AZURE_*``). An ``http://`` endpoint
            (given or from the environment) allows plain HTTP, as the AWS tools do. A local
            directory and memory take no options.
        request_timeout: seconds one request to a cloud store may take (per attempt).
        max_retries: retries of a transiently failed request to a cloud store, with
            exponential backoff. (A local directory and memory answer at once or fail.)

    Raises:
        InvalidConfigError: an unknown scheme, a relative ``file://`` path, an unknown option,
            ``timeout`` among the options (it is ``request_timeout``).
        RemoteStorageError: a local directory that cannot be made.

    Durability and thread-safety: see the module docstring.
    """

    def __init__(self, url: str, options: Mapping[str, str] | None = None, *,
                 request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
                 max_retries: int = DEFAULT_MAX_RETRIES) -> None:
        parts = urlsplit(url)
        self._url = urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
        if request_timeout <= 0:
            raise InvalidConfigError(f"object store {self._url}: request_timeout {request_timeout} must be > 0")
        if max_retries < 0:
            raise InvalidConfigError(f"object store {self._url}: max_retries {max_retries} must be >= 0")
        self._local_root: str | None = None
        options = dict(options or {})
        scheme = parts.scheme.lower()
        if scheme == "file":
            if parts.netloc not in ("", "localhost") or not parts.path.startswith("/"):
                raise InvalidConfigError(f"object store {self._url}: a local directory is file:///absolute/path")
            self._refuse_options(options)
            root = os.path.normpath(parts.path)
            try:
                _fileio.ops.makedirs_durable(root)
            except OSError as exc:
                raise RemoteStorageError(f"object store {self._url}: cannot make the directory {root}: {exc}") from exc
            self._local_root = root
            self._store = LocalStore(root)
        elif scheme == "memory":
            if parts.netloc or parts.path not in ("", "/"):
                raise InvalidConfigError(f"object store {self._url}: memory:// takes no path")
            self._refuse_options(options)
            self._store = MemoryStore()
        elif scheme in _CLOUD_SCHEMES:
            self._store = self._open_cloud(url, scheme, options, request_timeout, max_retries)
        else:
            raise InvalidConfigError(f"object store {self._url}: unknown scheme {parts.scheme!r} (file, memory, "
                                     f"s3, gs and az are known)")
        self._closed = False

    def _refuse_options(self, options: Mapping[str, str]) -> None:
        if options:
            raise InvalidConfigError(f"object store {self._url}: takes no options (given {sorted(options)})")

    def _open_cloud(self, url: str, scheme: str, options: dict[str, str], request_timeout: float,
                    max_retries: int):
        client: dict[str, object] = {}
        config: dict[str, str] = {}
        for name, value in options.items():
            plain = name.lower()
            for cloud in ("aws_", "google_", "azure_"):
                plain = plain.removeprefix(cloud)
            if plain == "timeout":
                raise InvalidConfigError(f"object store {self._url}: the request timeout is request_timeout, "
                                         f"not the option {name!r}")
            if plain in _CLIENT_OPTIONS:
                client[plain] = value
            else:
                config[name] = value
        if scheme in ("s3", "s3a") and "allow_http" not in client:
            endpoint = next((options[k] for k in _ENDPOINT_OPTIONS if options.get(k)), None) or \
                next((os.environ[v] for v in _ENDPOINT_VARIABLES if os.environ.get(v)), "")
            if endpoint.lower().startswith("http://"):
                client["allow_http"] = "true"
        client["timeout"] = datetime.timedelta(seconds=request_timeout)
        client.setdefault("connect_timeout", datetime.timedelta(seconds=min(5.0, request_timeout)))
        retry = {
            "max_retries": max_retries,
            "retry_timeout": datetime.timedelta(seconds=request_timeout * (max_retries + 1)),
            "backoff": {"init_backoff": datetime.timedelta(milliseconds=100),
                        "max_backoff": datetime.timedelta(seconds=2), "base": 2},
        }
        try:
            return obstore_from_url(url, config=config or None, client_options=client, retry_config=retry)
        except (ObstoreError, ValueError) as exc:
            raise InvalidConfigError(f"object store {self._url}: {_reason(exc)}") from exc

    # ------------------------------------------------------------------ the public contract
    @property
    def url(self) -> str:
        """The store's URL as given, without credentials."""
        return self._url

    def __repr__(self) -> str:
        return f"ObjectStore({self._url!r})"

    def put_file(self, key: str, path: str) -> None:
        """Upload the local file ``path`` as the object ``key`` (replacing any object there).

        The file is read through :mod:`logstore._fileio` in parts of :data:`PART_SIZE`; a file
        larger than one part goes up as a multipart upload, :data:`UPLOAD_CONCURRENCY` parts at
        a time. The object appears whole or not at all: a failed read of the local file (or a
        file that shrinks meanwhile) aborts the upload. Durable on return.

        Raises:
            RemoteStorageError: the upload or the local read failed (the message names which).
        """
        _check_key(key)
        store = self._open_store("put", key)
        try:
            fd = _fileio.ops.open(path, os.O_RDONLY)
        except OSError as exc:
            raise RemoteStorageError(f"put {key!r} to {self._url}: cannot open the local file {path}: {exc}") from exc
        try:
            try:
                size = _fileio.ops.fsize(fd)
            except OSError as exc:
                raise RemoteStorageError(f"put {key!r} to {self._url}: cannot stat the local file {path}: "
                                         f"{exc}") from exc
            if size <= PART_SIZE:
                data = self._read_local(fd, path, key, 0, size)
                self._call("put", key, obstore.put, store, key, data, use_multipart=False)
            else:
                self._call("put", key, obstore.put, store, key, self._parts(fd, path, key, size),
                           use_multipart=True, chunk_size=PART_SIZE, max_concurrency=UPLOAD_CONCURRENCY)
        finally:
            _fileio.ops.close(fd)
        self._sync_local(key)

    def put_bytes(self, key: str, data: bytes | bytearray | memoryview) -> None:
        """Store ``data`` as the object ``key`` (replacing any object there). Atomic; durable on
        return.

        Raises:
            RemoteStorageError: the store refused it or could not be reached.
        """
        _check_key(key)
        store = self._open_store("put", key)
        self._call("put", key, obstore.put, store, key, data, use_multipart=len(data) > PART_SIZE,
                   chunk_size=PART_SIZE, max_concurrency=UPLOAD_CONCURRENCY)
        self._sync_local(key)

    def get(self, key: str) -> bytes:
        """The whole object ``key``.

        Raises:
            RemoteResourceNotFoundError: there is no such object.
            RemoteStorageError: the store failed.
        """
        _check_key(key)
        store = self._open_store("get", key)
        result = self._call("get", key, obstore.get, store, key)
        return self._call("get", key, lambda: result.bytes().to_bytes())

    def get_range(self, key: str, start: int, end: int | None) -> bytes:
        """The bytes ``[start, end)`` of the object ``key`` (``end`` None: to its end), fewer when
        the object ends before ``end``. An empty range (``start == end``) is b"" without a
        request. A range starting at or past the object's end is refused by the stores (S3's
        416): a RemoteStorageError.

        Raises:
            ValueError: ``start < 0`` or ``end < start``.
            RemoteResourceNotFoundError: there is no such object.
            RemoteStorageError: the store failed, or refused the range.
        """
        _check_key(key)
        if start < 0 or (end is not None and end < start):
            raise ValueError(f"object {key!r}: [{start}, {end}) is no byte range")
        if end == start:
            return b""
        store = self._open_store("get", key)
        what = f"get [{start}, {'end' if end is None else end}) of"
        if end is None:
            result = self._call(what, key, obstore.get, store, key, options={"range": {"offset": start}})
            return self._call(what, key, lambda: result.bytes().to_bytes())
        return self._call(what, key, obstore.get_range, store, key, start=start, end=end).to_bytes()

    def size(self, key: str) -> int | None:
        """The size in bytes of the object ``key``; None when there is none.

        Raises:
            RemoteStorageError: the store failed.
        """
        _check_key(key)
        store = self._open_store("head", key)
        try:
            return self._call("head", key, obstore.head, store, key)["size"]
        except RemoteResourceNotFoundError:
            return None

    def delete(self, key: str) -> None:
        """Delete the object ``key``; an absent one is no error (idempotent). Durable on return.

        In a local directory it also removes what a put of ``key`` cut short by a crash left:
        obstore stages a put as ``key#<n>`` and renames it, and a process killed in between
        leaves that file (never listed, never read, but on disk for good).

        Raises:
            RemoteStorageError: the store failed.
        """
        _check_key(key)
        store = self._open_store("delete", key)
        try:
            self._call("delete", key, obstore.delete, store, key)
            deleted = True
        except RemoteResourceNotFoundError:
            deleted = False
        if self._local_root is not None:
            path = os.path.join(self._local_root, *key.split("/"))
            staged = self._call("delete", key, self._remove_staged_puts, path)
            if deleted or staged:
                self._call("delete", key, _fileio.ops.fsync_dir, os.path.dirname(path))

    @staticmethod
    def _remove_staged_puts(path: str) -> bool:
        """Unlink what interrupted puts of the local object at ``path`` left (``<path>#<n>``: obstore
        counts up from 1 past the names in use); whether there was any."""
        found = False
        for n in range(1, STAGED_PUTS_PROBED + 1):
            try:
                _fileio.ops.unlink(f"{path}#{n}")
                found = True
            except FileNotFoundError:
                continue
        return found

    def list(self, prefix: str = "") -> list[tuple[str, int]]:
        """Every object whose key starts with ``prefix`` (plain string prefix), as (key, size)
        sorted by key.

        Raises:
            RemoteStorageError: the store failed.
        """
        if prefix.startswith("/"):
            raise ValueError(f"object key prefix {prefix!r}: keys have no leading '/'")
        store = self._open_store("list", prefix)
        directory = prefix.rpartition("/")[0]
        if directory:
            _check_key(directory)
        # obstore lists by whole path segments: list the prefix's directory, filter by the rest.
        metas = self._call("list", prefix, lambda: obstore.list(store, prefix=directory or None).collect())
        return sorted((m["path"], m["size"]) for m in metas if m["path"].startswith(prefix))

    def close(self) -> None:
        """Release the store; every later call raises RemoteStorageError. Idempotent."""
        self._closed = True

    # ------------------------------------------------------------------ internals
    def _open_store(self, op: str, key: str):
        if self._closed:
            raise RemoteStorageError(f"{op} {key!r} at {self._url}: the object store is closed")
        return self._store

    def _call(self, op: str, key: str, fn, *args, **kwargs):
        """``fn(*args, **kwargs)``, with every failure as a RemoteStorageError naming ``key``."""
        try:
            return fn(*args, **kwargs)
        except _LocalReadError:
            raise
        except FileNotFoundError as exc:
            raise RemoteResourceNotFoundError(f"{op} {key!r} at {self._url}: no such object") from exc
        except (ObstoreError, OSError, ValueError) as exc:
            logger.debug("%s %r at %s failed", op, key, self._url, exc_info=True)
            raise RemoteStorageError(f"{op} {key!r} at {self._url} failed: {_reason(exc)}") from exc

    def _read_local(self, fd: int, path: str, key: str, position: int, length: int) -> bytes:
        """``length`` bytes of the local file at ``position`` (_LocalReadError when short or failed)."""
        chunks: list[bytes] = []
        done = 0
        try:
            while done < length:
                chunk = _fileio.ops.pread(fd, length - done, position + done)
                if not chunk:
                    raise _LocalReadError(f"put {key!r} to {self._url}: the local file {path} ended at "
                                          f"{position + done}, before its size {position + length} when the "
                                          f"upload began; nothing was stored")
                chunks.append(chunk)
                done += len(chunk)
        except OSError as exc:
            raise _LocalReadError(f"put {key!r} to {self._url}: reading the local file {path} at "
                                  f"{position + done} failed: {exc}; nothing was stored") from exc
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _parts(self, fd: int, path: str, key: str, size: int) -> Iterator[bytes]:
        for position in range(0, size, PART_SIZE):
            yield self._read_local(fd, path, key, position, min(PART_SIZE, size - position))

    def _sync_local(self, key: str) -> None:
        """Make a local directory's new object durable: the file, then each directory from its
        own up to the root (obstore may have created them)."""
        if self._local_root is None:
            return
        path = os.path.join(self._local_root, *key.split("/"))

        def sync() -> None:
            fd = _fileio.ops.open(path, os.O_RDONLY)
            try:
                _fileio.ops.fsync(fd)
            finally:
                _fileio.ops.close(fd)
            directory = os.path.dirname(path)
            while True:
                _fileio.ops.fsync_dir(directory)
                if directory == self._local_root:
                    break
                directory = os.path.dirname(directory)

        self._call("put", key, sync)


def open_object_store(url: str, options: Mapping[str, str] | None = None, *,
                      request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
                      max_retries: int = DEFAULT_MAX_RETRIES) -> ObjectStore:
    """The object store at ``url`` (see :class:`ObjectStore` for the URLs, options and limits).

    >>> store = open_object_store("memory://")
    >>> store.put_bytes("a/b", b"hello")
    >>> store.get_range("a/b", 1, 3)
    b'el'
    >>> store.list("a/")
    [('a/b', 5)]

    Raises:
        InvalidConfigError: the URL or an option is not understood.
    """
    return ObjectStore(url, options, request_timeout=request_timeout, max_retries=max_retries)


def parse_options(items: Iterable[str], what: str = "--remote-storage-option") -> dict[str, str]:
    """Object store settings given as ``NAME=VALUE`` strings (a command's repeated option) as
    a dict, names and values stripped.

    Raises:
        ValueError: an item without ``=`` or without a name (the message names ``what``).
    """
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"{what} {item!r}: expected NAME=VALUE")
        out[name.strip()] = value.strip()
    return out
