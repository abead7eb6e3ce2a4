"""``raftkv wal dump|verify|repair DIR``: look into, check and fix a write-ahead log.

DIR is the WAL directory (``<data-dir>/member/wal``), or a member's data dir (``--data-dir``
of ``raftkv serve``, whose ``member/wal`` is used) or its ``member`` dir. All three commands
find the WAL alike, and all three refuse, exit 1, a directory where there is none
(``error: DIR: no WAL segment here, nor in DIR/member/wal or DIR/wal``). When DIR is not
the WAL directory itself, the one used is named on stderr.

* ``dump DIR [--json]``: every record of every segment (segment, offset, type, index,
  term, crc and whether it matches the running CRC, sizes). A table by default; with
  ``--json`` one JSON object per line. Read-only, no locks: safe on a running node. Exit 1
  when a record's CRC does not match or a segment stops making sense.
* ``verify DIR``: checks every CRC and the log's structure from the first segment on.
  Exit 0 when clean; exit 1 printing the first problem with its file and offset (a torn
  tail is a problem here: ``repair`` fixes it).
* ``repair DIR``: truncates a torn tail of the last segment (keeps ``<name>.broken``),
  then verifies the whole log. Exit 0 when it is clean afterwards; 1 otherwise, printing
  the first problem (damage that is not a torn tail is never changed).
"""

from __future__ import annotations

import json
import sys

import wal
from wal.dump import DumpProblem, dump
from wal.repair import check_dir
from wal.segment import find_wal_dir


def _resolve(args) -> str | None:
    """``args.dir`` resolved by ``find_wal_dir`` (noting on stderr when it is a subdirectory),
    or None after printing why there is no WAL there."""
    try:
        found = find_wal_dir(args.dir)
    except (wal.WalError, OSError) as e:
        _err(f"error: {e}")
        return None
    if found != args.dir:
        _err(f"WAL directory: {found}")
    return found


def register(sub) -> None:
    p = sub.add_parser("wal", help="inspect, verify and repair a write-ahead log")
    wsub = p.add_subparsers(dest="wal_command", metavar="WAL_COMMAND")
    wsub.required = True

    d = wsub.add_parser("dump", help="print every record of a WAL directory")
    d.add_argument(
        "dir", metavar="DIR", help="the WAL directory, or a data dir (its member/wal is used)"
    )
    d.add_argument("--json", action="store_true", help="one JSON object per record and line")
    d.set_defaults(func=_dump)

    v = wsub.add_parser("verify", help="check every CRC; exit 1 with the first problem")
    v.add_argument(
        "dir", metavar="DIR", help="the WAL directory, or a data dir (its member/wal is used)"
    )
    v.set_defaults(func=_verify)

    r = wsub.add_parser("repair", help="truncate a torn tail of the last segment")
    r.add_argument(
        "dir", metavar="DIR", help="the WAL directory, or a data dir (its member/wal is used)"
    )
    r.set_defaults(func=_repair)


def _err(msg: str) -> None:
    print(msg, file=sys.stderr)


def _dump(args) -> int:
    path = _resolve(args)
    if path is None:
        return 1
    out = sys.stdout
    problems = 0
    if not args.json:
        out.write(
            f"{'SEGMENT':<38} {'OFFSET':>10} {'TYPE':<9} {'INDEX':>10} {'TERM':>6} "
            f"{'CRC':>10} {'OK':<3} {'REC':>7} {'DATA':>7}  DETAILS\n"
        )
    try:
        for item in dump(path):
            if isinstance(item, DumpProblem):
                problems += 1
                if args.json:
                    out.write(
                        json.dumps(
                            {"segment": item.segment, "offset": item.offset, "error": item.reason}
                        )
                        + "\n"
                    )
                else:
                    out.write(f"{item.segment:<38} {item.offset:>10} ERROR: {item.reason}\n")
                continue
            f = item.fields
            problems += not item.crc_ok
            if args.json:
                rec = {
                    "segment": item.segment,
                    "offset": item.offset,
                    "type": item.type,
                    "crc": item.crc,
                    "crc_ok": item.crc_ok,
                    "record_bytes": item.record_bytes,
                    "data_bytes": item.data_bytes,
                    "frame_bytes": item.frame_bytes,
                }
                rec.update(f)
                out.write(json.dumps(rec) + "\n")
                continue
            index = f.get("index", "")
            term = f.get("term", "")
            details = ", ".join(f"{k}={v}" for k, v in f.items() if k not in ("index", "term"))
            out.write(
                f"{item.segment:<38} {item.offset:>10} {item.type:<9} {index:>10} "
                f"{term:>6} {item.crc:#010x} {'yes' if item.crc_ok else 'NO':<3} "
                f"{item.record_bytes:>7} "
                f"{'-' if item.data_bytes is None else item.data_bytes:>7}  {details}\n"
            )
    except BrokenPipeError:
        raise  # `raftkv wal dump DIR | head`: cli.main handles it
    except (wal.WalError, OSError) as e:
        _err(f"error: {e}")
        return 1
    return 1 if problems else 0


def _verify(args, path: str | None = None) -> int:
    path = path or _resolve(args)
    if path is None:
        return 1
    try:
        st = check_dir(path, None, allow_torn_tail=False)
    except wal.TornWriteError as e:
        _err(f"torn write: {e.file} at offset {e.offset}: {e.reason}")
        _err(f"run: raftkv wal repair {args.dir}")
        return 1
    except wal.CorruptError as e:
        _err(f"corrupt: {e.file} at offset {e.offset}: {e.reason}")
        return 1
    except (wal.WalError, OSError) as e:
        _err(f"error: {e}")
        return 1
    hs = st.hard_state()
    print(
        f"ok: {st.records} records, last entry index {st.enti}, hard state term={hs.term} "
        f"vote={hs.vote} commit={hs.commit}"
    )
    return 0


def _repair(args) -> int:
    path = _resolve(args)
    if path is None:
        return 1
    try:
        ok = wal.repair(path)
    except (wal.WalError, OSError) as e:
        _err(f"error: {e}")
        return 1
    if not ok:
        _err(
            "not repairable: the damage is not a torn tail of the last segment; nothing was changed"
        )
    status = _verify(args, path)  # the whole log, after the tail was fixed (or not)
    return status if ok else 1
