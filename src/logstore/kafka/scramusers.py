"""SCRAM users over Kafka's protocol (KIP-554): DescribeUserScramCredentials (50) and
AlterUserScramCredentials (51), on the credentials file ``logstore kafka-user`` manages (the
data directory's own unless the listener names another).

:class:`ScramUsers` answers both from the listener's SASL users
(:class:`~logstore.kafka.auth.SaslAuthenticator`): Describe lists each user's SCRAM mechanisms
and iteration counts (never a key); Alter deletes and upserts SCRAM credentials in the
credentials file (:meth:`~logstore.kafka.credentials.CredentialsFile.alter`: one durable, atomic
rewrite per request, in use for new authentications when it is answered). An upsertion carries
the salted password (``PBKDF2(password, salt, iterations)``, computed by the admin client), from
which StoredKey and ServerKey are derived: the password never travels.

Kafka's errors, as its controller gives them: a user named twice in one request
DUPLICATE_RESOURCE, a deletion of a credential that does not exist or a Describe of an unknown
user RESOURCE_NOT_FOUND, a mechanism other than SCRAM-SHA-256 (1) and SCRAM-SHA-512 (2)
UNSUPPORTED_SASL_MECHANISM, an empty user name, an empty salt or an iteration count outside
4096-16384 UNACCEPTABLE_CREDENTIAL. A user's changes are applied together or not at all.

Where the users are: a SASL listener's own (its credentials file, by default the data
directory's, :func:`~logstore.kafka.credentials.store_users_path`); on a listener without SASL,
the data directory's file all the same (``store_users``), as Kafka keeps SCRAM users in its
metadata whatever its listeners speak: a later ``logstore serve --sasl-mechanisms ...`` on the
directory authenticates them. A listener whose users are not a file (a mapping) refuses Alter
with INVALID_REQUEST and a message saying so.

Authorization: on a SASL listener every request comes from an authenticated principal; any
principal may use both APIs until ACLs restrict them (Kafka: ALTER and DESCRIBE on the cluster).

Thread-safety: thread-safe (the file's rewrite is serialised by the file's lock).
"""

from __future__ import annotations

import logging
from typing import Any

from ..errorcodes import ErrorCode
from .credentials import (MAX_ITERATIONS, MIN_ITERATIONS, SCRAM_HASHES, Credentials, CredentialsError,
                          CredentialsFile, ScramCredential, scram_credential_of_salted)
from .wire import KafkaRequest

__all__ = ["SCRAM_MECHANISM_TYPES", "MAX_PROTOCOL_ITERATIONS", "ScramUsers"]

logger = logging.getLogger("logstore.kafka")

#: Kafka's ScramMechanism types on the wire.
SCRAM_MECHANISM_TYPES = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}
_TYPE_OF = {name: code for code, name in SCRAM_MECHANISM_TYPES.items()}
#: The most iterations an upsertion may ask for (Kafka's controller's limit, the credentials' own).
MAX_PROTOCOL_ITERATIONS = MAX_ITERATIONS
_TWICE = "A user credential cannot be altered twice in the same request"


class ScramUsers:
    """The two APIs over ``sasl`` (a :class:`~logstore.kafka.auth.SaslAuthenticator`), or, on a
    listener without SASL (``sasl`` None), over ``store_users`` (the data directory's
    :class:`~logstore.kafka.credentials.CredentialsFile`; None: no users, Alter refused).
    ``authorized``: the listener has an authorizer (which decides who may alter). A listener
    that neither authenticates nor authorizes refuses Alter (POLICY_VIOLATION): whoever reaches
    it could otherwise mint a login, even a super user's, for another listener of the store
    that does authenticate (Kafka's listeners share one authorizer; logstore's servers each
    have their own). Thread-safe."""

    def __init__(self, sasl: Any, store_users: CredentialsFile | None = None, authorized: bool = False) -> None:
        self._sasl = sasl
        self._store_users = store_users
        self._authorized = authorized

    def _credentials(self) -> Credentials:
        if self._sasl is not None:
            return self._sasl.credentials()
        return self._store_users.current() if self._store_users is not None else Credentials()

    def _unauthenticated(self, request: KafkaRequest) -> bool:
        return self._sasl is not None and request.principal is None

    def describe(self, request: KafkaRequest) -> dict[str, Any]:
        """DescribeUserScramCredentials: every user with a SCRAM credential (no users named),
        or the users named."""
        if self._unauthenticated(request):
            return {"throttle_time": 0, "error_code": ErrorCode.cluster_authorization_failed,
                    "error_message": "DescribeUserScramCredentials needs an authenticated principal", "results": []}
        entries = self._credentials().entries()
        scram: dict[str, list[dict[str, int]]] = {}
        for (user, mechanism), credential in sorted(entries.items()):
            if mechanism in _TYPE_OF and isinstance(credential, ScramCredential):
                scram.setdefault(user, []).append({"mechanism": _TYPE_OF[mechanism],
                                                   "iterations": credential.iterations})
        names = [u.name for u in request.body.users] if request.body.users else sorted(scram)
        results = []
        for user in dict.fromkeys(names):
            if names.count(user) > 1:
                results.append({"user": user, "error_code": ErrorCode.duplicate_resource, "credential_infos": [],
                                "error_message": "Cannot describe SCRAM credentials for the same user twice in a "
                                                 f"single request: {user}"})
            elif user not in scram:
                results.append({"user": user, "error_code": ErrorCode.resource_not_found, "credential_infos": [],
                                "error_message": f"Attempt to describe a user credential that does not exist: {user}"})
            else:
                results.append({"user": user, "error_code": ErrorCode.none, "error_message": None,
                                "credential_infos": scram[user]})
        return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "results": results}

    def alter(self, request: KafkaRequest) -> dict[str, Any]:
        """AlterUserScramCredentials: the deletions and upsertions, checked (see the module
        docstring), then written in one rewrite of the credentials file."""
        body = request.body
        errors: dict[str, tuple[ErrorCode, str]] = {}
        deletions: dict[str, tuple[str, str]] = {}
        upsertions: dict[str, tuple[tuple[str, str], ScramCredential]] = {}
        for d in body.deletions:
            if d.name in errors:
                continue
            if deletions.pop(d.name, None) is not None:
                errors[d.name] = (ErrorCode.duplicate_resource, _TWICE)
                continue
            problem = _name_and_mechanism(d.name, d.mechanism)
            if problem is not None:
                errors[d.name] = problem
            else:
                deletions[d.name] = (d.name, SCRAM_MECHANISM_TYPES[d.mechanism])
        for u in body.upsertions:
            if u.name in errors:
                continue
            if deletions.pop(u.name, None) is not None or upsertions.pop(u.name, None) is not None:
                errors[u.name] = (ErrorCode.duplicate_resource, _TWICE)
                continue
            problem = _name_and_mechanism(u.name, u.mechanism)
            if problem is None:
                if u.iterations < MIN_ITERATIONS:
                    problem = (ErrorCode.unacceptable_credential, "Too few iterations")
                elif u.iterations > MAX_PROTOCOL_ITERATIONS:
                    problem = (ErrorCode.unacceptable_credential, "Too many iterations")
                elif not u.salt or not u.salted_password:
                    problem = (ErrorCode.unacceptable_credential, "An empty salt or salted password")
            if problem is not None:
                errors[u.name] = problem
                continue
            mechanism = SCRAM_MECHANISM_TYPES[u.mechanism]
            upsertions[u.name] = ((u.name, mechanism), scram_credential_of_salted(
                mechanism, bytes(u.salted_password), bytes(u.salt), u.iterations))
        if self._unauthenticated(request):
            refusal = (ErrorCode.cluster_authorization_failed, "AlterUserScramCredentials needs an authenticated "
                                                               "principal")
            return _alter_answer({}, {}, {**{n: refusal for n in [*deletions, *upsertions]}, **errors})
        if self._sasl is None and not self._authorized:
            refusal = (ErrorCode.policy_violation, "this listener authenticates no one and has no authorizer, so it "
                                                   "may not create logins for the store: serve with SASL or "
                                                   "--authorizer, or use logstore kafka-user DATA_DIR")
            return _alter_answer({}, {}, {**{n: refusal for n in [*deletions, *upsertions]}, **errors})
        target = self._sasl.credentials_file if self._sasl is not None else self._store_users
        if target is None:
            refusal = (ErrorCode.invalid_request, "this listener's SASL users are not a credentials file "
                                                  "(logstore serve --sasl-credentials FILE): nothing to alter")
            return _alter_answer({}, {}, {**{n: refusal for n in [*deletions, *upsertions]}, **errors})
        while deletions or upsertions:
            try:
                target.alter(list(deletions.values()), dict(upsertions.values()))
                break
            except KeyError as exc:
                user = exc.args[0][0]
                del deletions[user]
                errors[user] = (ErrorCode.resource_not_found, "Attempt to delete a user credential that does not exist")
            except (CredentialsError, OSError) as exc:
                logger.error("AlterUserScramCredentials: cannot rewrite %s: %s", getattr(target, "path", "?"), exc)
                failed = (ErrorCode.unknown_server_error, f"cannot rewrite the credentials file: {exc}")
                errors.update({n: failed for n in [*deletions, *upsertions]})
                deletions, upsertions = {}, {}
        if deletions or upsertions:
            logger.info("%s altered SCRAM credentials: deleted %s, upserted %s", request.principal,
                        sorted(deletions.values()), sorted(key for key, _ in upsertions.values()))
        return _alter_answer(deletions, upsertions, errors)


def _name_and_mechanism(name: str, mechanism: int) -> tuple[ErrorCode, str] | None:
    if not name:
        return ErrorCode.unacceptable_credential, "Username must not be empty"
    if mechanism not in SCRAM_MECHANISM_TYPES or SCRAM_MECHANISM_TYPES[mechanism] not in SCRAM_HASHES:
        return ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism"
    return None


def _alter_answer(deletions: dict[str, Any], upsertions: dict[str, Any],
                  errors: dict[str, tuple[ErrorCode, str]]) -> dict[str, Any]:
    results = [{"user": user, "error_code": ErrorCode.none, "error_message": None}
               for user in [*deletions, *upsertions]]
    results += [{"user": user, "error_code": code, "error_message": message} for user, (code, message) in errors.items()]
    return {"throttle_time": 0, "results": results}
