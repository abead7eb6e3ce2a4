"""The cold tier's replay state: each key's current record, none of its history.

``LatestState`` stands in for ``MVCCStore`` under a replayed ``RaftKV`` (``cold_history``):
it answers what ``RaftKV.apply`` and the ``Lessor`` call on the store (``apply``,
``apply_entry``, ``write_is_large``, ``revision``, ``compaction_pending``, ``lease_exists``,
``keys_with_lease``, ``lease_key_count``, ``delete_keys_of_lease`` and its form in steps,
here one step) and applies every committed request with the store's rules, so it reaches
the same revisions and makes the same changes:

* a write that changes something takes the next revision, all its changes share it, and a
  write that changes nothing (a delete of no key, a txn whose taken branch only reads, a
  revoke of a lease with no key) takes none;
* per key, ``create_revision``, ``mod_revision``, ``version`` (1 at creation, +1 per put,
  reset by a delete) and ``lease``, and ``prev_kv`` the record the change replaced;
* the same checks (``kvserver.mvcc.validate``), the same errors before any change (a lease
  that does not exist, ``ignore_value`` on a missing key, a txn's range at a compacted or
  future revision), compares against the state before the txn, deletes inside a txn that see
  the txn's own puts, compactions that move the compact revision, and the same request-id
  deduplication table (``kvserver.mvcc.dedup``; duplicates change nothing).

What it drops: history. Nothing the replay asks needs it: a compare, a delete and a put read
the current record, and a txn's range at an older revision fails or not by the compact
revision alone and changes nothing. Events are built only for the keys of the watched range
(``matches``); every other change still moves the revision.

``apply_plain_puts(payload)`` applies the common entry (a put, or a txn with no compare, no
failure branch and only puts, none with a lease or an ``ignore_*`` flag) from its msgpack
form without building the request objects, with the same checks; it answers None, having
changed nothing, for anything else, which then takes the general path.

``from_snapshot(data)`` reads a store snapshot stream (``kvserver.mvcc.snapshot``) into the
current records, the compact revision, the revision and the dedup table.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from operator import attrgetter
from typing import Any

import msgpack
from sortedcontainers import SortedList

from kvserver.kvpb.errors import (
    CodecError,
    CompactedError,
    EtcdError,
    FutureRevisionError,
    InvalidArgumentError,
    KeyNotFoundError,
    LeaseNotFoundError,
)
from kvserver.kvpb.kv import (
    ApplyResult,
    CompactionRequest,
    Compare,
    CompareResult,
    CompareTarget,
    DeleteRangeRequest,
    Event,
    EventType,
    KeyValue,
    PutRequest,
    RangeRequest,
    TxnRequest,
)
from kvserver.mvcc.codec import decode_entry
from kvserver.mvcc.dedup import DEFAULT_IDS_PER_CLIENT, DEFAULT_MAX_CLIENTS, MISS, DedupTable
from kvserver.mvcc.snapshot import SnapshotLoader
from kvserver.mvcc.validate import (
    DEFAULT_MAX_TXN_OPS,
    check_compaction,
    check_delete,
    check_put,
    check_txn,
)

_PUT = EventType.PUT
_DELETE = EventType.DELETE
_EMPTY_KV = KeyValue(b"")  # what a compare sees for a missing key (as the store)
_KEY = attrgetter("key")
_APPLIED = True  # the outcome the dedup table keeps for a write that succeeded
_KV_ENTRY = b"\x94\x01"  # an MVCC entry: [ENTRY_FORMAT_VERSION (1), client, request, body]
_PUT_TAG, _OP_TAG, _TXN_TAG = 11, 14, 15  # kvserver.mvcc.codec.TAGS
# A txn's taken path: (compares held, plans of the nested txns in the taken list, in order).
_Plan = tuple[bool, list["_Plan"]]


def _matches_all(_key: bytes) -> bool:
    return True


class LatestState:
    """The current record of every live key, applied with the store's rules (see the module
    docstring). ``matches`` chooses the keys whose changes become events."""

    def __init__(
        self,
        matches: Callable[[bytes], bool] = _matches_all,
        *,
        max_txn_ops: int = DEFAULT_MAX_TXN_OPS,
    ) -> None:
        self.matches = matches
        self.max_txn_ops = max_txn_ops
        self.lease_exists: Callable[[int], bool] | None = None  # the Lessor's hook
        self._cur: dict[bytes, KeyValue] = {}  # live keys only
        # The live keys in order, for deletes and compares of ranges; None (after a restore)
        # until the first of them needs it.
        self._live: SortedList | None = SortedList()
        self._rev = 1
        self._compact_rev = -1
        self._leases: dict[int, set[bytes]] = {}
        self._dedup = DedupTable(DEFAULT_IDS_PER_CLIENT, DEFAULT_MAX_CLIENTS)
        self._changes = 0  # changes of the open write (the revision moves iff > 0)
        self._events: list[Event] = []  # of them, those of matching keys

    # -- what RaftKV and the Lessor read --------------------------------------------------------

    @property
    def revision(self) -> int:
        return self._rev

    @property
    def compact_revision(self) -> int:
        return self._compact_rev

    @property
    def compaction_pending(self) -> bool:
        return False

    def write_is_large(self, request: Any) -> bool:
        return False  # applied whole: the same events as in steps

    def get(self, key: bytes) -> KeyValue | None:
        return self._cur.get(key)

    def live_items(self) -> list[tuple[bytes, KeyValue]]:
        return sorted(self._cur.items())

    # -- snapshots -----------------------------------------------------------------------------

    @classmethod
    def from_snapshot(
        cls,
        data: bytes | memoryview,
        matches: Callable[[bytes], bool] = _matches_all,
        *,
        max_txn_ops: int = DEFAULT_MAX_TXN_OPS,
    ) -> LatestState:
        """The state of a store snapshot stream (``MVCCStore.serialize``'s bytes)."""
        loader = SnapshotLoader()
        view = memoryview(data)
        for start in range(0, len(view), 1 << 20):
            loader.feed(bytes(view[start : start + (1 << 20)]))
        parts = loader.finish()
        state = cls(matches, max_txn_ops=max_txn_ops)
        cur = dict(zip(map(_KEY, parts.base), parts.base, strict=True))
        log = parts.log
        cur.update(zip(map(_KEY, log), log, strict=True))  # the last record of each key
        state._cur = {k: kv for k, kv in cur.items() if kv.create_revision != 0}
        state._live = None
        state._rev = parts.revision
        state._compact_rev = parts.compact_revision
        for kv in state._cur.values():
            if kv.lease:
                state._leases.setdefault(kv.lease, set()).add(kv.key)
        state._dedup = DedupTable.from_export(parts.dedup)
        return state

    # -- the state machine ---------------------------------------------------------------------

    def apply(self, request: Any, client_id: int = 0, request_id: int = 0) -> ApplyResult:
        """``MVCCStore.apply``: the events of the write (of matching keys), or its error."""
        if type(request) is RangeRequest:
            return ApplyResult(None, None, (), False, self._rev)  # a read changes nothing
        if client_id == 0:
            try:
                events = self._execute(request)
            except EtcdError as err:
                return ApplyResult(None, err, (), False, self._rev)
            return ApplyResult(None, None, events, False, self._rev)
        seen = self._dedup.client_ids(client_id).get(request_id, MISS)
        if seen is not MISS:
            return ApplyResult(None, None, (), True, self._rev)
        outcome: Any = _APPLIED
        events = ()
        try:
            events = self._execute(request)
        except EtcdError as err:
            outcome = err
        self._remember(client_id, request_id, outcome)
        if outcome is not _APPLIED:
            return ApplyResult(None, outcome, (), False, self._rev)
        return ApplyResult(None, None, events, False, self._rev)

    def apply_entry(self, data: bytes) -> ApplyResult:
        """``MVCCStore.apply_entry``: an undecodable entry is an error that changes nothing."""
        try:
            client_id, request_id, request = decode_entry(data)
        except CodecError as err:
            error = InvalidArgumentError(f"raftkv: undecodable log entry: {err}")
            return ApplyResult(None, error, (), False, self._rev)
        return self.apply(request, client_id, request_id)

    def _remember(self, client_id: int, request_id: int, outcome: Any) -> None:
        ids = self._dedup.client_ids(client_id)
        ids[request_id] = outcome
        if len(ids) > self._dedup.ids_per_client:
            ids.popitem(last=False)

    def _execute(self, request: Any) -> tuple[Event, ...]:
        kind = type(request)
        if kind is PutRequest:
            check_put(request)
            if request.lease:
                self._check_lease(request.lease)
            self._begin()
            try:
                self._put(request)
            finally:
                events = self._end()
            return events
        if kind is DeleteRangeRequest:
            check_delete(request)
            self._begin()
            try:
                self._delete_range(request.key, request.range_end)
            finally:
                events = self._end()
            return events
        if kind is TxnRequest:
            check_txn(request, self.max_txn_ops)
            plan = self._plan(request)
            self._check_plan(request, plan, True)
            self._check_plan(request, plan, False)
            self._begin()
            try:
                self._apply_ops(request, plan)
            finally:
                events = self._end()
            return events
        if kind is CompactionRequest:
            check_compaction(request)
            if request.revision <= self._compact_rev:
                raise CompactedError(compact_revision=self._compact_rev)
            if request.revision > self._rev:
                raise FutureRevisionError()
            self._compact_rev = request.revision
            return ()
        raise InvalidArgumentError(f"raftkv: unknown request type {kind.__name__}")

    def _begin(self) -> None:
        self._changes = 0
        self._events = []

    def _end(self) -> tuple[Event, ...]:
        if not self._changes:
            return ()
        self._rev += 1
        return tuple(self._events)

    def _check_lease(self, lease: int) -> None:
        exists = self.lease_exists
        if exists is not None and not exists(lease):
            raise LeaseNotFoundError()

    def _put(self, r: PutRequest) -> None:
        wrev = self._rev + 1
        key = r.key
        prev = self._cur.get(key)
        value = r.value
        lease = r.lease
        if r.ignore_value or r.ignore_lease:
            if prev is None:
                raise KeyNotFoundError()
            if r.ignore_value:
                value = prev.value
            if r.ignore_lease:
                lease = prev.lease
        if prev is None:
            kv = KeyValue(key, value, wrev, wrev, 1, lease)
            if self._live is not None:
                self._live.add(key)
        else:
            kv = KeyValue(key, value, prev.create_revision, wrev, prev.version + 1, lease)
            if prev.lease and prev.lease != lease:
                self._detach(prev.lease, key)
        if lease and (prev is None or prev.lease != lease):
            self._attach(lease, key)
        self._cur[key] = kv
        self._changes += 1
        if self.matches(key):
            self._events.append(Event(_PUT, kv, prev))

    def _delete_keys(self, keys: list[bytes]) -> None:
        wrev = self._rev + 1
        cur = self._cur
        matches = self.matches
        for k in keys:
            prev = cur.pop(k)
            if prev.lease:
                self._detach(prev.lease, k)
            if matches(k):
                self._events.append(Event(_DELETE, KeyValue(prev.key, b"", 0, wrev, 0, 0), prev))
        if self._live is not None:
            for k in keys:
                self._live.remove(k)
        self._changes += len(keys)

    def _keys_in(self, key: bytes, range_end: bytes) -> list[bytes]:
        """The live keys of etcd's range (``range_end`` empty: ``key`` alone; ``b"\\0"``:
        every key >= ``key``), in key order."""
        if not range_end:
            return [key] if key in self._cur else []
        if range_end != b"\0" and range_end <= key:
            return []
        if self._live is None:
            self._live = SortedList(self._cur)
        if range_end == b"\0":
            return list(self._live.irange(minimum=key))
        return list(self._live.irange(key, range_end, inclusive=(True, False)))

    def _delete_range(self, key: bytes, range_end: bytes) -> None:
        self._delete_keys(self._keys_in(key, range_end))

    def _attach(self, lease: int, key: bytes) -> None:
        keys = self._leases.get(lease)
        if keys is None:
            self._leases[lease] = {key}
        else:
            keys.add(key)

    def _detach(self, lease: int, key: bytes) -> None:
        keys = self._leases.get(lease)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._leases[lease]

    # -- txns ----------------------------------------------------------------------------------

    def _compare(self, c: Compare) -> bool:
        """The store's compare: holds iff it holds for every key in its range; a missing key
        compares as a zero KeyValue, except that a VALUE compare on no key fails."""
        kvs = [self._cur[k] for k in self._keys_in(c.key, c.range_end)]
        if not kvs:
            if c.target == CompareTarget.VALUE:
                return False
            kvs = [_EMPTY_KV]
        target = c.target
        result = c.result
        a: Any
        b: Any
        for kv in kvs:
            if target == CompareTarget.VALUE:
                a, b = kv.value, c.value
            elif target == CompareTarget.VERSION:
                a, b = kv.version, c.version
            elif target == CompareTarget.CREATE:
                a, b = kv.create_revision, c.create_revision
            elif target == CompareTarget.MOD:
                a, b = kv.mod_revision, c.mod_revision
            else:
                a, b = kv.lease, c.lease
            if result == CompareResult.EQUAL:
                ok = a == b
            elif result == CompareResult.NOT_EQUAL:
                ok = a != b
            elif result == CompareResult.GREATER:
                ok = a > b
            else:
                ok = a < b
            if not ok:
                return False
        return True

    def _plan(self, t: TxnRequest) -> _Plan:
        ok = all(self._compare(c) for c in t.compare)
        ops = t.success if ok else t.failure
        return ok, [self._plan(op.request_txn) for op in ops if op.request_txn is not None]

    def _check_plan(self, t: TxnRequest, plan: _Plan, puts: bool) -> None:
        ok, subs = plan
        nested = iter(subs)
        for op in t.success if ok else t.failure:
            if op.request_txn is not None:
                self._check_plan(op.request_txn, next(nested), puts)
            elif puts and op.request_put is not None:
                p = op.request_put
                if (p.ignore_value or p.ignore_lease) and p.key not in self._cur:
                    raise KeyNotFoundError()
                if p.lease:
                    self._check_lease(p.lease)
            elif not puts and op.request_range is not None:
                rr = op.request_range
                if rr.revision != 0:
                    if rr.revision > self._rev:
                        raise FutureRevisionError()
                    if rr.revision < self._compact_rev:
                        raise CompactedError(compact_revision=self._compact_rev)

    def _apply_ops(self, t: TxnRequest, plan: _Plan) -> None:
        ok, subs = plan
        nested = iter(subs)
        for op in t.success if ok else t.failure:
            if op.request_put is not None:
                self._put(op.request_put)
            elif op.request_delete_range is not None:
                d = op.request_delete_range
                self._delete_range(d.key, d.range_end)
            elif op.request_txn is not None:
                self._apply_ops(op.request_txn, next(nested))

    # -- leases (the Lessor's calls) -----------------------------------------------------------

    def keys_with_lease(self, lease_id: int) -> list[bytes]:
        return sorted(self._leases.get(lease_id, ()))

    def lease_ids(self) -> list[int]:
        return sorted(self._leases)

    def lease_key_count(self, lease_id: int) -> int:
        return len(self._leases.get(lease_id, ()))

    def delete_keys_of_lease_in_steps(self, lease_id: int) -> Generator[None, None, ApplyResult]:
        """``delete_keys_of_lease`` in one step: a replay has no loop to give way to."""
        return self.delete_keys_of_lease(lease_id)
        yield  # a generator, as the store's

    def delete_keys_of_lease(self, lease_id: int) -> ApplyResult:
        """The attached keys deleted in one revision, in key order (none: no revision)."""
        keys = self.keys_with_lease(lease_id)
        self._begin()
        try:
            self._delete_keys(keys)
        finally:
            events = self._end()
        return ApplyResult(None, None, events, False, self._rev)

    # -- the common entry, from its msgpack form -----------------------------------------------

    def apply_plain_puts(self, payload: bytes) -> tuple[Event, ...] | None:
        """Apply a plain-puts entry (see the module docstring): its events, or None (nothing
        changed) when ``payload`` is any other entry."""
        if payload[:2] != _KV_ENTRY:
            return None
        try:
            plain = msgpack.unpackb(payload, raw=False)
        except Exception:  # noqa: BLE001 - the general path reports it as the store does
            return None
        if len(plain) != 4 or plain[0] != 1:
            return None
        _, client_id, request_id, body = plain
        if type(client_id) is not int or type(request_id) is not int or type(body) is not list:
            return None
        if not body or type(body[0]) is not int:
            return None
        puts: list | None = None
        if body[0] == _PUT_TAG:
            puts = [body]
        elif body[0] == _TXN_TAG:
            puts = _txn_puts(body, self.max_txn_ops)
        if puts is None:
            return None
        for p in puts:
            if not _plain_put(p):
                return None
        if client_id:
            ids = self._dedup.client_ids(client_id)
            if ids.get(request_id, MISS) is not MISS:
                return ()
        wrev = self._rev + 1
        cur = self._cur
        matches = self.matches
        events = []
        for p in puts:
            key = p[1]
            prev = cur.get(key)
            if prev is None:
                kv = KeyValue(key, p[2], wrev, wrev, 1, 0)
                if self._live is not None:
                    self._live.add(key)
            else:
                kv = KeyValue(key, p[2], prev.create_revision, wrev, prev.version + 1, 0)
                if prev.lease:
                    self._detach(prev.lease, key)
            cur[key] = kv
            if matches(key):
                events.append(Event(_PUT, kv, prev))
        if puts:
            self._rev = wrev
        if client_id:
            self._remember(client_id, request_id, _APPLIED)
        return tuple(events)


def _plain_put(p: Any) -> bool:
    """A PutRequest array ``[11, key, value, lease, prev_kv, ignore_value, ignore_lease]``
    that ``check_put`` accepts, with no lease and no ``ignore_*`` flag."""
    return (
        type(p) is list
        and len(p) == 7
        and p[0] == _PUT_TAG
        and type(p[0]) is int
        and type(p[1]) is bytes
        and p[1] != b""
        and type(p[2]) is bytes
        and p[3] == 0
        and type(p[3]) is int
        and type(p[4]) is bool
        and p[5] is False
        and p[6] is False
    )


def _txn_puts(body: list, max_txn_ops: int) -> list | None:
    """The put arrays of a TxnRequest array ``[15, compares, success, failure]`` with no
    compare, no failure op and only put ops on distinct keys (what ``check_txn`` accepts), or
    None."""
    if len(body) != 4:
        return None
    _, compares, success, failure = body
    if compares != [] or failure != [] or type(success) is not list:
        return None
    if len(success) > max_txn_ops:
        return None
    puts = []
    for op in success:
        if (
            type(op) is not list
            or len(op) != 5
            or op[0] != _OP_TAG
            or type(op[0]) is not int
            or op[1] is not None
            or op[3] is not None
            or op[4] is not None
        ):
            return None
        puts.append(op[2])
    keys = {p[1] for p in puts if type(p) is list and len(p) == 7 and type(p[1]) is bytes}
    if len(keys) != len(puts):
        return None
    return puts
