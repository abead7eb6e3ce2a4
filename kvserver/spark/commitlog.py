"""A Delta-style commit log in raftkv: version N of a table is committed once, by one writer.

Layout: version ``N`` of table ``T`` is the key ``<prefix>T/v/<N as 20 decimal digits>``
(zero-padded so key order is version order); its value is the commit's payload (bytes; a
``dict`` is stored as JSON). Versions start at 0 and are contiguous. Beside it, written in
the same transaction, ``<prefix>T/m/<N>`` says who committed it and how, as JSON:
``committer`` (the log's ``committer``, by default ``host:pid``), ``committed_at`` (the
committer's clock, Unix seconds) and ``fence`` (``{"key", "token"}`` of the lock the commit
was fenced by, or null) — what an operator asks of a table's history (``info(N)``; the
dashboard's Pipelines view shows it).

``commit(version, payload, fence=..., also=())`` is **one transaction** whose compares are

- ``version(key N) == 0``: version N is not committed yet (put-if-absent);
- ``version(key N-1) > 0`` for N > 0: the previous version is committed (no gaps);
- ``fence.compare()`` when a fence is given: the writer still holds its lock
  (``kvserver.spark.fencing``);

and whose success branch puts the version's key plus the caller's ``also`` ops (e.g. a
progress record), atomically with it. When a compare fails nothing is written, and the
failure branch reads the keys involved, so the error says **which** compare failed:

- ``FencedOutError``: the fence's lock key is gone or has another create revision (the lock
  was lost). Checked first: a writer that lost its lock must stop, whatever else happened.
- ``CommitConflictError``: version N is already committed (``existing`` holds that entry;
  the payloads may even be equal — a re-run that committed before a crash: the caller
  decides).
- ``CommitGapError``: version N-1 is not committed.

A commit that returns has been applied exactly once (the client retries a lost answer with
the same request id, which raftkv applies once); the returned ``CommitEntry.revision`` is
the store revision of the commit. A ``fence`` may also be a ``FencedLock`` (anything with a
``fence()`` method): then a loss the lock already signalled raises ``FencedOutError``
before anything is sent.

Readers: ``get(N)``, ``latest()``, ``next_version()``, ``history(start, stop)`` (paged, in
version order). Entries are never overwritten or deleted by this class.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from kvserver.client import Client, Cmp, Op, Txn
from kvserver.client.txn import as_bytes
from kvserver.kvpb.kv import KeyValue, RequestOp, prefix_range_end
from kvserver.spark.fencing import Fence, FencedOutError
from kvserver.spark.txn_reads import range_kvs

DEFAULT_PREFIX = "__raftkv/commitlog/"
VERSION_DIGITS = 20
MAX_VERSION = 10**VERSION_DIGITS - 1
PAGE_SIZE = 500

__all__ = [
    "CommitConflictError",
    "CommitEntry",
    "CommitGapError",
    "CommitLog",
    "CommitLogError",
    "resolve_fence",
]


class CommitLogError(RuntimeError):
    """A commit was refused (nothing of it was applied)."""


class CommitConflictError(CommitLogError):
    """The version was committed already (by this writer before, or by another one)."""

    def __init__(self, table: str, version: int, existing: CommitEntry) -> None:
        self.table = table
        self.version = version
        self.existing = existing
        super().__init__(
            f"table {table!r}: version {version} is already committed (at "
            f"revision {existing.revision}); this commit was not applied"
        )


class CommitGapError(CommitLogError):
    """The previous version is not committed: versions are contiguous."""

    def __init__(self, table: str, version: int) -> None:
        self.table = table
        self.version = version
        super().__init__(
            f"table {table!r}: cannot commit version {version} before version "
            f"{version - 1}; this commit was not applied"
        )


@dataclass(frozen=True, slots=True)
class CommitEntry:
    version: int
    payload: bytes
    revision: int  # the store revision at which this version was committed

    def json(self):
        return json.loads(self.payload)


def resolve_fence(fence) -> Fence | None:
    """A ``Fence``, ``None``, or a lock's current fence (raising ``FencedOutError`` when the
    lock already knows it lost)."""
    if fence is None or isinstance(fence, Fence):
        return fence
    if hasattr(fence, "fence"):
        return fence.fence()
    raise TypeError(f"fence must be a Fence or a FencedLock, not {type(fence).__name__}")


def fenced_out_detail(fence: Fence, kvs: Sequence[KeyValue]) -> str | None:
    """Why ``fence`` failed given the lock key's current state (``None`` if it holds)."""
    if not kvs:
        return "the lock key no longer exists"
    if kvs[0].create_revision != fence.token:
        return f"the lock key now has create revision {kvs[0].create_revision} (another holder)"
    return None


class CommitLog:
    """See the module docstring. ``client`` is a blocking ``kvserver.client.Client``."""

    def __init__(
        self,
        client: Client,
        table: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        committer: str | None = None,
    ) -> None:
        if not isinstance(table, str) or not table or "/" in table:
            raise ValueError(f"a table name is a non-empty string without '/', got {table!r}")
        self.client = client
        self.table = table
        self.prefix = as_bytes(prefix) + table.encode() + b"/v/"
        self.info_prefix = as_bytes(prefix) + table.encode() + b"/m/"
        self.committer = committer or f"{socket.gethostname()}:{os.getpid()}"

    def key(self, version: int) -> bytes:
        if (
            isinstance(version, bool)
            or not isinstance(version, int)
            or not 0 <= version <= MAX_VERSION
        ):
            raise ValueError(f"a version is an integer in [0, {MAX_VERSION}], got {version!r}")
        return self.prefix + f"{version:0{VERSION_DIGITS}d}".encode()

    def info_key(self, version: int) -> bytes:
        return self.info_prefix + self.key(version)[len(self.prefix) :]

    def _entry(self, kv: KeyValue) -> CommitEntry:
        return CommitEntry(int(kv.key[len(self.prefix) :]), kv.value, kv.create_revision)

    # -----------------------------------------------------------------------------------------
    # Writing

    def commit(
        self,
        version: int,
        payload: bytes | str | dict,
        *,
        fence=None,
        also: Sequence[RequestOp] = (),
    ) -> CommitEntry:
        """Commit ``version`` with ``payload`` (see the module docstring for the errors)."""
        key = self.key(version)
        data = (
            json.dumps(payload, sort_keys=True).encode()
            if isinstance(payload, dict)
            else as_bytes(payload, "payload")
        )
        fence = resolve_fence(fence)
        compares = [Cmp.version(key) == 0]
        checks = [Op.get(key)]
        if version > 0:
            compares.append(Cmp.version(self.key(version - 1)) > 0)
            checks.append(Op.get(self.key(version - 1), keys_only=True))
        if fence is not None:
            compares.append(fence.compare())
            checks.append(Op.get(fence.key, keys_only=True))
        info = {
            "committer": self.committer,
            "committed_at": round(time.time(), 3),
            "fence": (
                {"key": fence.key.decode("utf-8", "replace"), "token": fence.token}
                if fence is not None
                else None
            ),
        }
        record = Op.put(self.info_key(version), json.dumps(info, sort_keys=True).encode())
        result = self.client.txn(
            Txn().when(*compares).then(Op.put(key, data), record, *also).otherwise(*checks)
        )
        if result.succeeded:
            return CommitEntry(version, data, result.revision)
        if fence is not None:
            detail = fenced_out_detail(fence, range_kvs(result, -1))
            if detail is not None:
                if range_kvs(result, 0):
                    detail += f"; version {version} was meanwhile committed by another writer"
                raise FencedOutError(
                    fence.key,
                    fence.token,
                    f"commit of {self.table!r} version {version} refused: {detail}",
                )
        current = range_kvs(result, 0)
        if current:
            raise CommitConflictError(self.table, version, self._entry(current[0]))
        if version > 0 and not range_kvs(result, 1):
            raise CommitGapError(self.table, version)
        raise CommitLogError(
            f"table {self.table!r}: commit of version {version} refused for "
            f"no reason visible in the store (a concurrent change?)"
        )

    # -----------------------------------------------------------------------------------------
    # Reading

    def info(self, version: int) -> dict | None:
        """Who committed ``version``, when and with which fence (None: not committed, or
        committed by a raftkv before these records existed)."""
        kv = self.client.get(self.info_key(version))
        return None if kv is None else json.loads(kv.value)

    def get(self, version: int) -> CommitEntry | None:
        kv = self.client.get(self.key(version))
        return None if kv is None else self._entry(kv)

    def latest(self) -> CommitEntry | None:
        rr = self.client.range(
            self.prefix, prefix=True, limit=1, sort_target="key", sort_order="descend"
        )
        return self._entry(rr.kvs[0]) if rr.kvs else None

    def next_version(self) -> int:
        latest = self.latest()
        return 0 if latest is None else latest.version + 1

    def history(self, start: int = 0, stop: int | None = None) -> Iterator[CommitEntry]:
        """Entries with ``start <= version < stop`` in version order, read page by page at
        one revision (a consistent listing even while others commit)."""
        end = self.key(stop) if stop is not None else None
        from_key = self.key(start)
        revision = 0
        while True:
            rr = self.client.range(
                from_key, end or prefix_range_end(self.prefix), limit=PAGE_SIZE, revision=revision
            )
            revision = revision or rr.revision
            for kv in rr.kvs:
                yield self._entry(kv)
            if not rr.more or not rr.kvs:
                return
            from_key = rr.kvs[-1].key + b"\0"
