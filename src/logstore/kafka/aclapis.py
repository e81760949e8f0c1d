"""CreateAcls (30), DescribeAcls (29) and DeleteAcls (31) over an
:class:`~logstore.kafka.acls.Authorizer`, as Kafka's AclApis answers them.

- Without an authorizer: SECURITY_DISABLED (DescribeAcls' error, each creation's, each
  filter's).
- CreateAcls: each creation is checked on its own (a concrete resource type, LITERAL or
  PREFIXED, no ANY or UNKNOWN, a non-empty name, ``kafka-cluster`` for the cluster, a
  ``TYPE:NAME`` principal): a bad one is INVALID_REQUEST with the reason, and the valid ones are
  added in one durable change.
- DescribeAcls: the bindings the filter matches, grouped by resource pattern; a filter with an
  UNKNOWN is INVALID_REQUEST.
- DeleteAcls: each filter removes what it matches (all filters in one durable change) and
  lists it; a bad filter is INVALID_REQUEST for that filter only.

Who may call them (ALTER on the cluster to change, DESCRIBE to list) is the table's
(:mod:`~logstore.kafka.aclguard`). Thread-safety: the functions may be called from any thread.
"""

from __future__ import annotations

import logging
from typing import Any

from ..errorcodes import ErrorCode, code_for
from ..errors import LogstoreError, NotLeaderOrFollowerError
from .acls import AclBinding, AclBindingFilter, AclError, Authorizer

__all__ = ["describe_acls", "create_acls", "delete_acls"]

logger = logging.getLogger("logstore.kafka.authorizer")

_DISABLED = "No Authorizer is configured on the broker"


def describe_acls(authorizer: Authorizer | None, body: Any) -> dict[str, Any]:
    """DescribeAcls' answer to ``body``."""
    if authorizer is None:
        return {"throttle_time": 0, "error_code": ErrorCode.security_disabled, "error_message": _DISABLED,
                "resources": []}
    try:
        acl_filter = AclBindingFilter.of(body.resource_type_filter, body.resource_name_filter, body.pattern_type_filter,
                                         body.principal_filter, body.host_filter, body.operation, body.permission_type)
    except AclError as exc:
        return {"throttle_time": 0, "error_code": ErrorCode.invalid_request, "error_message": str(exc),
                "resources": []}
    resources: dict[tuple[int, str, int], list[dict[str, Any]]] = {}
    for acl in authorizer.describe(acl_filter):
        resources.setdefault((acl.resource_type, acl.name, acl.pattern_type), []).append(
            {"principal": acl.principal, "host": acl.host, "operation": acl.operation,
             "permission_type": acl.permission})
    return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None,
            "resources": [{"resource_type": rt, "resource_name": name, "pattern_type": pt, "acls": acls}
                          for (rt, name, pt), acls in resources.items()]}


def create_acls(authorizer: Authorizer | None, body: Any) -> dict[str, Any]:
    """CreateAcls' answer to ``body`` (the valid creations added, durably)."""
    if authorizer is None:
        return {"throttle_time": 0, "results": [{"error_code": ErrorCode.security_disabled,
                                                 "error_message": _DISABLED} for _ in body.creations]}
    results: list[dict[str, Any]] = []
    valid: list[AclBinding] = []
    for creation in body.creations:
        try:
            valid.append(AclBinding.of(creation.resource_type, creation.resource_name,
                                       creation.resource_pattern_type, creation.principal, creation.host,
                                       creation.operation, creation.permission_type))
            results.append({"error_code": ErrorCode.none, "error_message": None})
        except AclError as exc:
            results.append({"error_code": ErrorCode.invalid_request, "error_message": str(exc)})
    if valid:
        try:
            authorizer.create(valid)
            logger.info("created ACLs: %s", "; ".join(map(str, valid)))
        except (LogstoreError, OSError) as exc:
            logger.error("CreateAcls failed: %s", exc)
            error = _storage_error(exc)
            for result in results:
                if result["error_code"] == ErrorCode.none:
                    result.update(error_code=error, error_message=f"the ACLs could not be stored: {exc}")
    return {"throttle_time": 0, "results": results}


def delete_acls(authorizer: Authorizer | None, body: Any) -> dict[str, Any]:
    """DeleteAcls' answer to ``body`` (what the valid filters match removed, durably)."""
    if authorizer is None:
        return {"throttle_time": 0, "filter_results": [
            {"error_code": ErrorCode.security_disabled, "error_message": _DISABLED, "matching_acls": []}
            for _ in body.filters]}
    filters: list[AclBindingFilter | None] = []
    problems: list[str | None] = []
    for f in body.filters:
        try:
            filters.append(AclBindingFilter.of(f.resource_type_filter, f.resource_name_filter, f.pattern_type_filter,
                                               f.principal_filter, f.host_filter, f.operation, f.permission_type))
            problems.append(None)
        except AclError as exc:
            filters.append(None)
            problems.append(str(exc))
    valid = [f for f in filters if f is not None]
    try:
        removed = iter(authorizer.delete(valid)) if valid else iter(())
    except (LogstoreError, OSError) as exc:
        logger.error("DeleteAcls failed: %s", exc)
        error = _storage_error(exc)
        return {"throttle_time": 0, "filter_results": [
            {"error_code": error, "error_message": f"the ACLs could not be stored: {exc}", "matching_acls": []}
            for _ in body.filters]}
    results = []
    for f, problem in zip(filters, problems):
        if f is None:
            results.append({"error_code": ErrorCode.invalid_request, "error_message": problem, "matching_acls": []})
            continue
        results.append({"error_code": ErrorCode.none, "error_message": None, "matching_acls": [
            {"error_code": ErrorCode.none, "error_message": None, "resource_type": acl.resource_type,
             "resource_name": acl.name, "pattern_type": acl.pattern_type, "principal": acl.principal,
             "host": acl.host, "operation": acl.operation, "permission_type": acl.permission}
            for acl in next(removed)]})
    return {"throttle_time": 0, "filter_results": results}


def _storage_error(exc: BaseException) -> int:
    """Kafka's code for a change that could not be stored: a replica node that does not (or no
    longer) lead the ACLs' partition is NOT_CONTROLLER (retriable, as a broker answers when the
    controller moved); a timeout REQUEST_TIMED_OUT; a file that could not be written
    KAFKA_STORAGE_ERROR."""
    if isinstance(exc, NotLeaderOrFollowerError):
        return ErrorCode.not_controller
    if isinstance(exc, OSError):
        return ErrorCode.kafka_storage_error
    return code_for(exc)
