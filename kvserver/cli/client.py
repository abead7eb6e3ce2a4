"""``raftkv put|get|del|status``: the client commands, over ``kvserver.client``.

Every command takes ``--endpoints URL[,URL...]`` (default ``$RAFTKV_ENDPOINTS``, else
``http://127.0.0.1:2379``), ``--cacert/--cert/--key FILE`` for https endpoints (etcdctl's;
defaults ``$RAFTKV_CACERT/$RAFTKV_CERT/$RAFTKV_KEY``), ``--timeout SECONDS`` (the deadline of
the whole call, retries included; default 5), ``--user NAME[:PASSWORD]`` and ``--password``
(etcd v3 auth, as etcdctl; defaults ``$RAFTKV_USER``/``$RAFTKV_PASSWORD``; no password given:
asked on the terminal, or an error when stdin is not a terminal) and ``--json``. Output is a human table by default (like ``etcdctl -w
table``); ``--json`` prints one JSON document. Keys and values are taken as UTF-8 text.

* ``put KEY [VALUE] [--lease ID] [--prev-kv]`` — VALUE omitted: read from stdin. Prints ``OK``
  and the revision (and the previous key-value with ``--prev-kv``).
* ``get KEY [--prefix] [--limit N] [--rev N] [--serializable] [--keys-only]`` — a table of the
  keys. Exit 1 when a single KEY (no ``--prefix``) does not exist.
* ``del KEY [--prefix]`` — prints how many keys were deleted (0 is not an error).
* ``status`` — one row per endpoint: endpoint, member id (hex, as etcdctl prints it), leader?,
  raft term, raft index, applied index, revision, version, db size, the space quota
  (``--quota-backend-bytes``; the column is there when a member reports it), errors (the
  raised alarms, as etcd prints them: ``memberID:<decimal id> alarm:NOSPACE``; see ``raftkv
  alarm``) (plus ARCHIVE LAG entries and time when a member archives, ``--archive-url``); an
  endpoint that does not answer gets its error in the row, and the exit status is 1.

JSON output: integers as numbers; a key-value as ``{"key", "value", "create_revision",
"mod_revision", "version", "lease"}`` with key and value as text when both are valid UTF-8,
otherwise both base64 and ``"encoding": "base64"``.

Exit status: 0 success; 1 a failure (printed to stderr as ``Error: ...``, no traceback);
2 bad usage (argparse). Lease IDs are taken as ``lease grant`` prints them (hex, e.g.
``2d4fa20f72773001``), ``0x``-prefixed hex, or decimal when all digits are decimal
(``kvserver.client.leases.parse_lease_id``, the one parser of lease IDs).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import getpass
import json
import os
import sys
import unicodedata
from collections.abc import Callable, Sequence
from typing import Any, TextIO, TypedDict

from kvserver.client import (
    DEFAULT_ENDPOINT,
    AsyncClient,
    ClientError,
    DeleteResult,
    EndpointStatus,
    KeyValue,
    PutResult,
    RangeResult,
    ResponseHeader,
)
from kvserver.client.leases import parse_lease_id

ENDPOINTS_ENV = "RAFTKV_ENDPOINTS"
DEFAULT_TIMEOUT_S = 5.0
MAX_STDIN_VALUE_BYTES = 16 * 1024 * 1024  # the server caps requests far below this anyway
MAX_CELL_CHARS = 120  # longer values are cut in tables (``--json`` prints them whole)


# ---------------------------------------------------------------------------------------------
# Parsers


def _lease_id(text: str, *, allow_zero: bool = False) -> int:
    """A lease ID as ``lease grant`` prints it (hex), or decimal: ``parse_lease_id``."""
    try:
        return parse_lease_id(text, allow_zero=allow_zero)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _lease_id_or_zero(text: str) -> int:
    return _lease_id(text, allow_zero=True)


def _non_negative(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"want a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"want a non-negative integer, got {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"want seconds, got {text!r}") from None
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"want seconds in (0, 3600], got {text!r}")
    return value


def _common_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--endpoints",
        metavar="URLS",
        help=f"comma-separated client URLs (default ${ENDPOINTS_ENV}, else {DEFAULT_ENDPOINT})",
    )
    common.add_argument(
        "--timeout",
        type=_seconds,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"deadline of the call, retries included (default {DEFAULT_TIMEOUT_S:g})",
    )
    common.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_tls_options(common)
    # etcd v3 auth, as etcdctl: --user name[:password], --password
    common.add_argument(
        "--user",
        dest="auth_user",
        metavar="NAME[:PASSWORD]",
        help=f"authenticate as this user (default ${USER_ENV}); without a "
        "password it is asked on the terminal",
    )
    common.add_argument(
        "--password",
        dest="auth_password",
        metavar="PASSWORD",
        help=f"the user's password (default ${PASSWORD_ENV})",
    )
    return common


def register(sub) -> None:
    common = _common_options()

    p = sub.add_parser("put", parents=[common], help="set a key to a value")
    p.add_argument("key", metavar="KEY")
    p.add_argument(
        "value", metavar="VALUE", nargs="?", help="the value (read from stdin when omitted)"
    )
    p.add_argument(
        "--lease",
        type=_lease_id_or_zero,
        default=0,
        metavar="ID",
        help="attach the key to this lease (as `lease grant` prints it, or decimal)",
    )
    p.add_argument("--prev-kv", action="store_true", help="print the previous key-value")
    p.set_defaults(func=cmd_put)

    g = sub.add_parser("get", parents=[common], help="read a key, or keys with a prefix")
    g.add_argument("key", metavar="KEY")
    g.add_argument("--prefix", action="store_true", help="every key starting with KEY")
    g.add_argument(
        "--limit", type=_non_negative, default=0, metavar="N", help="at most N keys (0 = no limit)"
    )
    g.add_argument(
        "--rev",
        type=_non_negative,
        default=0,
        metavar="N",
        help="read at revision N (0 = the current one)",
    )
    g.add_argument(
        "--serializable",
        action="store_true",
        help="let any node answer from its local state (may be stale)",
    )
    g.add_argument("--keys-only", action="store_true", help="keys without values")
    g.set_defaults(func=cmd_get)

    d = sub.add_parser("del", parents=[common], help="delete a key, or keys with a prefix")
    d.add_argument("key", metavar="KEY")
    d.add_argument("--prefix", action="store_true", help="every key starting with KEY")
    d.set_defaults(func=cmd_del)

    s = sub.add_parser("status", parents=[common], help="the status of every endpoint")
    s.set_defaults(func=cmd_status)


def build_parser() -> argparse.ArgumentParser:
    """A parser with just these commands (``raftkv`` itself registers them among others)."""
    parser = argparse.ArgumentParser(prog="raftkv")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


# ---------------------------------------------------------------------------------------------
# Commands


def endpoints_from(args: argparse.Namespace, environ=os.environ) -> str:
    return args.endpoints or environ.get(ENDPOINTS_ENV) or DEFAULT_ENDPOINT


# etcdctl's --cacert/--cert/--key and their environment twins (etcdctl: ETCDCTL_CACERT ...)
TLS_ENV = {"--cacert": "RAFTKV_CACERT", "--cert": "RAFTKV_CERT", "--key": "RAFTKV_KEY"}
_TLS_DEST = {"--cacert": "tls_cacert", "--cert": "tls_cert", "--key": "tls_key"}  # not KEY


def add_tls_options(parser: argparse.ArgumentParser) -> None:
    """TLS, as etcdctl: https endpoints verified with --cacert, --cert/--key as client cert."""
    for flag, what in (
        ("--cacert", "CA bundle that verifies https endpoints (default: the system CAs)"),
        ("--cert", "client certificate for https endpoints (PEM)"),
        ("--key", "the client certificate's private key (PEM)"),
    ):
        parser.add_argument(
            flag, dest=_TLS_DEST[flag], metavar="FILE", help=f"{what} (default ${TLS_ENV[flag]})"
        )


class TLSFiles(TypedDict):
    """The client's TLS files (``AsyncClient``/``client_context`` keywords); None: not given."""

    ca_file: str | None
    cert_file: str | None
    key_file: str | None


class Credentials(TypedDict, total=False):
    """``AsyncClient``'s ``user``/``password`` keywords; empty without ``--user``."""

    user: str
    password: str


def tls_options_from(args: argparse.Namespace, environ=os.environ) -> TLSFiles:
    """The client's ``ca_file``/``cert_file``/``key_file`` from the flags, else the env."""

    def get(flag: str) -> str | None:
        return getattr(args, _TLS_DEST[flag], None) or environ.get(TLS_ENV[flag]) or None

    return TLSFiles(ca_file=get("--cacert"), cert_file=get("--cert"), key_file=get("--key"))


USER_ENV, PASSWORD_ENV = "RAFTKV_USER", "RAFTKV_PASSWORD"


def auth_options_from(
    args: argparse.Namespace,
    environ=os.environ,
    stdin: TextIO | None = None,
    prompt: Callable[[str], str] = getpass.getpass,
) -> Credentials:
    """The client's ``user``/``password`` from ``--user name[:password]``/``--password``
    (else the env); the password asked on the terminal when missing. Raises ValueError when
    it is missing and stdin is not a terminal (a script must give it)."""
    spec = getattr(args, "auth_user", None) or environ.get(USER_ENV)
    password = getattr(args, "auth_password", None) or environ.get(PASSWORD_ENV)
    if not spec:
        if password:
            raise ValueError("--password given without --user")
        return {}
    name, sep, inline = spec.partition(":")
    if not name:
        raise ValueError("--user: empty user name")
    if sep:
        if password is not None and getattr(args, "auth_password", None):
            raise ValueError("give the password in --user NAME:PASSWORD or --password, not both")
        password = inline
    if password is None:
        stdin = stdin or sys.stdin
        if not stdin.isatty():
            raise ValueError(
                f"--user {name}: no password (give --user {name}:PASSWORD, "
                f"--password or ${PASSWORD_ENV}; stdin is not a terminal to "
                "ask it)"
            )
        password = prompt(f"Password for {name}: ")
    return Credentials(user=name, password=password)


def client_options_from(args: argparse.Namespace) -> dict[str, Any]:
    """TLS files and credentials for the client, from the common options."""
    return {**tls_options_from(args), **auth_options_from(args)}


def _run(
    args: argparse.Namespace,
    body: Callable[[AsyncClient], Any],
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """Run ``body(client)`` on a fresh client; print an expected failure, return the status."""
    out = out or sys.stdout
    err = err or sys.stderr

    async def go(options: dict[str, Any]) -> int:
        client = AsyncClient(
            endpoints_from(args),
            timeout_s=args.timeout,
            attempt_timeout_s=min(2.0, args.timeout),
            **options,
        )
        async with client:
            return await body(client)

    try:
        return asyncio.run(go(client_options_from(args)))
    except ClientError as exc:
        err.write(f"Error: {exc}\n")
        return 1
    except ValueError as exc:  # a bad endpoint URL, a bad option combination
        err.write(f"Error: {exc}\n")
        return 1


def cmd_put(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    if args.value is None:
        value = sys.stdin.buffer.read(MAX_STDIN_VALUE_BYTES + 1)
        if len(value) > MAX_STDIN_VALUE_BYTES:
            (err or sys.stderr).write(
                f"Error: value on stdin is over {MAX_STDIN_VALUE_BYTES} bytes\n"
            )
            return 1
    else:
        value = os.fsencode(args.value)  # the bytes given, even if not UTF-8

    async def body(client: AsyncClient) -> int:
        result = await client.put(
            os.fsencode(args.key), value, lease=args.lease, prev_kv=args.prev_kv
        )
        out.write(render_put(result, as_json=args.json))
        return 0

    return _run(args, body, out, err)


def cmd_get(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err_out = err or sys.stderr

    async def body(client: AsyncClient) -> int:
        result = await client.range(
            os.fsencode(args.key),
            prefix=args.prefix,
            limit=args.limit,
            revision=args.rev,
            serializable=args.serializable,
            keys_only=args.keys_only,
        )
        missing = not result.kvs and not args.prefix
        if args.json or not missing:
            out.write(render_range(result, as_json=args.json, keys_only=args.keys_only))
        if missing:
            err_out.write(f"Error: key {args.key!r} not found (revision {result.revision})\n")
            return 1
        return 0

    return _run(args, body, out, err)


def cmd_del(args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout

    async def body(client: AsyncClient) -> int:
        result = await client.delete(os.fsencode(args.key), prefix=args.prefix)
        out.write(render_delete(result, as_json=args.json))
        return 0

    return _run(args, body, out, err)


def cmd_status(
    args: argparse.Namespace, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    out = out or sys.stdout
    err_out = err or sys.stderr

    async def body(client: AsyncClient) -> int:
        statuses = await client.statuses()
        out.write(render_status(statuses, as_json=args.json))
        failed = [s for s in statuses if s.error is not None]
        for s in failed:
            err_out.write(f"Error: {s.endpoint}: {_error_text(s.error)}\n")
        return 1 if failed else 0

    return _run(args, body, out, err)


# ---------------------------------------------------------------------------------------------
# Rendering (pure functions: result -> text)


def kv_to_json(kv: KeyValue) -> dict[str, Any]:
    try:
        doc: dict[str, Any] = {"key": kv.key.decode("utf-8"), "value": kv.value.decode("utf-8")}
    except UnicodeDecodeError:
        doc = {
            "key": base64.b64encode(kv.key).decode(),
            "value": base64.b64encode(kv.value).decode(),
            "encoding": "base64",
        }
    doc.update(
        create_revision=kv.create_revision,
        mod_revision=kv.mod_revision,
        version=kv.version,
        lease=kv.lease,
    )
    return doc


def header_to_json(header: ResponseHeader) -> dict[str, int]:
    return {
        "cluster_id": header.cluster_id,
        "member_id": header.member_id,
        "revision": header.revision,
        "raft_term": header.raft_term,
    }


def _dumps(doc: Any) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def _text(data: bytes) -> str:
    text = data.decode("utf-8", "backslashreplace")
    # Control characters would break the table: show them escaped, as repr() does.
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return text if len(text) <= MAX_CELL_CHARS else text[: MAX_CELL_CHARS - 3] + "..."


def display_width(text: str) -> int:
    """Terminal columns ``text`` takes: wide and fullwidth characters (CJK, most emoji) take
    two, combining marks and other zero-width characters none, the rest one."""
    width = 0
    for c in text:
        if unicodedata.combining(c) or unicodedata.category(c) in ("Mn", "Me", "Cf"):
            continue
        width += 2 if unicodedata.east_asian_width(c) in ("W", "F") else 1
    return width


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """An etcdctl-style ASCII table; columns line up by display width (see
    ``display_width``), so wide characters do not push the borders."""
    cells = [[str(c) for c in row] for row in rows]
    widths = [display_width(h) for h in headers]
    for row in cells:
        for i, c in enumerate(row):
            widths[i] = max(widths[i], display_width(c))
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+\n"

    def line(values: Sequence[str]) -> str:
        return (
            "|"
            + "|".join(
                f" {v}{' ' * (w - display_width(v))} " for v, w in zip(values, widths, strict=True)
            )
            + "|\n"
        )

    return rule + line(headers) + rule + "".join(line(r) for r in cells) + rule


def _kv_table(kvs: Sequence[KeyValue], keys_only: bool = False) -> str:
    headers = (
        ["KEY"] + ([] if keys_only else ["VALUE"]) + ["CREATE REV", "MOD REV", "VERSION", "LEASE"]
    )
    rows = [
        [_text(kv.key)]
        + ([] if keys_only else [_text(kv.value)])
        + [kv.create_revision, kv.mod_revision, kv.version, kv.lease]
        for kv in kvs
    ]
    return table(headers, rows)


def render_put(result: PutResult, *, as_json: bool) -> str:
    if as_json:
        return _dumps(
            {
                "revision": result.revision,
                "header": header_to_json(result.header),
                "prev_kv": kv_to_json(result.prev_kv) if result.prev_kv else None,
            }
        )
    text = f"OK (revision {result.revision})\n"
    if result.prev_kv is not None:
        text += "previous:\n" + _kv_table([result.prev_kv])
    return text


def render_range(result: RangeResult, *, as_json: bool, keys_only: bool = False) -> str:
    if as_json:
        return _dumps(
            {
                "revision": result.revision,
                "header": header_to_json(result.header),
                "count": result.count,
                "more": result.more,
                "kvs": [kv_to_json(kv) for kv in result.kvs],
            }
        )
    if not result.kvs:
        return f"(no keys; revision {result.revision})\n"
    noun = "key" if result.count == 1 else "keys"
    shown = f"{len(result.kvs)} of {result.count}" if result.more else f"{result.count}"
    return _kv_table(result.kvs, keys_only) + f"{shown} {noun}, revision {result.revision}\n"


def render_delete(result: DeleteResult, *, as_json: bool) -> str:
    if as_json:
        return _dumps(
            {
                "deleted": result.deleted,
                "revision": result.revision,
                "header": header_to_json(result.header),
                "prev_kvs": [kv_to_json(kv) for kv in result.prev_kvs],
            }
        )
    noun = "key" if result.deleted == 1 else "keys"
    return f"deleted {result.deleted} {noun} (revision {result.revision})\n"


def _error_text(error: Exception | None) -> str:
    if isinstance(error, ClientError):
        return error.message
    return str(error)


def _size(n: int) -> str:
    size: float = n  # still the int while it is shown in bytes
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return str(size)


def render_status(statuses: Sequence[EndpointStatus], *, as_json: bool) -> str:
    if as_json:
        docs: list[dict[str, Any]] = []
        for es in statuses:
            s = es.status
            if s is None:
                docs.append({"endpoint": es.endpoint, "error": _error_text(es.error)})
                continue
            docs.append(
                {
                    "endpoint": es.endpoint,
                    "member_id": s.member_id,
                    "member_id_hex": f"{s.member_id:x}",
                    "cluster_id": s.header.cluster_id,
                    "is_leader": s.is_leader,
                    "leader": s.leader,
                    "raft_term": s.raft_term,
                    "raft_index": s.raft_index,
                    "raft_applied_index": s.raft_applied_index,
                    "revision": s.revision,
                    "version": s.version,
                    "db_size_bytes": s.db_size_bytes,
                    "db_size_quota_bytes": s.db_size_quota_bytes,
                    "is_learner": s.is_learner,
                    "errors": list(s.errors),
                    **_archive_json(s),
                }
            )
        return _dumps(docs)
    headers = [
        "ENDPOINT",
        "ID",
        "IS LEADER",
        "RAFT TERM",
        "RAFT INDEX",
        "APPLIED",
        "REVISION",
        "VERSION",
        "DB SIZE",
        "ERRORS",
    ]
    rows: list[list[Any]] = []
    for es in statuses:
        s = es.status
        if s is None:
            rows.append(
                [es.endpoint, "-", "-", "-", "-", "-", "-", "-", "-", _error_text(es.error)]
            )
            continue
        rows.append(
            [
                es.endpoint,
                f"{s.member_id:x}",
                "true" if s.is_leader else "false",
                s.raft_term,
                s.raft_index,
                s.raft_applied_index,
                s.revision,
                s.version,
                _size(s.db_size_bytes),
                ", ".join(s.errors),
            ]
        )
    return table(*_with_archive_columns(*_with_quota_column(headers, rows, statuses), statuses))


# The space quota, after DB SIZE: only when some member reports one (raftkv, etcd >= 3.6).
def _with_quota_column(headers: list, rows: list, statuses) -> tuple[list, list]:
    if all(es.status is None or not es.status.db_size_quota_bytes for es in statuses):
        return headers, rows
    at = headers.index("DB SIZE") + 1
    quota = [
        _size(es.status.db_size_quota_bytes)
        if es.status is not None and es.status.db_size_quota_bytes
        else "-"
        for es in statuses
    ]
    return (
        [*headers[:at], "QUOTA", *headers[at:]],
        [[*r[:at], q, *r[at:]] for r, q in zip(rows, quota, strict=True)],
    )


# Archive lag columns: only when some member archives (--archive-url).
def _archive_json(s) -> dict:
    if s.archive_lag_entries is None:
        return {}
    return {
        "archive_lag_entries": s.archive_lag_entries,
        "archive_lag_seconds": s.archive_lag_seconds,
    }


def _with_archive_columns(headers: list, rows: list, statuses) -> tuple[list, list]:
    if all(es.status is None or es.status.archive_lag_entries is None for es in statuses):
        return headers, rows
    lag = []
    for es in statuses:
        s = es.status
        if s is None or s.archive_lag_entries is None:
            lag.append(["-", "-"])
        else:
            lag.append([s.archive_lag_entries, f"{s.archive_lag_seconds or 0.0:.1f}s"])
    return (
        [*headers[:-1], "ARCHIVE LAG", "ARCHIVE LAG TIME", headers[-1]],
        [[*r[:-1], *extra, r[-1]] for r, extra in zip(rows, lag, strict=True)],
    )


if __name__ == "__main__":
    sys.exit(main())
