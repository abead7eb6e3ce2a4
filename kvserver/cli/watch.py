"""``raftkv watch KEY [--prefix] [--rev N] [--prev-kv] [--json]``: print changes as they happen.

Options shared with the other client commands (``kvserver.cli.client``): ``--endpoints``
(default ``$RAFTKV_ENDPOINTS``, else ``http://127.0.0.1:2379``), ``--timeout`` (each call the
watch makes to find the leader), ``--json``.

Runs until interrupted (Ctrl-C: exit status 130, no traceback) and prints one line per event,
flushed at once so it works in a pipe:

- human (default): ``PUT jobs/1 = running (revision 5)``, ``DELETE jobs/1 (revision 6)``;
  with ``--prev-kv`` the previous value follows: ``PUT jobs/1 = done (revision 7; was
  running)``. Keys and values are shown as text (undecodable bytes escaped, long values cut,
  as ``get`` does in its tables).
- ``--json``: one JSON object per line, ``{"type": "PUT"|"DELETE", "revision": N, "kv":
  {...}, "prev_kv": {...}|null}`` with the key-value objects of ``get --json`` (text, or
  base64 with ``"encoding": "base64"``).

``--rev N`` starts at revision N (history first, then live changes; 0 = from now on). The
watch survives the loss of the member serving it: the client reconnects to another endpoint
and resumes after the last revision printed, so each change is printed once. If the history
it needs has been compacted it stops with ``Error: ... compact revision C`` (exit status 1):
run it again with ``--rev C`` or later. Other failures print ``Error: ...`` and exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, TextIO

from kvserver.cli import client as cli_client
from kvserver.client import AsyncClient, WatchEvent


def register(sub) -> None:
    common = cli_client._common_options()
    w = sub.add_parser(
        "watch", parents=[common], help="print changes to a key (or a prefix) as they happen"
    )
    w.add_argument("key", metavar="KEY")
    w.add_argument("--prefix", action="store_true", help="every key starting with KEY")
    w.add_argument(
        "--rev",
        type=cli_client._non_negative,
        default=0,
        metavar="N",
        help="start at revision N, replaying history (0 = from now on)",
    )
    w.add_argument("--prev-kv", action="store_true", help="also show each key's previous value")
    w.set_defaults(func=cmd_watch)


def event_to_json(ev: WatchEvent) -> dict[str, Any]:
    return {
        "type": ev.type.name,
        "revision": ev.revision,
        "kv": cli_client.kv_to_json(ev.kv),
        "prev_kv": cli_client.kv_to_json(ev.prev_kv) if ev.prev_kv is not None else None,
    }


def render_event(ev: WatchEvent, *, as_json: bool) -> str:
    if as_json:
        return json.dumps(event_to_json(ev), ensure_ascii=False, separators=(",", ":")) + "\n"
    key = cli_client._text(ev.key)
    what = f"PUT {key} = {cli_client._text(ev.value)}" if ev.is_put else f"DELETE {key}"
    tail = f"revision {ev.revision}"
    if ev.prev_kv is not None:
        tail += f"; was {cli_client._text(ev.prev_kv.value)}"
    return f"{what} ({tail})\n"


def cmd_watch(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out = out or sys.stdout

    async def body(client: AsyncClient) -> int:
        watch = client.watch(
            os.fsencode(args.key), prefix=args.prefix, start_revision=args.rev, prev_kv=args.prev_kv
        )
        async with watch:
            async for ev in watch:
                out.write(render_event(ev, as_json=args.json))
                out.flush()
        return 0

    try:
        return cli_client._run(args, body, out, err)
    except KeyboardInterrupt:
        return 130
