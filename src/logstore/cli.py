"""The ``logstore`` command (also ``python -m logstore``).

Subcommands so far: ``node`` runs one replication node (see :func:`logstore.replication.main`).
The operator tools (dump, verify, recover, stats, produce, consume, topics) join it here.
"""

from __future__ import annotations

import sys

__all__ = ["main"]

_USAGE = """usage: logstore COMMAND [ARGS...]

commands:
  node     run one replica node of a replica set (logstore node --help)
"""


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``logstore`` console script; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        sys.stderr.write(_USAGE)
        return 2
    if args[0] in ("-h", "--help"):
        sys.stdout.write(_USAGE)
        return 0
    command, rest = args[0], args[1:]
    if command == "node":
        from .replication import main as node_main

        return node_main(rest, prog="logstore node")
    sys.stderr.write(f"logstore: unknown command {command!r}\n\n{_USAGE}")
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
