"""Property tests: the MVCC store against a naive model of etcd's data model.

The model keeps a full copy of the keyspace for every revision (``states[rev]: key ->
KeyValue``) and a flat list of events; compaction only moves a floor. It knows nothing of
generations, history lists, change logs, snapshots or dedup tables. Random sequences of
put / delete-range / txn / compact / range-at-revision / watch replay / lease revoke /
retried writes / snapshot-and-restore must give identical responses, errors, events and
observable state in both.

The model's reads are its own: which keys a range selects (key, range end, prefix), the
revision filters, the sort, the limit and ``more``, ``count``, ``count_only`` and
``keys_only`` are written here plainly from etcd's rules, sharing no code with the store, so
that the comparison can catch a store bug in them.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvserver.kvpb.errors import (
    MSG_DUPLICATE_KEY,
    MSG_LEASE_PROVIDED,
    MSG_VALUE_PROVIDED,
)
from kvserver.mvcc import (
    CompactedError,
    CompactionRequest,
    CompactionResponse,
    Compare,
    CompareResult,
    CompareTarget,
    DeleteRangeRequest,
    DeleteRangeResponse,
    Event,
    EventType,
    FutureRevisionError,
    InvalidArgumentError,
    KeyNotFoundError,
    KeyValue,
    LeaseNotFoundError,
    MVCCStore,
    PutRequest,
    PutResponse,
    RangeRequest,
    RangeResponse,
    RequestOp,
    ResponseHeader,
    ResponseOp,
    SortOrder,
    SortTarget,
    TxnRequest,
    TxnResponse,
)
from kvserver.mvcc.store import record_size_bytes

KEYS = [b"a", b"ab", b"b", b"c", b"\xff"]
VALUES = [b"", b"x", b"y", b"zz"]
LEASES = [0, 0, 0, 1, 1, 3, 3, 2]  # lease 2 does not exist
BAD_LEASE = 2


def lease_exists(lease: int) -> bool:
    return lease != BAD_LEASE


def hdr(rev: int) -> ResponseHeader:
    return ResponseHeader(0, 0, rev, 0)


# The model's own reading of etcd's range conventions, written from etcd's documentation and
# not shared with the store, so that a store bug in them shows.


def in_range(k: bytes, key: bytes, range_end: bytes) -> bool:
    """No range end: the key itself. Range end "\\0": every key from ``key`` on. Otherwise
    the keys in [key, range_end)."""
    if range_end == b"":
        return k == key
    if range_end == b"\0":
        return k >= key
    return key <= k and k < range_end


def prefix_end(prefix: bytes) -> bytes:
    """The range end that selects every key starting with ``prefix``: the prefix up to its
    last byte below 0xff, that byte incremented; "\\0" (no end) if every byte is 0xff."""
    for i in reversed(range(len(prefix))):
        if prefix[i] < 0xFF:
            return prefix[:i] + bytes([prefix[i] + 1])
    return b"\0"


SORT_FIELD = {
    SortTarget.KEY: "key",
    SortTarget.VERSION: "version",
    SortTarget.CREATE: "create_revision",
    SortTarget.MOD: "mod_revision",
    SortTarget.VALUE: "value",
}


class Model:
    def __init__(self) -> None:
        self.rev = 1
        self.compact = -1
        self.states: dict[int, dict[bytes, KeyValue]] = {1: {}}
        self.events: list[Event] = []
        self.dedup: dict[int, object] = {}

    # -- reads ---------------------------------------------------------------------------------
    def live(self, state, key, end) -> list[KeyValue]:
        return [state[k] for k in sorted(state) if in_range(k, key, end)]

    def do_range(self, r: RangeRequest, state, cur_rev: int) -> RangeResponse:
        rev = r.revision
        if rev > cur_rev:
            raise FutureRevisionError()
        if rev <= 0:
            rev = cur_rev
        if rev < self.compact:
            raise CompactedError()
        # `state` is the working state when cur_rev == rev inside a txn
        source = state if rev == cur_rev else self.states[rev]
        selected = [kv for k, kv in source.items() if in_range(k, r.key, r.range_end)]
        count = len(selected)  # every key in the range: the options below only shape kvs
        if r.count_only:
            return RangeResponse(hdr(cur_rev), (), False, count)
        kvs = [
            kv
            for kv in selected
            if (not r.min_mod_revision or kv.mod_revision >= r.min_mod_revision)
            and (not r.max_mod_revision or kv.mod_revision <= r.max_mod_revision)
            and (not r.min_create_revision or kv.create_revision >= r.min_create_revision)
            and (not r.max_create_revision or kv.create_revision <= r.max_create_revision)
        ]
        kvs = sorted(kvs, key=lambda kv: kv.key)  # unsorted means in key order
        filtered = r.min_mod_revision or r.max_mod_revision
        filtered = filtered or r.min_create_revision or r.max_create_revision
        if r.sort_order == SortOrder.NONE and r.limit > 0 and not filtered:
            # etcd fetches limit + 1 keys (in key order) before it defaults a sort target
            # without an order to ASCEND: such a sort only orders that first page.
            kvs = kvs[: r.limit + 1]
        field = SORT_FIELD[r.sort_target]
        if r.sort_order == SortOrder.DESCEND:
            kvs = sorted(kvs, key=lambda kv: getattr(kv, field), reverse=True)
        elif r.sort_order == SortOrder.ASCEND or r.sort_target != SortTarget.KEY:
            kvs = sorted(kvs, key=lambda kv: getattr(kv, field))  # a target alone: ascending
        more = False
        if r.limit > 0 and len(kvs) > r.limit:
            kvs, more = kvs[: r.limit], True
        if r.keys_only:
            kvs = [
                KeyValue(kv.key, b"", kv.create_revision, kv.mod_revision, kv.version, kv.lease)
                for kv in kvs
            ]
        return RangeResponse(hdr(cur_rev), tuple(kvs), more, count)

    def compare(self, c: Compare) -> bool:
        kvs = self.live(self.states[self.rev], c.key, c.range_end)
        if not kvs:
            if c.target == CompareTarget.VALUE:
                return False
            kvs = [KeyValue(b"")]
        field = ["version", "create_revision", "mod_revision", "value", "lease"][c.target]
        for kv in kvs:
            a, b = getattr(kv, field), getattr(c, field)
            ok = {
                CompareResult.EQUAL: a == b,
                CompareResult.NOT_EQUAL: a != b,
                CompareResult.GREATER: a > b,
                CompareResult.LESS: a < b,
            }[c.result]
            if not ok:
                return False
        return True

    # -- writes --------------------------------------------------------------------------------
    def check_put_request(self, p: PutRequest) -> None:
        if p.ignore_value and p.value:
            raise InvalidArgumentError(MSG_VALUE_PROVIDED)
        if p.ignore_lease and p.lease:
            raise InvalidArgumentError(MSG_LEASE_PROVIDED)

    def put(self, p: PutRequest, work, evs) -> PutResponse:
        wrev = self.rev + 1
        prev = work.get(p.key)
        value, lease = p.value, p.lease
        if p.ignore_value:
            value = prev.value
        if p.ignore_lease:
            lease = prev.lease
        if prev is None:
            kv = KeyValue(p.key, value, wrev, wrev, 1, lease)
        else:
            kv = KeyValue(p.key, value, prev.create_revision, wrev, prev.version + 1, lease)
        work[p.key] = kv
        evs.append(Event(EventType.PUT, kv, prev))
        return PutResponse(hdr(wrev), prev if p.prev_kv else None)

    def delete(self, d: DeleteRangeRequest, work, evs) -> DeleteRangeResponse:
        wrev = self.rev + 1
        gone = self.live(work, d.key, d.range_end)
        for kv in gone:
            del work[kv.key]
            evs.append(Event(EventType.DELETE, KeyValue(kv.key, b"", 0, wrev, 0, 0), kv))
        rev = wrev if evs else self.rev
        return DeleteRangeResponse(hdr(rev), len(gone), tuple(gone) if d.prev_kv else ())

    def commit(self, work, evs) -> None:
        if evs:
            self.rev += 1
            self.states[self.rev] = work
            self.events.extend(evs)

    def execute(self, req):
        """(response, events) or raises, like MVCCStore.apply without dedup."""
        cur = self.states[self.rev]
        if isinstance(req, RangeRequest):
            return self.do_range(req, cur, self.rev), ()
        if isinstance(req, CompactionRequest):
            if req.revision <= self.compact:
                raise CompactedError()
            if req.revision > self.rev:
                raise FutureRevisionError()
            self.compact = req.revision
            return CompactionResponse(hdr(self.rev)), ()
        work, evs = dict(cur), []
        if isinstance(req, PutRequest):
            self.check_put_request(req)
            if req.lease and not lease_exists(req.lease):
                raise LeaseNotFoundError()
            if (req.ignore_value or req.ignore_lease) and req.key not in cur:
                raise KeyNotFoundError()
            resp = self.put(req, work, evs)
        elif isinstance(req, DeleteRangeRequest):
            resp = self.delete(req, work, evs)
        else:
            resp = self.txn(req, work, evs)
        self.commit(work, evs)
        return resp, tuple(evs)

    def txn(self, t: TxnRequest, work, evs) -> TxnResponse:
        for op in t.success + t.failure:
            if op.request_put is not None:
                self.check_put_request(op.request_put)
        for branch in (t.success, t.failure):  # flat txns only: a simple overlap check
            puts = [op.request_put.key for op in branch if op.request_put is not None]
            dels = [op.request_delete_range for op in branch if op.request_delete_range]
            if len(set(puts)) != len(puts) or any(
                in_range(k, d.key, d.range_end) for k in puts for d in dels
            ):
                raise InvalidArgumentError(MSG_DUPLICATE_KEY)
        ok = all(self.compare(c) for c in t.compare)
        ops = t.success if ok else t.failure
        for op in ops:
            p = op.request_put
            if p is not None:
                if (p.ignore_value or p.ignore_lease) and p.key not in work:
                    raise KeyNotFoundError()
                if p.lease and not lease_exists(p.lease):
                    raise LeaseNotFoundError()
        for op in ops:
            r = op.request_range
            if r is not None and r.revision != 0:
                if r.revision > self.rev:
                    raise FutureRevisionError()
                if r.revision < self.compact:
                    raise CompactedError()
        out = []
        for op in ops:
            if op.request_put is not None:
                out.append(ResponseOp(response_put=self.put(op.request_put, work, evs)))
            elif op.request_delete_range is not None:
                resp = self.delete(op.request_delete_range, work, evs)
                out.append(ResponseOp(response_delete_range=resp))
            else:
                cur_rev = self.rev + 1 if evs else self.rev
                resp = self.do_range(op.request_range, work, cur_rev)
                out.append(ResponseOp(response_range=resp))
        return TxnResponse(hdr(self.rev + (1 if evs else 0)), ok, tuple(out))

    def revoke(self, lease: int):
        cur = self.states[self.rev]
        work, evs = dict(cur), []
        gone = [kv for kv in self.live(cur, b"\0", b"\0") if kv.lease == lease]
        for kv in gone:
            del work[kv.key]
            evs.append(Event(EventType.DELETE, KeyValue(kv.key, b"", 0, self.rev + 1, 0, 0), kv))
        self.commit(work, evs)
        return DeleteRangeResponse(hdr(self.rev), len(gone), tuple(gone)), tuple(evs)

    def events_since(self, rev: int, key: bytes, end: bytes, prev_kv: bool) -> list[Event]:
        if rev < self.compact:
            raise CompactedError()
        out = []
        for e in self.events:
            m = e.kv.mod_revision
            if m < rev or not in_range(e.kv.key, key, end):
                continue
            if m == self.compact and e.type == EventType.DELETE:
                continue
            prev = None
            if prev_kv and e.kv.version != 1 and m - 1 >= self.compact:
                prev = self.states[m - 1].get(e.kv.key)
            out.append(Event(e.type, e.kv, prev))
        return out


# ---------------------------------------------------------------------------------------------
# Strategies. Weights keep the keyspace populated (puts dominate, most deletes hit one key,
# few puts carry ignore flags or the unknown lease) so ranges, limits and compares see data.
# Range revisions are drawn relative to the current revision (see ``resolve``).

keys = st.sampled_from(KEYS)
revision_offsets = st.integers(min_value=-4, max_value=1)


@st.composite
def ranges_end(draw, key, single_weight=1):
    kinds = ["single"] * single_weight + ["prefix", "prefix", "range", "range", "open"]
    kind = draw(st.sampled_from(kinds))
    if kind == "single":
        return b""
    if kind == "prefix":
        return prefix_end(key)
    if kind == "open":
        return b"\0"
    return draw(keys)


@st.composite
def put_requests(draw):
    key = draw(keys)
    ignore_value = draw(st.integers(0, 7)) == 0
    ignore_lease = draw(st.integers(0, 7)) == 0
    invalid = draw(st.integers(0, 7)) == 0  # sometimes a value/lease next to an ignore flag
    value = b"" if ignore_value and not invalid else draw(st.sampled_from(VALUES))
    lease = 0 if ignore_lease and not invalid else draw(st.sampled_from(LEASES))
    return PutRequest(key, value, lease, draw(st.booleans()), ignore_value, ignore_lease)


@st.composite
def delete_requests(draw):
    key = draw(keys)
    return DeleteRangeRequest(key, draw(ranges_end(key, single_weight=6)), draw(st.booleans()))


@st.composite
def range_requests(draw):
    key = draw(keys)
    filters = draw(st.sampled_from([(0, 0, 0, 0)] * 4 + [(3, 0, 0, 0), (0, 6, 0, 0), (0, 0, 2, 5)]))
    return RangeRequest(
        key,
        draw(ranges_end(key)),
        limit=draw(st.sampled_from([0, 0, 1, 2, 3, -1])),
        # relative: 0 = current (as is), otherwise current + offset; see resolve()
        revision=draw(st.sampled_from([0, 0, 0, -1, -2, -3, -5, 1])),
        sort_order=draw(st.sampled_from(list(SortOrder))),
        sort_target=draw(st.sampled_from(list(SortTarget))),
        keys_only=draw(st.booleans()),
        count_only=draw(st.integers(0, 5)) == 0,
        min_mod_revision=filters[0],
        max_mod_revision=filters[1],
        min_create_revision=filters[2],
        max_create_revision=filters[3],
    )


def resolve(req, rev: int):
    """Turn the relative revisions of generated ranges into absolute ones."""
    if isinstance(req, RangeRequest):
        return req if req.revision == 0 else replace(req, revision=rev + req.revision)
    if isinstance(req, TxnRequest):

        def ops(items):
            return tuple(
                RequestOp.of(resolve(op.request_range, rev)) if op.request_range else op
                for op in items
            )

        return replace(req, success=ops(req.success), failure=ops(req.failure))
    return req


@st.composite
def compares(draw):
    key = draw(keys)
    end = draw(st.sampled_from([b"", b"", prefix_end(key)]))
    target = draw(st.sampled_from(list(CompareTarget)))
    result = draw(st.sampled_from(list(CompareResult)))
    number = draw(st.integers(min_value=0, max_value=8))
    return Compare(
        result,
        target,
        key,
        version=number,
        create_revision=number,
        mod_revision=number,
        value=draw(st.sampled_from(VALUES)),
        lease=draw(st.sampled_from([0, 1, 3])),
        range_end=end,
    )


txn_ops = st.sampled_from([put_requests, put_requests, delete_requests, range_requests]).flatmap(
    lambda make: make().map(RequestOp.of)
)


@st.composite
def txn_requests(draw):
    return TxnRequest(
        tuple(draw(st.lists(compares(), max_size=2))),
        tuple(draw(st.lists(txn_ops, max_size=3))),
        tuple(draw(st.lists(txn_ops, max_size=3))),
    )


_WEIGHTED = [
    (6, st.tuples(st.just("apply"), put_requests())),
    (2, st.tuples(st.just("apply"), delete_requests())),
    (3, st.tuples(st.just("apply"), txn_requests())),
    (3, st.tuples(st.just("apply"), range_requests())),
    (2, st.tuples(st.just("compact"), revision_offsets)),
    (1, st.tuples(st.just("events"), revision_offsets, keys, st.booleans())),
    (1, st.tuples(st.just("events_from_compact"), st.integers(0, 1), keys, st.booleans())),
    (1, st.tuples(st.just("retry"), st.integers(min_value=1, max_value=5))),
    (1, st.tuples(st.just("revoke"), st.sampled_from([1, 3]))),
    (1, st.tuples(st.just("snapshot"), st.sampled_from([64, 512, 65536]))),
]
# (st.one_of would collapse repeated branches, so pick a branch index by weight first)
operations = st.sampled_from(
    [i for i, (weight, _) in enumerate(_WEIGHTED) for _ in range(weight)]
).flatmap(lambda i: _WEIGHTED[i][1])


def outcome(fn):
    try:
        return fn(), None
    except (InvalidArgumentError, CompactedError, FutureRevisionError, LeaseNotFoundError) as e:
        return (None, ()), (type(e), str(e))


def check_state(store: MVCCStore, model: Model) -> None:
    """Everything observable: revisions, live keys, leases, every readable past revision and
    the whole replayable event history (with prev_kv)."""
    assert store.revision == model.rev
    assert store.compact_revision == model.compact
    cur = model.states[model.rev]
    assert store.key_count == len(cur)
    assert store.range(b"\0", b"\0").kvs == tuple(cur[k] for k in sorted(cur))
    for lease in (1, 3):
        assert store.keys_with_lease(lease) == sorted(
            k for k, kv in cur.items() if kv.lease == lease
        )
    # the running size totals equal a full recount (after compactions and restores too)
    records = [kv for hist in store._index.values() for kv in hist]
    assert store.history_size == len(records)
    assert store.db_size_bytes == sum(map(record_size_bytes, records))


def run_against_model(ops) -> None:
    store = MVCCStore(lease_exists=lease_exists)
    model = Model()
    client_id = 77
    applied: list[tuple[int, object, object]] = []  # (request_id, request, first result)
    # start from a populated keyspace so that ranges, limits and compares see data
    seed = [
        ("apply", PutRequest(k, b"x", lease))
        for k, lease in zip(KEYS, [0, 1, 0, 3, 0], strict=True)
    ]
    for request_id, op in enumerate(seed + ops, start=1):
        kind = op[0]
        if kind == "apply":
            req = resolve(op[1], model.rev)
            res = store.apply(req, client_id, request_id)
            (resp, evs), err = outcome(lambda req=req: model.execute(req))
            got_err = None if res.error is None else (type(res.error), str(res.error))
            assert got_err == err, (req, res)
            assert res.response == resp, req
            assert res.events == evs
            assert res.revision == model.rev and not res.duplicate
            if not isinstance(req, RangeRequest):
                applied.append((request_id, req, res))
        elif kind == "compact":
            rev = model.rev + op[1]
            res = store.apply(CompactionRequest(rev))
            (resp, _), err = outcome(lambda rev=rev: model.execute(CompactionRequest(rev)))
            assert (None if res.error is None else (type(res.error), str(res.error))) == err
            assert res.response == resp
        elif kind in ("events", "events_from_compact"):
            rev = model.rev + op[1] if kind == "events" else model.compact + op[1]
            key, prev_kv = op[2], op[3]
            for end in (b"", prefix_end(key), b"\0"):
                args = (rev, key, end, prev_kv)
                got, err = outcome(lambda a=args, s=store: s.events_since(*a[:3], prev_kv=a[3]))
                want, werr = outcome(lambda a=args: model.events_since(*a))
                assert err == werr and got == want
        elif kind == "retry":
            if applied:
                rid, req, first = applied[-min(op[1], len(applied))]
                again = store.apply(req, client_id, rid)
                assert again.duplicate and again.events == ()
                assert again.response == first.response and again.error == first.error
        elif kind == "revoke":
            res = store.delete_keys_of_lease(op[1])
            resp, evs = model.revoke(op[1])
            assert res.response == resp and res.events == evs
        elif kind == "snapshot":
            chunks = list(store.serialize(chunk_size_bytes=op[1]))
            restored = MVCCStore.restore(chunks, lease_exists=lease_exists)
            assert b"".join(restored.serialize(chunk_size_bytes=op[1])) == b"".join(chunks)
            store = restored
        check_state(store, model)


_SETTINGS = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
}


@settings(max_examples=100, **_SETTINGS)
@given(st.lists(operations, min_size=20, max_size=60))
def test_store_matches_model(ops):
    """Default suite: 100 random histories (~20-60 operations each)."""
    run_against_model(ops)


@pytest.mark.slow
@settings(max_examples=2000, **_SETTINGS)
@given(st.lists(operations, min_size=20, max_size=150))
def test_store_matches_model_long(ops):
    """Slow suite: many more and longer histories."""
    run_against_model(ops)
