"""The ``raftkv`` command line: one entry point, subcommands registered by small modules.

Each command module exposes ``register(subparsers)`` which adds its parser(s) and sets
``func`` (called with the parsed args; its return value is the exit status).
Human tables by default; ``--json`` where a command prints data.
"""

import argparse
import sys

from kvserver.cli import (
    alarm,
    archive,
    auth,
    bench,
    client,
    lease,
    member,
    server,
    snapshot,
    wal,
    watch,
)

_COMMAND_MODULES = (
    server,
    client,
    watch,
    lease,
    member,
    alarm,
    auth,
    wal,
    bench,
    snapshot,
    archive,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raftkv",
        description="raftkv: a Raft-replicated key-value store with an etcd-compatible API.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module in _COMMAND_MODULES:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `raftkv wal dump DIR | head`
        return 0


if __name__ == "__main__":
    sys.exit(main())
