"""SASL credentials for the Kafka listener: salted keys per user and mechanism, their file, and
``logstore kafka-user``.

A credential never holds a password, only what the server needs to check one:

- SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677, as Kafka stores them): the salt, the
  iteration count (4096 to 16384, Kafka's bounds), ``StoredKey = H(HMAC(SaltedPassword,
  "Client Key"))`` and ``ServerKey = HMAC(SaltedPassword, "Server Key")``, where
  ``SaltedPassword = PBKDF2-HMAC-H(password, salt, iterations)``. The server never computes
  PBKDF2 for SCRAM: the client does.
- PLAIN (RFC 4616): a salt, an iteration count and ``PBKDF2-HMAC-SHA256(password, salt,
  iterations)``. A PLAIN client sends its password, so the server runs PBKDF2 once per
  attempt (about 2.5 ms at the default 4096 iterations, on one of the listener's verification
  threads, off its network loop).

Passwords are UTF-8 without SASLprep, as Kafka and its clients use them.

The credentials file (:data:`FILE_FORMAT`) is text, one credential a line::

    # comments and blank lines are ignored
    alice:SCRAM-SHA-256:salt=<b64>,iterations=4096,stored_key=<b64>,server_key=<b64>
    alice:PLAIN:salt=<b64>,iterations=4096,hash=<b64>

The user name is percent-encoded (RFC 3986) except letters, digits and ``-._~@+``, so that a
name may hold any character (``:`` is ``%3A``); base64 is the standard alphabet with padding.
A malformed line is an error naming the file and the line. :func:`add_user` (and ``logstore
kafka-user add``) writes the file atomically with mode 0600.

A store's own users: Kafka keeps SCRAM users in its metadata whatever its listeners speak; a
logstore data directory keeps them in :data:`STORE_FILE_NAME` (``<root>/.sasl-credentials``,
this format), the file used when no other is named: by ``logstore serve`` (its SASL users
unless ``--sasl-credentials``, and AlterUserScramCredentials and DescribeUserScramCredentials
on a listener without SASL), and by ``logstore kafka-user`` given the data directory instead of
a file (:func:`users_path`). A store without it has no users.

Thread-safety: the credential classes and :class:`Credentials` are immutable; :class:`CredentialsFile`
is thread-safe. Durability: :func:`add_user` and :func:`remove_user` replace the file
atomically and durably (temp file, fsync, rename, directory fsync).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import contextlib
import hashlib
import hmac
import logging
import os
import secrets
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence, TextIO, Union

from .. import _fileio
from ..errors import LogstoreError

__all__ = ["MECHANISMS", "SCRAM_HASHES", "MIN_ITERATIONS", "DEFAULT_ITERATIONS", "FILE_FORMAT", "STORE_FILE_NAME",
           "CredentialsError", "store_users_path", "users_path",
           "ScramCredential", "PlainCredential", "Credential", "Credentials", "CredentialsFile", "scram_credential",
           "scram_credential_of_salted",
           "plain_credential", "add_user", "remove_user", "main"]

logger = logging.getLogger("logstore.kafka")

#: The SASL mechanisms served, in the order the server lists them.
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
#: SCRAM mechanism -> hashlib name.
SCRAM_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
#: Kafka's minimum SCRAM iteration count (also enforced for PLAIN hashes).
MIN_ITERATIONS = 4096
#: Iterations of a new credential.
DEFAULT_ITERATIONS = 4096
#: The most iterations a credential may ask for: Kafka's SCRAM maximum (ScramMechanism's 16384),
#: for PLAIN hashes too, whose check runs PBKDF2 for every attempt, an unauthenticated client's
#: included (about 10 ms at this count, on the listener's verification threads).
MAX_ITERATIONS = 16384
#: Bytes of a new salt.
SALT_BYTES = 16
#: One line of the credentials file (see the module docstring).
FILE_FORMAT = "USER:MECHANISM:key=value,..."
#: A data directory's own credentials file (see the module docstring).
STORE_FILE_NAME = ".sasl-credentials"
_SAFE = "-._~@+"


class CredentialsError(LogstoreError, ValueError):
    """A credentials file or mapping that cannot be used: names the file and line."""


def store_users_path(root: str | os.PathLike[str]) -> str:
    """The credentials file of the data directory ``root``: its SASL users when no other file is
    named (it may not exist yet: no users)."""
    return os.path.join(os.fspath(root), STORE_FILE_NAME)


def users_path(path: str | os.PathLike[str]) -> str:
    """``path`` itself, or the data directory's own file (:func:`store_users_path`) when
    ``path`` is a directory (``logstore kafka-user add /data/store alice``)."""
    path = os.fspath(path)
    return store_users_path(path) if os.path.isdir(path) else path


@dataclass(frozen=True)
class ScramCredential:
    """A SCRAM credential (RFC 5802): salt, iterations, StoredKey, ServerKey. Immutable
    (thread-safe); in memory only (:func:`add_user` makes it durable)."""

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


@dataclass(frozen=True)
class PlainCredential:
    """A PLAIN credential: PBKDF2-HMAC-SHA256 of the password with ``salt`` and ``iterations``.
    Immutable (thread-safe); in memory only (:func:`add_user` makes it durable)."""

    salt: bytes
    iterations: int
    hash: bytes

    def check(self, password: bytes) -> bool:
        """Whether ``password`` (UTF-8) is this credential's (constant time in the password)."""
        computed = hashlib.pbkdf2_hmac("sha256", password, self.salt, self.iterations)
        return hmac.compare_digest(computed, self.hash)


Credential = Union[ScramCredential, PlainCredential]


def scram_credential(mechanism: str, password: str, salt: bytes | None = None,
                     iterations: int = DEFAULT_ITERATIONS) -> ScramCredential:
    """The SCRAM credential of ``password`` for ``mechanism`` (a new random salt unless given).

    >>> c = scram_credential("SCRAM-SHA-256", "pencil", base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ=="))
    >>> (c.iterations, len(c.stored_key), len(c.server_key))
    (4096, 32, 32)
    """
    name = SCRAM_HASHES.get(mechanism)
    if name is None:
        raise ValueError(f"{mechanism!r} is not a SCRAM mechanism ({', '.join(SCRAM_HASHES)})")
    _check_iterations(iterations)
    salt = secrets.token_bytes(SALT_BYTES) if salt is None else salt
    return scram_credential_of_salted(mechanism, hashlib.pbkdf2_hmac(name, password.encode("utf-8"), salt, iterations),
                                      salt, iterations)


def scram_credential_of_salted(mechanism: str, salted_password: bytes, salt: bytes, iterations: int) -> ScramCredential:
    """The SCRAM credential of a salted password (``PBKDF2(password, salt, iterations)``, what
    AlterUserScramCredentials carries, so that the password never travels): StoredKey and
    ServerKey derived as RFC 5802 says. No check of the iteration count."""
    name = SCRAM_HASHES[mechanism]
    client_key = hmac.digest(salted_password, b"Client Key", name)
    return ScramCredential(salt, iterations, hashlib.new(name, client_key).digest(),
                           hmac.digest(salted_password, b"Server Key", name))


def plain_credential(password: str, salt: bytes | None = None, iterations: int = DEFAULT_ITERATIONS) -> PlainCredential:
    """The PLAIN credential of ``password`` (a new random salt unless given)."""
    _check_iterations(iterations)
    salt = secrets.token_bytes(SALT_BYTES) if salt is None else salt
    return PlainCredential(salt, iterations, hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), salt, iterations))


def _check_iterations(iterations: int) -> None:
    if not MIN_ITERATIONS <= iterations <= MAX_ITERATIONS:
        raise ValueError(f"iterations must be between {MIN_ITERATIONS} and {MAX_ITERATIONS}, got {iterations}")


def _credential(mechanism: str, password: str, iterations: int = DEFAULT_ITERATIONS) -> Credential:
    if mechanism == "PLAIN":
        return plain_credential(password, iterations=iterations)
    if mechanism in SCRAM_HASHES:
        return scram_credential(mechanism, password, iterations=iterations)
    raise ValueError(f"unknown SASL mechanism {mechanism!r} (one of {', '.join(MECHANISMS)})")


class Credentials:
    """A set of credentials: (user, mechanism) -> :class:`ScramCredential` or
    :class:`PlainCredential`. Immutable; thread-safe."""

    def __init__(self, entries: Mapping[tuple[str, str], Credential] | None = None) -> None:
        self._entries = dict(entries or {})

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, object], mechanisms: Sequence[str] = MECHANISMS) -> "Credentials":
        """From ``{user: password}`` (keys derived for every mechanism in ``mechanisms``; the
        password is not kept) or ``{user: {mechanism: credential}}``."""
        entries: dict[tuple[str, str], Credential] = {}
        for user, value in mapping.items():
            if not isinstance(user, str) or not user:
                raise CredentialsError(f"a user name must be a non-empty string, got {user!r}")
            if isinstance(value, str):
                for mechanism in mechanisms:
                    entries[user, mechanism] = _credential(mechanism, value)
            elif isinstance(value, Mapping):
                for mechanism, credential in value.items():
                    _validate(mechanism, credential, f"user {user!r}")
                    entries[user, mechanism] = credential
            else:
                raise CredentialsError(f"user {user!r}: expected a password or a mapping of mechanism -> "
                                       f"credential, got {type(value).__name__}")
        return cls(entries)

    @classmethod
    def parse(cls, text: str, source: str = "<credentials>") -> "Credentials":
        """Read the file format (see the module docstring); errors name ``source`` and the line."""
        entries: dict[tuple[str, str], Credential] = {}
        lines: dict[tuple[str, str], int] = {}
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            where = f"{source}, line {number}"
            user, mechanism, credential = _parse_line(line, where)
            if (user, mechanism) in entries:
                raise CredentialsError(f"{where}: a second {mechanism} credential for {user!r} "
                                       f"(the first is on line {lines[user, mechanism]})")
            entries[user, mechanism] = credential
            lines[user, mechanism] = number
        return cls(entries)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> "Credentials":
        """Read a credentials file (through ``_fileio``)."""
        path = os.fspath(path)
        try:
            raw = _fileio.ops.read_file(path)
        except OSError as exc:
            raise CredentialsError(f"{path}: cannot read the SASL credentials: {exc}") from None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise CredentialsError(f"{path}: not UTF-8 text (byte {exc.start})") from None
        return cls.parse(text, path)

    def lookup(self, user: str, mechanism: str) -> Credential | None:
        """``user``'s credential for ``mechanism``, or None."""
        return self._entries.get((user, mechanism))

    def users(self) -> list[str]:
        """The user names, sorted."""
        return sorted({user for user, _ in self._entries})

    def entries(self) -> dict[tuple[str, str], Credential]:
        """A copy of every (user, mechanism) -> credential."""
        return dict(self._entries)

    def to_text(self) -> str:
        """The file format of these credentials (sorted by user and mechanism)."""
        out = [f"# logstore Kafka SASL credentials ({FILE_FORMAT}); salted keys only, no passwords.\n"]
        for (user, mechanism), credential in sorted(self._entries.items()):
            out.append(f"{urllib.parse.quote(user, safe=_SAFE)}:{mechanism}:{_params(credential)}\n")
        return "".join(out)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Credentials({len(self._entries)} entries for {len(self.users())} users)"


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _params(credential: Credential) -> str:
    if isinstance(credential, ScramCredential):
        return (f"salt={_b64(credential.salt)},iterations={credential.iterations},"
                f"stored_key={_b64(credential.stored_key)},server_key={_b64(credential.server_key)}")
    return f"salt={_b64(credential.salt)},iterations={credential.iterations},hash={_b64(credential.hash)}"


def _parse_line(line: str, where: str) -> tuple[str, str, Credential]:
    parts = line.split(":")
    if len(parts) != 3:
        raise CredentialsError(f"{where}: expected {FILE_FORMAT} (a ':' in a user name is written %3A)")
    quoted, mechanism, raw_params = parts
    try:
        user = urllib.parse.unquote(quoted, errors="strict")
    except UnicodeDecodeError:
        raise CredentialsError(f"{where}: the user name {quoted!r} is not percent-encoded UTF-8") from None
    if not user:
        raise CredentialsError(f"{where}: an empty user name")
    if mechanism not in MECHANISMS:
        raise CredentialsError(f"{where}: unknown mechanism {mechanism!r} (one of {', '.join(MECHANISMS)})")
    params: dict[str, str] = {}
    for item in raw_params.split(","):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CredentialsError(f"{where}: expected key=value, got {item!r}")
        if key in params:
            raise CredentialsError(f"{where}: {key} twice")
        params[key] = value
    wanted = ("salt", "iterations", "hash") if mechanism == "PLAIN" else ("salt", "iterations", "stored_key",
                                                                           "server_key")
    missing = [k for k in wanted if k not in params]
    extra = sorted(set(params) - set(wanted))
    if missing or extra:
        raise CredentialsError(f"{where}: {mechanism} needs {', '.join(wanted)}"
                               + (f"; missing {', '.join(missing)}" if missing else "")
                               + (f"; unknown {', '.join(extra)}" if extra else ""))
    if not params["iterations"].isdigit():
        raise CredentialsError(f"{where}: iterations={params['iterations']!r} is not a number")
    decoded = {}
    for key in wanted:
        if key == "iterations":
            continue
        try:
            decoded[key] = base64.b64decode(params[key], validate=True)
        except (binascii.Error, ValueError):
            raise CredentialsError(f"{where}: {key} is not base64") from None
    iterations = int(params["iterations"])
    credential: Credential
    if mechanism == "PLAIN":
        credential = PlainCredential(decoded["salt"], iterations, decoded["hash"])
    else:
        credential = ScramCredential(decoded["salt"], iterations, decoded["stored_key"], decoded["server_key"])
    _validate(mechanism, credential, where)
    return user, mechanism, credential


def _validate(mechanism: str, credential: object, where: str) -> None:
    if mechanism not in MECHANISMS:
        raise CredentialsError(f"{where}: unknown mechanism {mechanism!r} (one of {', '.join(MECHANISMS)})")
    kind = PlainCredential if mechanism == "PLAIN" else ScramCredential
    if not isinstance(credential, kind):
        raise CredentialsError(f"{where}: a {mechanism} credential must be a {kind.__name__}")
    if not MIN_ITERATIONS <= credential.iterations <= MAX_ITERATIONS:
        raise CredentialsError(f"{where}: iterations={credential.iterations} (between {MIN_ITERATIONS} and "
                               f"{MAX_ITERATIONS})")
    if not credential.salt:
        raise CredentialsError(f"{where}: an empty salt")
    size = hashlib.new(SCRAM_HASHES.get(mechanism, "sha256")).digest_size
    keys = ([credential.hash] if isinstance(credential, PlainCredential)
            else [credential.stored_key, credential.server_key])
    if any(len(key) != size for key in keys):
        raise CredentialsError(f"{where}: a {mechanism} key must be {size} bytes")


class CredentialsFile:
    """A credentials file, read at construction and again when it changes: :meth:`current`
    checks at most once per ``check_interval_s`` whether the file was replaced (another inode,
    as :func:`add_user` and most editors write it) or changed size, and re-reads it then. A
    file that became unreadable or invalid leaves the credentials as they were (logged once per
    change). ``missing_ok``: a file that does not exist (yet) holds no users, rather than an
    error (a data directory's own file, :func:`store_users_path`); :meth:`alter` creates it.
    Thread-safe."""

    def __init__(self, path: str | os.PathLike[str], check_interval_s: float = 1.0, missing_ok: bool = False) -> None:
        self.path = os.fspath(path)
        self.check_interval_s = check_interval_s
        self._missing_ok = missing_ok
        self._lock = threading.Lock()  # a re-read; never waited for (see current)
        self._write_lock = threading.Lock()  # this process's writers, one at a time (then the flock)
        self._stamp = self._identity()
        self._credentials = self._load()
        self._checked = time.monotonic()

    def _load(self) -> Credentials:
        return _read_existing(self.path) if self._missing_ok else Credentials.load(self.path)

    def _identity(self) -> tuple[object, ...] | None:
        ops = _fileio.ops
        identity = ops.path_identity(self.path)
        return None if identity is None else (*identity, ops.size(self.path))

    def current(self) -> Credentials:
        """The credentials now (re-read when the file changed). Never waits: called on a
        listener's network loop, it answers with the credentials read before while another
        thread re-reads or publishes them."""
        now = time.monotonic()
        if now - self._checked < self.check_interval_s:
            return self._credentials
        if not self._lock.acquire(blocking=False):
            return self._credentials
        try:
            if now - self._checked < self.check_interval_s:
                return self._credentials
            self._checked = now
            try:
                stamp = self._identity()
            except OSError:
                stamp = None
            if stamp == self._stamp:
                return self._credentials
            self._stamp = stamp
            try:
                self._credentials = self._load()
                logger.info("re-read the SASL credentials in %s (%d entries)", self.path, len(self._credentials))
            except CredentialsError as exc:
                logger.error("keeping the SASL credentials read before: %s", exc)
            return self._credentials
        finally:
            self._lock.release()

    def alter(self, deletions: Sequence[tuple[str, str]],
              upsertions: Mapping[tuple[str, str], Credential]) -> Credentials:
        """Remove the (user, mechanism) credentials of ``deletions`` and add or replace those of
        ``upsertions``, in one durable, atomic rewrite of the file (the file as it is now, not
        as last read, is what changes); the new credentials are in use for new authentications
        as this returns. Returns them.

        Raises:
            KeyError: a deletion of a credential the file does not hold (nothing is written).
            CredentialsError, OSError: the file cannot be read or written (nothing changes).
        """
        with self._write_lock, _writer_lock(self.path):
            entries = _read_existing(self.path).entries()
            for key in deletions:
                del entries[key]
            entries.update(upsertions)
            credentials = Credentials(entries)
            _write(self.path, credentials)
            stamp = self._identity()
            with self._lock:  # published once written (a re-read holds it only while it reads)
                self._credentials, self._stamp, self._checked = credentials, stamp, time.monotonic()
            return credentials


# ---------------------------------------------------------------------- writing the file
@contextlib.contextmanager
def _writer_lock(path: str) -> Iterator[None]:
    """Hold the flock of ``.lock-<name>`` beside the credentials file ``path``: one read-change-
    write of the file at a time, across threads and processes (``logstore kafka-user`` beside a
    server's AlterUserScramCredentials)."""
    ops = _fileio.ops
    directory, name = os.path.split(os.path.abspath(path))
    with ops.locked(os.path.join(directory, f".lock-{name}"), 0o600):
        yield


def _read_existing(path: str) -> Credentials:
    return Credentials.load(path) if _fileio.ops.exists(path) else Credentials()


def _write(path: str, credentials: Credentials) -> None:
    """Replace ``path`` atomically and durably, mode 0600 (the keys allow offline guessing)."""
    ops = _fileio.ops
    tmp = path + ".tmp"
    fd = ops.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        ops.pwrite(fd, credentials.to_text().encode("utf-8"), 0)
        ops.fsync(fd)
    finally:
        ops.close(fd)
    ops.rename(tmp, path)
    ops.fsync_dir(os.path.dirname(os.path.abspath(path)))


def add_user(path: str | os.PathLike[str], user: str, password: str, mechanisms: Sequence[str] = ("SCRAM-SHA-256",),
             iterations: int = DEFAULT_ITERATIONS) -> None:
    """Add ``user`` to the credentials file ``path`` (created if missing) for each of
    ``mechanisms``, replacing the user's credentials for those mechanisms. Only salted keys
    are written. Durable when it returns; one writer at a time (the flock of ``.lock-<name>``
    beside the file), so a concurrent AlterUserScramCredentials or ``kafka-user`` loses nothing."""
    path = os.fspath(path)
    if not user:
        raise ValueError("the user name must not be empty")
    if not password:
        raise ValueError("the password must not be empty")
    credentials = {mechanism: _credential(mechanism, password, iterations) for mechanism in mechanisms}
    with _writer_lock(path):
        entries = _read_existing(path).entries()
        for mechanism, credential in credentials.items():
            entries[user, mechanism] = credential
        _write(path, Credentials(entries))


def remove_user(path: str | os.PathLike[str], user: str, mechanisms: Sequence[str] | None = None) -> int:
    """Remove ``user``'s credentials (for ``mechanisms``, or all) from ``path``; returns how many
    were removed. Durable when it returns; one writer at a time, as :func:`add_user`."""
    path = os.fspath(path)
    with _writer_lock(path):
        entries = _read_existing(path).entries()
        gone = [key for key in entries if key[0] == user and (mechanisms is None or key[1] in mechanisms)]
        for key in gone:
            del entries[key]
        if gone:
            _write(path, Credentials(entries))
    return len(gone)


_FILE_HELP = f"a credentials file, or a store's data directory (its own users, in {STORE_FILE_NAME})"


def main(argv: Sequence[str] | None = None, prog: str = "logstore kafka-user", stdin: TextIO | None = None) -> int:
    """``logstore kafka-user add FILE USER --mechanism M [--mechanism M ...] [--iterations N]
    [--password-file F]`` (the password is the first line of standard input unless
    ``--password-file``), ``logstore kafka-user delete FILE USER [--mechanism M ...]`` and
    ``logstore kafka-user list FILE``. FILE is a credentials file, or a data directory for its
    own users (:func:`users_path`)."""
    parser = argparse.ArgumentParser(prog=prog, description="Manage the SASL credentials file of logstore serve "
                                     "(--sasl-credentials FILE), or a data directory's own users (FILE a store "
                                     f"directory: its {STORE_FILE_NAME}): salted keys only, never a password.")
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    add = sub.add_parser("add", help="add or replace a user's credentials (password from standard input)")
    add.add_argument("file", help=_FILE_HELP)
    add.add_argument("user")
    add.add_argument("--mechanism", action="append", choices=MECHANISMS, required=True,
                     help="SCRAM-SHA-256, SCRAM-SHA-512 or PLAIN (repeat for several)")
    add.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS)
    add.add_argument("--password-file", help="read the password from the first line of this file")
    delete = sub.add_parser("delete", help="remove a user's credentials")
    delete.add_argument("file", help=_FILE_HELP)
    delete.add_argument("user")
    delete.add_argument("--mechanism", action="append", choices=MECHANISMS, help="only these (default: all)")
    listing = sub.add_parser("list", help="print each user and mechanism")
    listing.add_argument("file", help=_FILE_HELP)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    path = users_path(args.file)
    try:
        if args.action == "add":
            if args.password_file:
                text = _fileio.ops.read_file(args.password_file).decode("utf-8")
            else:
                text = (stdin or sys.stdin).readline()
            password = text.splitlines()[0] if text else ""
            add_user(path, args.user, password, args.mechanism, args.iterations)
        elif args.action == "delete":
            if not remove_user(path, args.user, args.mechanism):
                sys.stderr.write(f"{prog}: {args.user!r} has no such credentials in {path}\n")
                return 1
        else:
            listed = _read_existing(path) if path != args.file else Credentials.load(path)
            for user, mechanism in sorted(listed.entries()):
                sys.stdout.write(f"{user}\t{mechanism}\n")
    except (LogstoreError, OSError, ValueError) as exc:
        sys.stderr.write(f"{prog}: {exc}\n")
        return 1
    return 0
