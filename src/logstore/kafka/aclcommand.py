"""``logstore acls``: a store's ACLs managed offline, in the spirit of Kafka's ``kafka-acls.sh``.

::

    logstore acls list ROOT [--topic T] [--group G] [--cluster] [--transactional-id I] [--principal P]
    logstore acls add ROOT --allow-principal User:alice --operation Read --topic orders
    logstore acls add ROOT --deny-principal User:bob --operation All --group app- --resource-pattern-type prefixed
    logstore acls remove ROOT [--allow-principal P | --deny-principal P] [--operation O] --topic orders

The changes go to the store's ``.acls`` file (:class:`~logstore.kafka.aclfile.AclFile`,
atomically and durably, under its lock), which a running ``logstore serve --authorizer`` on the
store reads at its next request. ``add`` makes one binding per resource, principal, host and
operation; ``remove`` without a principal or an operation removes every binding of the
resources named (as kafka-acls does). Operations take Kafka's names in any case, with or without
``_`` (``Read``, ``IdempotentWrite``, ``DESCRIBE_CONFIGS``).

It loads no codec (kio), only the ACL model and file.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from ..errors import LogstoreError
from .aclfile import AclFile
from .acls import (CLUSTER_NAME, WILDCARD, AclBinding, AclBindingFilter, AclError, AclOperation, AclPermissionType,
                   Authorizer, PatternType, ResourceType)

__all__ = ["main"]


def _operation(text: str) -> AclOperation:
    wanted = text.replace("_", "").replace("-", "").upper()
    for op in AclOperation:
        if op.name.replace("_", "") == wanted and op not in (AclOperation.UNKNOWN, AclOperation.ANY):
            return op
    raise argparse.ArgumentTypeError(f"unknown operation {text!r}")


def _pattern(text: str) -> PatternType:
    try:
        return PatternType[text.upper()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"unknown resource pattern type {text!r} "
                                         "(literal, prefixed, any, match)") from None


def _resources(args: argparse.Namespace) -> list[tuple[ResourceType, str]]:
    out = [(ResourceType.TOPIC, t) for t in args.topic or ()]
    out += [(ResourceType.GROUP, g) for g in args.group or ()]
    out += [(ResourceType.TRANSACTIONAL_ID, t) for t in args.transactional_id or ()]
    out += [(ResourceType.DELEGATION_TOKEN, t) for t in args.delegation_token or ()]
    out += [(ResourceType.USER, u) for u in args.user_principal or ()]
    if args.cluster:
        out.append((ResourceType.CLUSTER, CLUSTER_NAME))
    return out


def _entries(args: argparse.Namespace) -> list[tuple[str, str, AclPermissionType]]:
    """(principal, host, permission) of the --allow-/--deny- options."""
    out = []
    for principals, hosts, permission in ((args.allow_principal, args.allow_host, AclPermissionType.ALLOW),
                                          (args.deny_principal, args.deny_host, AclPermissionType.DENY)):
        for principal in principals or ():
            for host in hosts or [WILDCARD]:
                out.append((principal, host, permission))
    return out


def _print(bindings: list[AclBinding]) -> None:
    by_resource: dict[tuple[ResourceType, str, PatternType], list[AclBinding]] = {}
    for acl in bindings:
        by_resource.setdefault((acl.resource_type, acl.name, acl.pattern_type), []).append(acl)
    for (kind, name, pattern), acls in by_resource.items():
        sys.stdout.write(f"Current ACLs for resource `ResourcePattern(resourceType={kind.name}, name={name}, "
                         f"patternType={pattern.name})`:\n")
        for acl in acls:
            sys.stdout.write(f" \t(principal={acl.principal}, host={acl.host}, operation={acl.operation.name}, "
                             f"permissionType={acl.permission.name})\n")
        sys.stdout.write("\n")


def main(argv: Sequence[str] | None = None, prog: str = "logstore acls") -> int:
    """``logstore acls list|add|remove ROOT [options]`` (see the module docstring); 0 on
    success, 1 on an error (said on standard error), 2 on bad usage."""
    parser = argparse.ArgumentParser(prog=prog, description="Manage the ACLs of a store served with "
                                     "'logstore serve --authorizer' (Kafka's kafka-acls).")
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, text in (("list", "print the ACLs (of the resources named, else all)"),
                       ("add", "add ACLs: each principal x host x operation x resource"),
                       ("remove", "remove the ACLs matching the options")):
        p = sub.add_parser(name, help=text)
        p.add_argument("root", help="the store's directory")
        p.add_argument("--topic", action="append", metavar="NAME")
        p.add_argument("--group", action="append", metavar="NAME")
        p.add_argument("--transactional-id", action="append", metavar="ID")
        p.add_argument("--delegation-token", action="append", metavar="ID")
        p.add_argument("--user-principal", action="append", metavar="PRINCIPAL")
        p.add_argument("--cluster", action="store_true", help="the cluster resource (kafka-cluster)")
        p.add_argument("--resource-pattern-type", type=_pattern, metavar="TYPE",
                       help="literal (the default of add and remove), prefixed, any or match (list's default: any)")
        p.add_argument("--operation", action="append", type=_operation, metavar="OP",
                       help="Read, Write, Create, Delete, Alter, Describe, ClusterAction, DescribeConfigs, "
                            "AlterConfigs, IdempotentWrite, CreateTokens, DescribeTokens, All")
        if name == "list":
            p.add_argument("--principal", action="append", metavar="PRINCIPAL", help="only the ACLs of these")
        else:
            p.add_argument("--allow-principal", action="append", metavar="PRINCIPAL", help="User:NAME or User:*")
            p.add_argument("--deny-principal", action="append", metavar="PRINCIPAL")
            p.add_argument("--allow-host", action="append", metavar="HOST", help="default: * (every host)")
            p.add_argument("--deny-host", action="append", metavar="HOST")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    resources = _resources(args)
    try:
        authorizer = Authorizer(AclFile(args.root))
        if args.action == "list":
            pattern = args.resource_pattern_type or PatternType.ANY
            filters = [AclBindingFilter(kind, name, pattern, principal)
                       for kind, name in resources or [(ResourceType.ANY, None)]  # type: ignore[list-item]
                       for principal in args.principal or [None]]
            seen: dict[AclBinding, None] = {}
            for f in filters:
                seen.update(dict.fromkeys(authorizer.describe(f)))
            _print(sorted(seen))
            return 0
        entries = _entries(args)
        operations = args.operation or ([AclOperation.ANY] if args.action == "remove" else [])
        pattern = args.resource_pattern_type or PatternType.LITERAL
        if not resources:
            sys.stderr.write(f"{prog}: name a resource (--topic, --group, --transactional-id, --cluster, ...)\n")
            return 2
        if args.action == "add":
            if not entries or not operations:
                sys.stderr.write(f"{prog}: add needs --allow-principal or --deny-principal, and --operation\n")
                return 2
            bindings = [AclBinding(kind, name, pattern, principal, host, op, permission)
                        for kind, name in resources for principal, host, permission in entries for op in operations]
            authorizer.create(bindings)
            _print(sorted(bindings))
            return 0
        filters = [AclBindingFilter(kind, name, pattern, principal, host, op, permission)
                   for kind, name in resources
                   for principal, host, permission in entries or [(None, None, AclPermissionType.ANY)]  # type: ignore[list-item]
                   for op in operations]
        removed = sorted({acl for found in authorizer.delete(filters) for acl in found})
        if not removed:
            sys.stderr.write(f"{prog}: no ACL matched\n")
            return 1
        _print(removed)
        return 0
    except (AclError, LogstoreError, OSError) as exc:
        sys.stderr.write(f"{prog}: {exc}\n")
        return 1
