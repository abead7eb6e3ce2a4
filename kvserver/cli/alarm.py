"""``raftkv alarm list|disarm``: the cluster's alarms (etcdctl's ``alarm`` commands), over
``kvserver.client``.

Same common options as the other client commands (``--endpoints``, ``--timeout``, ``--json``;
see ``kvserver.cli.client``). Member IDs are printed and taken in hexadecimal.

* ``alarm list`` — a table of the raised alarms: member ID, alarm (``NOSPACE``: the member
  found the store over ``--quota-backend-bytes``; ``CORRUPT``). ``(no alarms)`` when none.
* ``alarm disarm [--member ID] [--alarm NOSPACE|CORRUPT]`` — clears one alarm, or every raised
  alarm when neither is given (etcdctl's ``alarm disarm``); prints what it cleared. Free space
  first (delete keys, then ``raftkv``'s compaction): a put that still finds the store over
  its quota raises the alarm again.

JSON output: ``{"header": {...}, "alarms": [{"member_id", "member_id_hex", "alarm"}]}``.
Exit status: 0 success, 1 failure (``Error: ...`` on stderr), 2 bad usage.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

from kvserver.cli.client import _common_options, _dumps, _run, header_to_json, table
from kvserver.client import AsyncClient
from kvserver.client.alarms import AlarmResult, parse_alarm_type
from kvserver.client.members import parse_member_id
from kvserver.kvpb.alarm import AlarmType


def _member_id(text: str) -> int:
    try:
        return parse_member_id(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _alarm(text: str) -> AlarmType:
    try:
        return parse_alarm_type(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def register(sub) -> None:
    common = _common_options()
    a = sub.add_parser("alarm", help="list or disarm the cluster's alarms (space quota)")
    asub = a.add_subparsers(dest="alarm_command", metavar="SUBCOMMAND")
    asub.required = True

    p = asub.add_parser("list", parents=[common], help="the raised alarms")
    p.set_defaults(func=cmd_list)

    p = asub.add_parser("disarm", parents=[common], help="clear an alarm (all of them by default)")
    p.add_argument("--member", type=_member_id, default=0, metavar="ID", help="member ID (hex)")
    p.add_argument(
        "--alarm", type=_alarm, default=AlarmType.NONE, metavar="TYPE", help="NOSPACE or CORRUPT"
    )
    p.set_defaults(func=cmd_disarm)


def render_alarms(result: AlarmResult, *, as_json: bool, empty: str) -> str:
    if as_json:
        doc: dict[str, Any] = {
            "header": header_to_json(result.header),
            "alarms": [
                {
                    "member_id": a.member_id,
                    "member_id_hex": f"{a.member_id:x}",
                    "alarm": a.alarm.name,
                }
                for a in result.alarms
            ],
        }
        return _dumps(doc)
    if not result.alarms:
        return empty + "\n"
    return table(
        ["MEMBER ID", "ALARM"], [[f"{a.member_id:x}", a.alarm.name] for a in result.alarms]
    )


def cmd_list(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout

    async def body(client: AsyncClient) -> int:
        result = await client.alarm_list()
        out.write(render_alarms(result, as_json=args.json, empty="(no alarms)"))
        return 0

    return _run(args, body, out, err)


def cmd_disarm(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out = out or sys.stdout

    async def body(client: AsyncClient) -> int:
        result = await client.alarm_disarm(args.member, args.alarm)
        out.write(render_alarms(result, as_json=args.json, empty="(no alarm to disarm)"))
        return 0

    return _run(args, body, out, err)
