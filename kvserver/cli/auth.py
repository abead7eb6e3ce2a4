"""``raftkv user|role|auth ...``: etcd v3 auth management, etcdctl's commands and argument
shapes, over ``AsyncClient.auth_request`` (``POST /v3/auth/...``, see ``kvserver.api.http.auth``).

Same common options as the other client commands (``--endpoints``, ``--timeout``, ``--json``,
``--cacert/--cert/--key``, ``--user NAME[:PASSWORD]``; see ``kvserver.cli.client``). With auth
enabled every command but ``auth status`` needs a user holding the ``root`` role.

* ``user add NAME[:PASSWORD] [--new-user-password PW]``, ``user get NAME [--detail]``,
  ``user list``, ``user delete NAME``, ``user passwd NAME [--new-user-password PW]``,
  ``user grant-role NAME ROLE``, ``user revoke-role NAME ROLE``. A new password not given is
  asked twice on the terminal; without a terminal that is an error (scripts pass it).
* ``role add|get|delete ROLE``, ``role list``,
  ``role grant-permission ROLE read|write|readwrite KEY [RANGE_END] [--prefix|--from-key]``,
  ``role revoke-permission ROLE KEY [RANGE_END] [--prefix|--from-key]``. ``--prefix``: every key
  starting with KEY; ``--from-key``: every key >= KEY (RANGE_END ``\\0``).
* ``auth enable``, ``auth disable``, ``auth status``.

Output: etcdctl's sentences and human tables by default; ``--json`` prints the server's answer
(etcd's gateway document: keys base64, as ``etcdctl -w json``). Exit status: 0 success,
1 failure (``Error: ...`` on stderr, nothing changed), 2 bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import getpass
import sys
from collections.abc import Callable
from typing import Any, TextIO

from kvserver.cli.client import (
    PASSWORD_ENV,
    USER_ENV,
    TLSFiles,
    _common_options,
    _dumps,
    _run,
    _text,
    auth_options_from,
    table,
)
from kvserver.client import AsyncClient
from kvserver.client.txn import key_range

PERM_TYPES = {"read": "READ", "write": "WRITE", "readwrite": "READWRITE"}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _unb64(text: Any) -> bytes:
    return base64.b64decode(text) if isinstance(text, str) and text else b""


def _perm_type(text: str) -> str:
    try:
        return PERM_TYPES[text.lower()]
    except KeyError:
        raise argparse.ArgumentTypeError(f"want read, write or readwrite, got {text!r}") from None


def register(sub) -> None:
    common = _common_options()

    u = sub.add_parser(
        "user", help="etcd v3 auth users: add, get, list, delete, passwd, grant-role, revoke-role"
    )
    usub = u.add_subparsers(dest="user_command", metavar="SUBCOMMAND")
    usub.required = True
    p = usub.add_parser("add", parents=[common], help="add a user")
    p.add_argument("name", metavar="NAME[:PASSWORD]")
    p.add_argument(
        "--new-user-password",
        metavar="PASSWORD",
        help="the new user's password (else asked on the terminal)",
    )
    p.set_defaults(func=cmd_user_add)
    p = usub.add_parser("get", parents=[common], help="a user's roles")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--detail", action="store_true", help="show the roles' permissions too")
    p.set_defaults(func=cmd_user_get)
    p = usub.add_parser("list", parents=[common], help="every user")
    p.set_defaults(func=_simple("user/list", None, "users"))
    p = usub.add_parser("delete", parents=[common], help="delete a user")
    p.add_argument("name", metavar="NAME")
    p.set_defaults(
        func=_simple("user/delete", lambda a: {"name": a.name}, lambda a: f"User {a.name} deleted")
    )
    p = usub.add_parser("passwd", parents=[common], help="change a user's password")
    p.add_argument("name", metavar="NAME")
    p.add_argument(
        "--new-user-password",
        metavar="PASSWORD",
        help="the new password (else asked on the terminal)",
    )
    p.set_defaults(func=cmd_user_passwd)
    p = usub.add_parser("grant-role", parents=[common], help="grant a role to a user")
    p.add_argument("name", metavar="NAME")
    p.add_argument("role", metavar="ROLE")
    p.set_defaults(
        func=_simple(
            "user/grant",
            lambda a: {"user": a.name, "role": a.role},
            lambda a: f"Role {a.role} is granted to user {a.name}",
        )
    )
    p = usub.add_parser("revoke-role", parents=[common], help="revoke a role from a user")
    p.add_argument("name", metavar="NAME")
    p.add_argument("role", metavar="ROLE")
    p.set_defaults(
        func=_simple(
            "user/revoke",
            lambda a: {"name": a.name, "role": a.role},
            lambda a: f"Role {a.role} is revoked from user {a.name}",
        )
    )

    r = sub.add_parser(
        "role",
        help="etcd v3 auth roles: add, get, list, delete, grant-permission, revoke-permission",
    )
    rsub = r.add_subparsers(dest="role_command", metavar="SUBCOMMAND")
    rsub.required = True
    p = rsub.add_parser("add", parents=[common], help="add a role")
    p.add_argument("role", metavar="ROLE")
    p.set_defaults(
        func=_simple("role/add", lambda a: {"name": a.role}, lambda a: f"Role {a.role} created")
    )
    p = rsub.add_parser("get", parents=[common], help="a role's permissions")
    p.add_argument("role", metavar="ROLE")
    p.set_defaults(func=cmd_role_get)
    p = rsub.add_parser("list", parents=[common], help="every role")
    p.set_defaults(func=_simple("role/list", None, "roles"))
    p = rsub.add_parser("delete", parents=[common], help="delete a role")
    p.add_argument("role", metavar="ROLE")
    p.set_defaults(
        func=_simple("role/delete", lambda a: {"role": a.role}, lambda a: f"Role {a.role} deleted")
    )
    p = rsub.add_parser(
        "grant-permission", parents=[common], help="grant a key (range) permission to a role"
    )
    p.add_argument("role", metavar="ROLE")
    p.add_argument("perm_type", type=_perm_type, metavar="read|write|readwrite")
    _range_arguments(p)
    p.set_defaults(func=cmd_role_grant)
    p = rsub.add_parser(
        "revoke-permission", parents=[common], help="revoke a key (range) permission from a role"
    )
    p.add_argument("role", metavar="ROLE")
    _range_arguments(p)
    p.set_defaults(func=cmd_role_revoke)

    a = sub.add_parser("auth", help="enable, disable or show etcd v3 authentication")
    asub = a.add_subparsers(dest="auth_command", metavar="SUBCOMMAND")
    asub.required = True
    p = asub.add_parser(
        "enable",
        parents=[common],
        help="enable authentication (needs a root user with the root role)",
    )
    p.set_defaults(func=_simple("enable", None, lambda a: "Authentication Enabled"))
    p = asub.add_parser("disable", parents=[common], help="disable authentication")
    p.set_defaults(func=_simple("disable", None, lambda a: "Authentication Disabled"))
    p = asub.add_parser("status", parents=[common], help="whether authentication is enabled")
    p.set_defaults(func=cmd_auth_status)


def add_user_options(p: argparse.ArgumentParser) -> None:
    """``--user NAME[:PASSWORD]``/``--password`` for commands that do not take the common
    client options (``snapshot save``)."""
    p.add_argument(
        "--user",
        dest="auth_user",
        metavar="NAME[:PASSWORD]",
        help=f"authenticate as this user (default ${USER_ENV})",
    )
    p.add_argument(
        "--password",
        dest="auth_password",
        metavar="PASSWORD",
        help=f"the user's password (default ${PASSWORD_ENV})",
    )


def auth_header(
    endpoint: str, args: argparse.Namespace, *, timeout_s: float = 5.0, tls: TLSFiles | None = None
) -> dict[str, str]:
    """``{"Authorization": token}`` for ``--user`` at ``endpoint`` (``{}`` without ``--user``
    or when the cluster has auth disabled)."""
    creds = auth_options_from(args)
    if not creds:
        return {}

    async def go() -> dict[str, str]:
        files = tls or TLSFiles(ca_file=None, cert_file=None, key_file=None)
        async with AsyncClient(
            endpoint,
            timeout_s=timeout_s,
            ca_file=files["ca_file"] or None,
            cert_file=files["cert_file"] or None,
            key_file=files["key_file"] or None,
            **creds,
        ) as client:
            return await client.auth_headers()

    return asyncio.run(go())


def _range_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("key", metavar="KEY")
    p.add_argument(
        "range_end",
        nargs="?",
        metavar="RANGE_END",
        help="the end of the range [KEY, RANGE_END) (default: KEY alone)",
    )
    group = p.add_mutually_exclusive_group()
    group.add_argument("--prefix", action="store_true", help="every key starting with KEY")
    group.add_argument("--from-key", action="store_true", help="every key >= KEY")


def _key_range(args: argparse.Namespace) -> tuple[bytes, bytes]:
    if (args.prefix or args.from_key) and args.range_end is not None:
        raise ValueError("give RANGE_END or --prefix/--from-key, not both")
    if args.from_key:
        return args.key.encode(), b"\0"
    if args.prefix and not args.key:
        return b"", b"\0"  # every key, as etcdctl's `--prefix ""`
    return key_range(args.key, args.range_end, args.prefix)


# --- running ------------------------------------------------------------------------------------

Out = TextIO | None


def _call(
    args: argparse.Namespace,
    steps: Callable[[AsyncClient], Any],
    render: Callable[[Any], str],
    out: Out = None,
    err: Out = None,
) -> int:
    """Run ``steps(client)`` (the last answer document it returns is rendered)."""
    out = out or sys.stdout

    async def body(client: AsyncClient) -> int:
        doc = await steps(client)
        out.write(_dumps(doc) if args.json else render(doc))
        return 0

    try:
        return _run(args, body, out, err)
    except ValueError as exc:
        (err or sys.stderr).write(f"Error: {exc}\n")
        return 1


def _simple(
    op: str,
    payload: Callable[[argparse.Namespace], dict] | None,
    message: str | Callable[[argparse.Namespace], str],
) -> Callable[..., int]:
    """A command that sends one request; prints ``message(args)`` or the list field named
    ``message`` (one name a line)."""

    def cmd(args: argparse.Namespace, out: Out = None, err: Out = None) -> int:
        def render(doc: Any) -> str:
            if isinstance(message, str):
                return "".join(f"{name}\n" for name in doc.get(message, []))
            return message(args) + "\n"

        return _call(
            args, lambda c: c.auth_request(op, payload(args) if payload else None), render, out, err
        )

    return cmd


def _new_password(
    args: argparse.Namespace, name: str, inline: str | None, stdin: TextIO | None = None
) -> str:
    given = inline if inline is not None else args.new_user_password
    if given is not None:
        return given
    stdin = stdin or sys.stdin
    if not stdin.isatty():
        raise ValueError(
            f"no password for user {name} (give {name}:PASSWORD or "
            "--new-user-password; stdin is not a terminal to ask it)"
        )
    first = getpass.getpass(f"Password of {name}: ")
    if getpass.getpass("Type password again for confirmation: ") != first:
        raise ValueError("the two passwords differ")
    return first


def cmd_user_add(args: argparse.Namespace, out: Out = None, err: Out = None) -> int:
    name, sep, inline = args.name.partition(":")
    try:
        if sep and args.new_user_password is not None:
            raise ValueError("give the password in NAME:PASSWORD or --new-user-password, not both")
        password = _new_password(args, name, inline if sep else None)
    except ValueError as exc:
        (err or sys.stderr).write(f"Error: {exc}\n")
        return 1
    return _call(
        args,
        lambda c: c.auth_request("user/add", {"name": name, "password": password}),
        lambda doc: f"User {name} created\n",
        out,
        err,
    )


def cmd_user_passwd(args: argparse.Namespace, out: Out = None, err: Out = None) -> int:
    try:
        password = _new_password(args, args.name, None)
    except ValueError as exc:
        (err or sys.stderr).write(f"Error: {exc}\n")
        return 1
    return _call(
        args,
        lambda c: c.auth_request("user/changepw", {"name": args.name, "password": password}),
        lambda doc: "Password updated\n",
        out,
        err,
    )


def perms_of(doc: Any) -> list[tuple[str, bytes, bytes]]:
    """(READ|WRITE|READWRITE, key, range_end) of a ``role/get`` answer."""
    return [
        (p.get("permType", "READ"), _unb64(p.get("key")), _unb64(p.get("range_end")))
        for p in doc.get("perm", [])
    ]


def _range_text(key: bytes, range_end: bytes) -> str:
    if not range_end:
        return _text(key)
    if range_end == b"\0":
        return f"[{_text(key)}, <end>)" if key else "every key"
    try:
        if key and key_range(key, None, True)[1] == range_end:
            return f"[{_text(key)}, {_text(range_end)}) (prefix {_text(key)})"
    except ValueError:
        pass
    return f"[{_text(key)}, {_text(range_end)})"


def _perm_table(perms: list[tuple[str, bytes, bytes]]) -> str:
    if not perms:
        return "(no permissions)\n"
    return table(["PERMISSION", "KEYS"], [(t, _range_text(k, e)) for t, k, e in perms])


def cmd_role_get(args: argparse.Namespace, out: Out = None, err: Out = None) -> int:
    return _call(
        args,
        lambda c: c.auth_request("role/get", {"role": args.role}),
        lambda doc: f"Role {args.role}\n" + _perm_table(perms_of(doc)),
        out,
        err,
    )


def cmd_user_get(args: argparse.Namespace, out: Out = None, err: Out = None) -> int:
    async def steps(c: AsyncClient) -> Any:
        doc = await c.auth_request("user/get", {"name": args.name})
        if args.detail:
            doc["rolePerms"] = {
                role: (await c.auth_request("role/get", {"role": role})).get("perm", [])
                for role in doc.get("roles", [])
            }
        return doc

    def render(doc: Any) -> str:
        roles = doc.get("roles", [])
        text = f"User: {args.name}\nRoles: {' '.join(roles)}\n"
        for role in roles if args.detail else ():
            text += f"\nRole {role}\n" + _perm_table(perms_of({"perm": doc["rolePerms"][role]}))
        return text

    return _call(args, steps, render, out, err)


def cmd_role_grant(args: argparse.Namespace, out: Out = None, err: Out = None) -> int:
    def steps(c: AsyncClient) -> Any:
        key, end = _key_range(args)
        perm: dict[str, Any] = {"permType": args.perm_type, "key": _b64(key)}
        if end:
            perm["range_end"] = _b64(end)
        return c.auth_request("role/grant", {"name": args.role, "perm": perm})

    return _call(args, steps, lambda doc: f"Role {args.role} updated\n", out, err)


def cmd_role_revoke(args: argparse.Namespace, out: Out = None, err: Out = None) -> int:
    def steps(c: AsyncClient) -> Any:
        key, end = _key_range(args)
        body = {"role": args.role, "key": _b64(key)}
        if end:
            body["range_end"] = _b64(end)
        return c.auth_request("role/revoke", body)

    return _call(
        args,
        steps,
        lambda doc: (
            f"Permission of range {_range_text(*_key_range(args))} is "
            f"revoked from role {args.role}\n"
        ),
        out,
        err,
    )


def cmd_auth_status(args: argparse.Namespace, out: Out = None, err: Out = None) -> int:
    return _call(
        args,
        lambda c: c.auth_request("status"),
        lambda doc: (
            f"Authentication Status: {str(bool(doc.get('enabled'))).lower()}\n"
            f"AuthRevision: {doc.get('authRevision', 0)}\n"
        ),
        out,
        err,
    )
