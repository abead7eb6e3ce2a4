"""``raftkv member list|add|remove|promote``: cluster membership, over ``kvserver.client``.

Same common options as the other client commands (``--endpoints``, ``--timeout``, ``--json``;
see ``kvserver.cli.client``). Member IDs are printed and taken in hexadecimal, as etcdctl
does.

* ``member list`` — a table: ID, status (``started`` once the member has published its name,
  else ``unstarted``), name, peer URLs, client URLs, learner?
* ``member add NAME --peer-urls URL[,URL] [--learner]`` — adds the member and prints its ID and
  the flags to start it with (``--initial-cluster`` of every member, and
  ``--initial-cluster-state existing``). NAME only goes into those flags (the member publishes
  its name itself once it runs), as with etcdctl.
* ``member remove ID`` — removes the member; it stops serving.
* ``member promote ID`` — makes a learner a voter (refused until it has caught up).

JSON output: ``{"header": {...}, "member": {...}?, "members": [...]}`` with integer IDs.
Exit status: 0 success, 1 failure (``Error: ...`` on stderr), 2 bad usage.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from kvserver.cli.client import _common_options, _dumps, _run, header_to_json, table
from kvserver.client import AsyncClient
from kvserver.client.members import parse_member_id
from kvserver.client.types import Member


def _member_id(text: str) -> int:
    try:
        return parse_member_id(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _urls(text: str) -> list[str]:
    urls = [u.strip() for u in text.split(",") if u.strip()]
    if not urls:
        raise argparse.ArgumentTypeError("no URL given")
    return urls


def register(sub) -> None:
    common = _common_options()
    m = sub.add_parser("member", help="list, add, remove or promote cluster members")
    msub = m.add_subparsers(dest="member_command", metavar="SUBCOMMAND")
    msub.required = True

    p = msub.add_parser("list", parents=[common], help="the cluster's members")
    p.set_defaults(func=cmd_list)

    p = msub.add_parser("add", parents=[common], help="add a member (start it afterwards)")
    p.add_argument("name", metavar="NAME", help="the new member's --name (for the hint)")
    p.add_argument(
        "--peer-urls",
        type=_urls,
        required=True,
        metavar="URLS",
        help="the new member's peer URLs, comma-separated",
    )
    p.add_argument(
        "--learner", action="store_true", help="add it as a learner (non-voting until promoted)"
    )
    p.set_defaults(func=cmd_add)

    p = msub.add_parser("remove", parents=[common], help="remove a member for good")
    p.add_argument("member_id", type=_member_id, metavar="ID", help="member ID (hex)")
    p.set_defaults(func=cmd_remove)

    p = msub.add_parser("promote", parents=[common], help="make a learner a voter")
    p.add_argument("member_id", type=_member_id, metavar="ID", help="member ID (hex)")
    p.set_defaults(func=cmd_promote)


def member_to_json(m: Member) -> dict[str, Any]:
    return {
        "id": m.id,
        "name": m.name,
        "peer_urls": list(m.peer_urls),
        "client_urls": list(m.client_urls),
        "is_learner": m.is_learner,
    }


def render_members(members, *, as_json: bool, header=None, member=None) -> str:
    if as_json:
        doc: dict[str, Any] = {}
        if header is not None:
            doc["header"] = header_to_json(header)
        if member is not None:
            doc["member"] = member_to_json(member)
        doc["members"] = [member_to_json(m) for m in members]
        return _dumps(doc)
    rows = [
        [
            f"{m.id:x}",
            "started" if m.name else "unstarted",
            m.name,
            ",".join(m.peer_urls),
            ",".join(m.client_urls),
            str(m.is_learner).lower(),
        ]
        for m in members
    ]
    return table(["ID", "STATUS", "NAME", "PEER ADDRS", "CLIENT ADDRS", "IS LEARNER"], rows)


def join_hint(name: str, member: Member, members) -> str:
    """The flags to start the new member with (etcdctl prints ETCD_* variables)."""
    parts = []
    for m in members:
        label = name if m.id == member.id else m.name
        if not label:
            continue  # another member that has not started: its name is not known yet
        parts += [f"{label}={u}" for u in m.peer_urls]
    return (
        f"  --name {name} --initial-advertise-peer-urls {','.join(member.peer_urls)} \\\n"
        f"  --initial-cluster {','.join(parts)} \\\n"
        f"  --initial-cluster-state existing\n"
    )


def cmd_list(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout

    async def body(client: AsyncClient) -> int:
        out.write(render_members(await client.member_list(), as_json=args.json))
        return 0

    return _run(args, body, out, err)


def cmd_add(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout

    async def body(client: AsyncClient) -> int:
        res = await client.member_add(args.peer_urls, is_learner=args.learner)
        if args.json:
            out.write(
                render_members(res.members, as_json=True, header=res.header, member=res.member)
            )
            return 0
        kind = "learner" if res.member.is_learner else "member"
        out.write(
            f"Member {res.member.id:x} added to cluster {res.header.cluster_id:x} as a "
            f"{kind}\n\nStart it with:\n  raftkv serve \\\n"
            + join_hint(args.name, res.member, res.members)
        )
        return 0

    return _run(args, body, out, err)


def cmd_remove(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out = out or sys.stdout

    async def body(client: AsyncClient) -> int:
        res = await client.member_remove(args.member_id)
        if args.json:
            out.write(render_members(res.members, as_json=True, header=res.header))
        else:
            out.write(f"Member {args.member_id:x} removed from cluster {res.header.cluster_id:x}\n")
        return 0

    return _run(args, body, out, err)


def cmd_promote(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out = out or sys.stdout

    async def body(client: AsyncClient) -> int:
        res = await client.member_promote(args.member_id)
        if args.json:
            out.write(render_members(res.members, as_json=True, header=res.header))
        else:
            out.write(f"Member {args.member_id:x} promoted in cluster {res.header.cluster_id:x}\n")
        return 0

    return _run(args, body, out, err)
