"""``raftkv archive`` (continuous archive of a data dir) and ``raftkv restore`` (PITR).

* ``archive --data-dir D --archive-url URL [--archive-retention N] [--interval S] [--once]``:
  archives the member in ``D`` (snapshots and WAL segments, ``kvserver.archive.archiver``);
  with ``--once`` one pass and exit, else a pass every ``--interval`` seconds until Ctrl-C.
  While a member runs on ``D`` its live segment is archived once it is cut; ``raftkv serve
  --archive-url`` archives the live segment too.
* ``restore --from URL (--to-revision N | --to-time T | --latest) --data-dir D --name N
  --initial-cluster C --initial-cluster-token T [--member M] [--cluster-id X]``: builds a
  data dir for a NEW cluster at exactly that point (``kvserver.archive.pitr``); T is unix
  seconds or ISO 8601 (``2024-05-01T12:00:00+00:00``). Run once per member of the new
  cluster (each with its own ``--name``/``--data-dir``), then ``raftkv serve`` each.

``--archive-option key=value`` (repeatable) passes fsspec/s3fs options. Exit 0 on success,
1 with ``Error: ...`` (naming the missing or damaged object) otherwise.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

from kvserver.archive.archiver import Archiver
from kvserver.archive.pitr import Point, restore
from kvserver.archive.store import ArchiveError, ObjectStore, parse_options
from kvserver.cli.snapshot import (
    _fail,
    add_restore_target,
    add_storage_options,
    restore_target,
)
from kvserver.membership.discovery import read_wal_identity


def _time(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        pass
    try:
        dt = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"want unix seconds or ISO 8601, got {text!r}") from None
    if dt.tzinfo is None:
        dt = dt.astimezone()  # local time, as the operator typed it
    return dt.timestamp()


def register(sub) -> None:
    a = sub.add_parser("archive", help="archive a member's snapshots and WAL to a URL")
    a.add_argument("--data-dir", required=True, help="the member's data directory")
    a.add_argument("--archive-url", required=True, help="fsspec URL (file://, s3://, ...)")
    a.add_argument(
        "--archive-retention",
        type=int,
        default=0,
        metavar="N",
        help="keep the N newest archived snapshots and what they need (0 = all)",
    )
    a.add_argument(
        "--interval",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="seconds between passes (default 5)",
    )
    a.add_argument("--once", action="store_true", help="one pass, then exit")
    a.add_argument("--name", default="", help="member name recorded in the manifest")
    a.add_argument("--json", action="store_true", help="print each pass's result as JSON")
    add_storage_options(a)
    a.set_defaults(func=cmd_archive)

    r = sub.add_parser(
        "restore", help="point-in-time restore from an archive into a new cluster's data dir"
    )
    r.add_argument(
        "--from",
        dest="source",
        required=True,
        metavar="URL",
        help="the archive URL (as given to --archive-url)",
    )
    which = r.add_mutually_exclusive_group(required=True)
    which.add_argument("--to-revision", type=int, metavar="N", help="restore revision N")
    which.add_argument(
        "--to-time",
        type=_time,
        metavar="T",
        help="restore the state archived at time T (unix seconds or ISO 8601)",
    )
    which.add_argument("--latest", action="store_true", help="the newest archived commit")
    r.add_argument(
        "--member",
        default=None,
        help="restore from this member's archive (name or hex id; default: the "
        "one that reaches furthest)",
    )
    r.add_argument(
        "--cluster-id", default=None, help="the cluster (hex) when the archive holds several"
    )
    add_restore_target(r)
    add_storage_options(r)
    r.set_defaults(func=cmd_restore)


def cmd_archive(args) -> int:
    wal_dir = os.path.join(args.data_dir, "member", "wal")
    ident = read_wal_identity(wal_dir)
    if ident is None:
        return _fail(f"{args.data_dir} holds no member data (no {wal_dir})")
    try:
        store = ObjectStore.open(args.archive_url, parse_options(args.archive_option))
        arch = Archiver(
            store,
            args.data_dir,
            cluster_id=ident[1],
            member_id=ident[0],
            name=args.name or os.path.basename(os.path.abspath(args.data_dir)),
            retention=args.archive_retention,
        )
        m = arch.open()  # the archiver's manifest: every pass updates it in place
    except (ArchiveError, OSError, ValueError) as exc:
        return _fail(str(exc))
    while True:
        try:
            arch.run_once()
            report = {
                "member_id": f"{m.member_id:x}",
                "cluster_id": f"{m.cluster_id:x}",
                "snapshots": len(m.snapshots),
                "segments": len(m.segments),
                "last_index": m.last_index,
                "commit": m.commit,
                **arch.stats,
            }
            print(
                json.dumps(report)
                if args.json
                else f"archived member {report['member_id']}: {report['snapshots']} snapshots, "
                f"{report['segments']} segments, last index {report['last_index']}, "
                f"commit {report['commit']} ({arch.stats['uploaded_bytes']} bytes uploaded)",
                flush=True,
            )
        except (ArchiveError, OSError, ValueError) as exc:
            if args.once:
                return _fail(str(exc))
            print(f"archive pass failed (retrying): {exc}", file=sys.stderr, flush=True)
        if args.once:
            return 0
        time.sleep(args.interval)


def cmd_restore(args) -> int:
    point = Point(revision=args.to_revision, time=args.to_time)
    try:
        store = ObjectStore.open(args.source, parse_options(args.archive_option))
        result = restore(
            store,
            point,
            restore_target(args),
            cluster=args.cluster_id,
            member=args.member,
            progress=lambda msg: print(msg, file=sys.stderr, flush=True),
        )
    except (ArchiveError, OSError, ValueError) as exc:
        return _fail(str(exc))
    print(
        f"restored revision {result.revision} (index {result.index} of member "
        f"{result.member_id:x}, {result.entries_replayed} entries replayed after index "
        f"{result.base_index}) into {result.restored.data_dir}: member "
        f"{result.restored.member_id:x} of new cluster {result.restored.cluster_id:x}"
    )
    return 0
