"""``raftkv lease grant|revoke|keep-alive|timetolive|list``: leases, over ``kvserver.client``.

Same common options as the other client commands (``--endpoints``, ``--timeout``, ``--json``;
see ``kvserver.cli.client``). Lease IDs are printed as etcdctl prints them, 16 hex digits (with
``0x`` in front in the rare case those digits are all decimal, so a printed ID always reads
back the same), and taken in hex (``0x``-prefixed or with a hex letter) or decimal
(``kvserver.client.leases.parse_lease_id``).

* ``lease grant TTL [--id ID]`` — ``lease 694d5765fc71500b granted with TTL(10s)``.
* ``lease revoke ID`` — ``lease 694d5765fc71500b revoked``; its keys are deleted.
* ``lease keep-alive ID [--once]`` — refreshes the lease every TTL/3 and prints
  ``lease 694d5765fc71500b keepalived with TTL(10)`` after each refresh, until interrupted
  (Ctrl-C: exit status 130) or the lease is lost (``Error: ...``, exit 1). ``--once``: one
  refresh, then exit. Refreshes fail over between the endpoints.
* ``lease timetolive ID [--keys]`` — ``lease 694d5765fc71500b granted with TTL(10s),
  remaining(8s)`` (``, attached keys([k1 k2])`` with ``--keys``); a lease that does not exist
  prints ``lease 694d5765fc71500b already expired`` and exits 1.
* ``lease list`` — ``found N leases`` and one ID per line.

JSON output (one document; for ``keep-alive`` one line per refresh): integers as numbers,
IDs also as ``id_hex``; ``{"id", "id_hex", "ttl_s", "revision", "header"}`` (grant),
``{"id", "id_hex", "revoked": true, "revision", "header"}`` (revoke), ``{"id", "id_hex",
"ttl_s"}`` (each keep-alive), ``{"id", "id_hex", "ttl_s", "granted_ttl_s", "expired",
"keys", "revision", "header"}`` (timetolive; keys as text, or base64 objects ``{"key",
"encoding": "base64"}`` when not UTF-8), ``{"ids", "ids_hex", "revision", "header"}`` (list).

Exit status: 0 success, 1 failure (``Error: ...`` on stderr; e.g. ``requested lease not
found``), 2 bad usage, 130 interrupted.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from typing import Any, TextIO

from kvserver.cli.client import (
    _common_options,
    _dumps,
    _lease_id,
    _non_negative,
    _run,
    _text,
    header_to_json,
)
from kvserver.client import AsyncClient, Lease, LeaseList, LeaseRevokeResult, LeaseTimeToLive
from kvserver.client.leases import format_lease_id


def register(sub) -> None:
    common = _common_options()
    lease = sub.add_parser("lease", help="grant, revoke, keep alive, inspect or list leases")
    lsub = lease.add_subparsers(dest="lease_command", metavar="SUBCOMMAND")
    lsub.required = True

    p = lsub.add_parser("grant", parents=[common], help="grant a lease of TTL seconds")
    p.add_argument("ttl", type=_non_negative, metavar="TTL", help="time to live, in seconds")
    p.add_argument(
        "--id",
        type=_lease_id,
        default=0,
        metavar="ID",
        help="the lease ID to use (hex or decimal; default: the server chooses)",
    )
    p.set_defaults(func=cmd_grant)

    p = lsub.add_parser("revoke", parents=[common], help="revoke a lease (its keys are deleted)")
    p.add_argument("lease_id", type=_lease_id, metavar="ID", help="lease ID (hex or decimal)")
    p.set_defaults(func=cmd_revoke)

    p = lsub.add_parser(
        "keep-alive",
        aliases=["keepalive"],
        parents=[common],
        help="keep a lease alive until interrupted",
    )
    p.add_argument("lease_id", type=_lease_id, metavar="ID", help="lease ID (hex or decimal)")
    p.add_argument("--once", action="store_true", help="refresh once, then exit")
    p.set_defaults(func=cmd_keep_alive)

    p = lsub.add_parser(
        "timetolive", parents=[common], help="a lease's remaining and granted TTL (and its keys)"
    )
    p.add_argument("lease_id", type=_lease_id, metavar="ID", help="lease ID (hex or decimal)")
    p.add_argument("--keys", action="store_true", help="also list the keys attached to it")
    p.set_defaults(func=cmd_time_to_live)

    p = lsub.add_parser("list", parents=[common], help="every lease's ID")
    p.set_defaults(func=cmd_list)


# ---------------------------------------------------------------------------------------------
# Commands


def cmd_grant(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out = out or sys.stdout

    async def body(client: AsyncClient) -> int:
        out.write(render_grant(await client.lease_grant(args.ttl, args.id), as_json=args.json))
        return 0

    return _run(args, body, out, err)


def cmd_revoke(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out = out or sys.stdout

    async def body(client: AsyncClient) -> int:
        result = await client.lease_revoke(args.lease_id)
        out.write(render_revoke(args.lease_id, result, as_json=args.json))
        return 0

    return _run(args, body, out, err)


def cmd_keep_alive(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out = out or sys.stdout

    def show(ttl_s: int) -> None:
        out.write(render_keepalive(args.lease_id, ttl_s, as_json=args.json))
        out.flush()  # one line per refresh, at once, also into a pipe

    async def body(client: AsyncClient) -> int:
        if args.once:
            show(await client.lease_keepalive_once(args.lease_id))
            return 0
        async with client.keep_alive(args.lease_id, on_refresh=show) as keepalive:
            await keepalive.wait()  # until Ctrl-C, or raises when the lease is lost
        return 0

    try:
        return _run(args, body, out, err)
    except KeyboardInterrupt:
        return 130


def cmd_time_to_live(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out = out or sys.stdout

    async def body(client: AsyncClient) -> int:
        result = await client.lease_time_to_live(args.lease_id, keys=args.keys)
        out.write(render_time_to_live(args.lease_id, result, as_json=args.json, keys=args.keys))
        return 1 if result.expired else 0

    return _run(args, body, out, err)


def cmd_list(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout

    async def body(client: AsyncClient) -> int:
        out.write(render_list(await client.lease_leases(), as_json=args.json))
        return 0

    return _run(args, body, out, err)


# ---------------------------------------------------------------------------------------------
# Rendering (pure functions: result -> text)


def _ids(lease_id: int) -> dict[str, Any]:
    return {"id": lease_id, "id_hex": format_lease_id(lease_id)}


def _key_to_json(key: bytes) -> Any:
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return {"key": base64.b64encode(key).decode(), "encoding": "base64"}


def render_grant(lease: Lease, *, as_json: bool) -> str:
    if as_json:
        return _dumps(
            {
                **_ids(lease.id),
                "ttl_s": lease.ttl_s,
                "revision": lease.revision,
                "header": header_to_json(lease.header),
            }
        )
    return f"lease {format_lease_id(lease.id)} granted with TTL({lease.ttl_s}s)\n"


def render_revoke(lease_id: int, result: LeaseRevokeResult, *, as_json: bool) -> str:
    if as_json:
        return _dumps(
            {
                **_ids(lease_id),
                "revoked": True,
                "revision": result.revision,
                "header": header_to_json(result.header),
            }
        )
    return f"lease {format_lease_id(lease_id)} revoked\n"


def render_keepalive(lease_id: int, ttl_s: int, *, as_json: bool) -> str:
    if as_json:
        return json.dumps({**_ids(lease_id), "ttl_s": ttl_s}, separators=(",", ":")) + "\n"
    return f"lease {format_lease_id(lease_id)} keepalived with TTL({ttl_s})\n"


def render_time_to_live(
    lease_id: int, result: LeaseTimeToLive, *, as_json: bool, keys: bool = False
) -> str:
    if as_json:
        return _dumps(
            {
                **_ids(lease_id),
                "ttl_s": result.ttl_s,
                "granted_ttl_s": result.granted_ttl_s,
                "expired": result.expired,
                "keys": [_key_to_json(k) for k in result.keys],
                "revision": result.revision,
                "header": header_to_json(result.header),
            }
        )
    name = format_lease_id(lease_id)
    if result.expired:
        return f"lease {name} already expired\n"
    text = f"lease {name} granted with TTL({result.granted_ttl_s}s), remaining({result.ttl_s}s)"
    if keys:
        text += f", attached keys([{' '.join(_text(k) for k in result.keys)}])"
    return text + "\n"


def render_list(result: LeaseList, *, as_json: bool) -> str:
    if as_json:
        return _dumps(
            {
                "ids": list(result.ids),
                "ids_hex": [format_lease_id(i) for i in result.ids],
                "revision": result.revision,
                "header": header_to_json(result.header),
            }
        )
    noun = "lease" if len(result.ids) == 1 else "leases"
    return f"found {len(result.ids)} {noun}\n" + "".join(
        format_lease_id(i) + "\n" for i in result.ids
    )
