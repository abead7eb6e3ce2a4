"""``raftkv snapshot save|status|restore``: backups in etcdctl's shape.

* ``save FILE|URL [--endpoints URL] [--format raftkv|etcd]``: one member's state
  (``POST /v3/maintenance/snapshot``) streamed to a file or any fsspec URL
  (``s3://bucket/key``, ``memory://...``), with a progress bar on stderr when it is a
  terminal; prints the revision, size and SHA-256. Exactly one endpoint, as etcdctl
  requires. ``--format raftkv`` (default): raftkv's own file; ``--format etcd``: etcd's
  snapshot file (a bolt database and its SHA-256, what ``etcdctl snapshot save`` writes),
  for etcd's tools and for moving back to etcd.
* ``status FILE|URL [--json]``: verifies the SHA-256 and prints revision, keys, size, hash.
* ``restore FILE|URL --data-dir D --name N --initial-cluster C --initial-cluster-token T
  [--initial-advertise-peer-urls U]``: a data directory from which a NEW cluster starts
  (``kvserver.archive.datadir``). Run it once per member, each with its own ``--name`` and
  ``--data-dir`` and the same ``--initial-cluster`` and token; then ``raftkv serve`` each with
  the same flags.

``status`` and ``restore`` also take etcd's files, recognised by their content: a snapshot
from ``etcdctl snapshot save`` (etcd 3.4 or 3.5; its SHA-256 trailer is checked) or a data
dir's ``member/snap/db`` (no trailer). The restore carries every retained version, the
compact revision, leases, auth and alarms (``kvserver.etcdsnap.importer``); the members
come from the flags, as with etcdctl. A file at a URL is first copied to a local temporary
file (it is read from its mapping).

``--archive-option key=value`` (repeatable) passes fsspec/s3fs storage options. A file whose
hash does not match is refused (exit 1, the message says so). Exit 0 on success.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator

from bolt import BoltError, looks_like_bolt
from kvserver.archive import backup
from kvserver.archive.datadir import RestoreTarget
from kvserver.archive.snapfile import SnapshotFileError
from kvserver.archive.store import ArchiveError, parse_options
from kvserver.cli.auth import add_user_options, auth_header
from kvserver.cli.client import ENDPOINTS_ENV, add_tls_options, tls_options_from
from kvserver.client import DEFAULT_ENDPOINT, ClientError
from kvserver.etcdsnap.file import EtcdFileError
from kvserver.etcdsnap.importer import EtcdImportError
from kvserver.etcdsnap.restore import EtcdStatus, restore_etcd, status_etcd
from kvserver.tls import TLSConfigError, client_context


def add_storage_options(p) -> None:
    p.add_argument(
        "--archive-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="fsspec/s3fs storage option (repeatable; e.g. "
        "endpoint_url=http://127.0.0.1:9000, key=..., secret=...)",
    )


def add_restore_target(p) -> None:
    p.add_argument("--data-dir", required=True, help="the new member's data directory")
    p.add_argument("--name", default="default", help="this member's name (default 'default')")
    p.add_argument(
        "--initial-cluster",
        default=None,
        help="the NEW cluster: name=peer-url,... (default NAME=<advertise peer url>)",
    )
    p.add_argument(
        "--initial-cluster-token",
        default="raftkv-cluster",
        help="the new cluster's token (default 'raftkv-cluster')",
    )
    p.add_argument(
        "--initial-advertise-peer-urls",
        default=None,
        help="this member's peer URLs (checked against --initial-cluster)",
    )


def restore_target(args) -> RestoreTarget:
    peer = tuple(
        u.strip() for u in (args.initial_advertise_peer_urls or "").split(",") if u.strip()
    )
    initial = args.initial_cluster or f"{args.name}={','.join(peer) or 'http://127.0.0.1:2380'}"
    return RestoreTarget(args.data_dir, args.name, initial, args.initial_cluster_token, peer)


def register(sub) -> None:
    p = sub.add_parser("snapshot", help="save, inspect and restore backups")
    ssub = p.add_subparsers(dest="snapshot_command", metavar="SNAPSHOT_COMMAND")
    ssub.required = True

    s = ssub.add_parser("save", help="stream one member's snapshot to a file or URL")
    s.add_argument("dest", metavar="FILE|URL")
    s.add_argument(
        "--endpoints",
        metavar="URL",
        help=f"the member to copy (default ${ENDPOINTS_ENV}, else {DEFAULT_ENDPOINT})",
    )
    s.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="connect/read timeout (default 30)",
    )
    s.add_argument("--json", action="store_true", help="print the result as JSON")
    s.add_argument(
        "--format",
        choices=("raftkv", "etcd"),
        default="raftkv",
        help="raftkv's own file (default) or etcd's snapshot file (bolt)",
    )
    add_user_options(s)
    add_tls_options(s)
    add_storage_options(s)
    s.set_defaults(func=cmd_save)

    t = ssub.add_parser("status", help="verify a snapshot file and print what it holds")
    t.add_argument("src", metavar="FILE|URL")
    t.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_storage_options(t)
    t.set_defaults(func=cmd_status)

    r = ssub.add_parser("restore", help="build a data dir for a new cluster from a snapshot")
    r.add_argument("src", metavar="FILE|URL")
    add_restore_target(r)
    add_storage_options(r)
    r.set_defaults(func=cmd_restore)


def _fail(msg: str) -> int:
    print(f"Error: {msg}", file=sys.stderr)
    return 1


def _info_row(info) -> dict:
    h = info.header
    return {
        "revision": info.revision,
        "keys": info.keys,
        "size_bytes": info.size_bytes,
        "sha256": info.sha256,
        "raft_index": h.get("raft_index"),
        "compact_revision": h.get("compact_revision"),
        "cluster_id": h.get("cluster_id"),
        "member_id": h.get("member_id"),
        "created_unix": h.get("created_unix"),
    }


def _table(row: dict) -> str:
    cols = ("revision", "keys", "size_bytes", "sha256")
    cells = [[c.upper().replace("_", " ") for c in cols], [str(row[c]) for c in cols]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cols))]
    sep = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    lines = [sep]
    for r in cells:
        lines.append("| " + " | ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) + " |")
        lines.append(sep)
    return "\n".join(lines)


def cmd_save(args) -> int:
    endpoints = [
        e.strip()
        for e in (args.endpoints or os.environ.get(ENDPOINTS_ENV) or DEFAULT_ENDPOINT).split(",")
        if e.strip()
    ]
    if len(endpoints) != 1:
        return _fail("snapshot must be requested from one member: give exactly one endpoint")
    tls = tls_options_from(args)
    try:  # with auth enabled the snapshot needs a root user's token
        headers = auth_header(endpoints[0], args, timeout_s=args.timeout, tls=tls)
        ssl_context = client_context(**tls) if endpoints[0].startswith("https://") else None
    except (ClientError, ValueError, TLSConfigError) as exc:
        return _fail(str(exc))
    bar = backup.ProgressBar(sys.stderr, "saving")
    try:
        info = backup.save(
            endpoints[0],
            args.dest,
            options=parse_options(args.archive_option),
            progress=bar,
            timeout_s=args.timeout,
            headers=headers,
            ssl_context=ssl_context,
            fmt=args.format,
        )
    except (ArchiveError, SnapshotFileError, OSError, ValueError) as exc:
        bar.finish()
        return _fail(str(exc))
    except Exception as exc:  # aiohttp's connection errors
        bar.finish()
        return _fail(f"{endpoints[0]}: {type(exc).__name__}: {exc}")
    bar.finish()
    row = _info_row(info)
    if args.format == "etcd":
        try:
            with _local_copy(args.dest, args.archive_option) as local:
                row = _etcd_row(status_etcd(local))
        except (ArchiveError, OSError, ValueError) as exc:
            return _fail(f"saved {args.dest}, but it does not read back: {exc}")
    if args.json:
        print(json.dumps(row))
    else:
        print(
            f"Snapshot saved at {args.dest}: revision {row['revision']}, {row['keys']} keys, "
            f"{row['size_bytes']} bytes, sha256 {row['sha256']}"
        )
    return 0


def _is_bolt(src: str, storage_options: list[str]) -> bool:
    fs, path = backup.open_fs(src, parse_options(storage_options))
    try:
        with fs.open(path, "rb") as f:
            return looks_like_bolt(f.read(64))
    except FileNotFoundError:
        raise ArchiveError(f"{src}: no such snapshot file") from None


@contextlib.contextmanager
def _local_copy(src: str, storage_options: list[str]) -> Iterator[str]:
    """A local path of ``src``: itself, or a temporary copy of a URL's file."""
    fs, path = backup.open_fs(src, parse_options(storage_options))
    if "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)):
        yield path
        return
    tmp = tempfile.mkdtemp(prefix="raftkv-etcd-snapshot-")
    try:
        local = os.path.join(tmp, "db")
        fs.get(path, local)
        yield local
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _etcd_row(st: EtcdStatus) -> dict:
    s = st.summary
    return {
        "format": "etcd",
        "revision": s.revision,
        "keys": s.keys,
        "size_bytes": st.size_bytes,
        "sha256": st.sha256,
        "compact_revision": s.compact_revision,
        "versions": s.versions,
        "leases": s.leases,
        "users": s.users,
        "roles": s.roles,
        "auth_enabled": s.auth_enabled,
        "alarms": s.alarms,
        "ignored_buckets": s.ignored_buckets,
    }


_ETCD_ERRORS = (ArchiveError, EtcdFileError, EtcdImportError, BoltError, OSError)


def cmd_status(args) -> int:
    try:
        if _is_bolt(args.src, args.archive_option):
            with _local_copy(args.src, args.archive_option) as local:
                row = _etcd_row(status_etcd(local))
            print(json.dumps(row) if args.json else _table(row))
            return 0
    except _ETCD_ERRORS as exc:
        return _fail(str(exc))
    try:
        info = backup.status(args.src, options=parse_options(args.archive_option))
    except (ArchiveError, SnapshotFileError, OSError) as exc:
        return _fail(str(exc))
    row = _info_row(info)
    print(json.dumps(row) if args.json else _table(row))
    return 0


def cmd_restore(args) -> int:
    try:
        if _is_bolt(args.src, args.archive_option):
            with _local_copy(args.src, args.archive_option) as local:
                st, member = restore_etcd(local, restore_target(args))
            s = st.summary
            print(
                f"restored etcd snapshot: revision {s.revision} ({s.keys} keys, {s.versions} "
                f"versions, compact revision {s.compact_revision}, {s.leases} leases, "
                f"{s.users} users, {s.roles} roles) into {member.data_dir}: member "
                f"{member.member_id:x} of new cluster {member.cluster_id:x}"
            )
            return 0
    except _ETCD_ERRORS as exc:
        return _fail(str(exc))
    bar = backup.ProgressBar(sys.stderr, "restoring")
    try:
        info, member = backup.restore(
            args.src, restore_target(args), options=parse_options(args.archive_option), progress=bar
        )
    except (ArchiveError, SnapshotFileError, OSError) as exc:
        bar.finish()
        return _fail(str(exc))
    bar.finish()
    print(
        f"restored revision {info.revision} ({info.keys} keys) into {member.data_dir}: "
        f"member {member.member_id:x} of new cluster {member.cluster_id:x}"
    )
    return 0
