"""Ranges of ``MVCCStore`` against a model of nothing but per-key histories.

The model is a plain dict ``key -> [(revision, value or TOMBSTONE), ...]`` written here,
nothing else: it keeps every version for ever and derives ``create_revision`` and ``version``
from the history when asked; compaction only raises the floor below which it refuses reads.
Random puts, deletes, delete-ranges, txns (with a version compare choosing the branch) and
compactions (done at once, or in the background with random ``compact_step`` budgets between
operations) are applied to both; ranges with a random ``[key, range_end)``, ``limit``,
``count_only`` and ``keys_only``, at the current revision and at random historical ones,
must answer the same kvs, ``count`` (etcd's: every key of the range at that revision,
whatever the limit), ``more`` and header revision; a read below the compact revision fails
with ``CompactedError``, one above the current revision with ``FutureRevisionError``.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvserver.kvpb.errors import CompactedError, FutureRevisionError
from kvserver.kvpb.kv import (
    Compare,
    CompareResult,
    CompareTarget,
    DeleteRangeRequest,
    KeyValue,
    PutRequest,
    RequestOp,
)
from kvserver.mvcc.store import MVCCStore

KEYS = [b"a", b"a\x00", b"ab", b"b", b"ba", b"c", b"d", b"\xfe", b"\xff"]
ENDS = [b"", b"\0", *KEYS, b"e", b"\xff\xff"]  # "" = the key alone, "\0" = every key >= key
TOMBSTONE = None

keys = st.sampled_from(KEYS)
values = st.binary(max_size=3)


@dataclass(frozen=True)
class Write:
    kind: str  # "put" | "delete"
    key: bytes
    end: bytes = b""  # delete: "" = one key
    value: bytes = b""


def in_range(k: bytes, key: bytes, end: bytes) -> bool:
    if not end:
        return k == key
    if end == b"\0":
        return k >= key
    return key <= k < end


class Model:
    def __init__(self) -> None:
        self.hist: dict[bytes, list[tuple[int, bytes | None]]] = {}
        self.revision = 1
        self.compact_revision = -1

    def live_at(self, key: bytes, revision: int) -> KeyValue | None:
        """The key's version visible at ``revision``, as etcd returns it, or None."""
        versions = [(r, v) for r, v in self.hist.get(key, []) if r <= revision]
        if not versions or versions[-1][1] is TOMBSTONE:
            return None
        start = len(versions) - 1  # the first put of the current generation
        while start > 0 and versions[start - 1][1] is not TOMBSTONE:
            start -= 1
        mod, value = versions[-1]
        assert value is not None
        return KeyValue(key, value, versions[start][0], mod, len(versions) - start, 0)

    def live(self, key: bytes, end: bytes, revision: int) -> list[KeyValue]:
        found = (self.live_at(k, revision) for k in sorted(self.hist) if in_range(k, key, end))
        return [kv for kv in found if kv is not None]

    def apply(self, writes: list[Write]) -> None:
        """One write txn, at the next revision if anything changes; a delete sees the txn's
        earlier writes (two deletes of one txn may overlap; puts overlap nothing)."""
        rev = self.revision + 1
        changed = False
        for w in writes:
            if w.kind == "put":
                self.hist.setdefault(w.key, []).append((rev, w.value))
                changed = True
            else:
                for kv in self.live(w.key, w.end, self.revision):
                    if self.hist[kv.key][-1] != (rev, TOMBSTONE):
                        self.hist[kv.key].append((rev, TOMBSTONE))
                        changed = True
        if changed:
            self.revision = rev


def request_op(w: Write) -> RequestOp:
    if w.kind == "put":
        return RequestOp(request_put=PutRequest(w.key, w.value))
    return RequestOp(request_delete_range=DeleteRangeRequest(w.key, w.end))


def overlaps(a: Write, b: Write) -> bool:
    """Whether a txn may not hold both (etcd: a key is written at most once per txn)."""
    if a.kind == "put" and b.kind == "put":
        return a.key == b.key
    if a.kind == "put":
        return in_range(a.key, b.key, b.end)
    if b.kind == "put":
        return in_range(b.key, a.key, a.end)
    return False


puts = st.builds(Write, st.just("put"), keys, st.just(b""), values)
deletes = st.builds(Write, st.just("delete"), keys, st.sampled_from(ENDS))


@st.composite
def write_lists(draw: st.DrawFn) -> list[Write]:
    chosen: list[Write] = []
    for w in draw(st.lists(st.one_of(puts, deletes), max_size=4)):
        if not any(overlaps(w, c) for c in chosen):
            chosen.append(w)
    return chosen


class RangeMachine(RuleBasedStateMachine):
    @initialize(background=st.booleans())
    def start(self, background: bool) -> None:
        self.store = MVCCStore(compact_in_background=background)
        self.model = Model()

    @rule(w=st.one_of(puts, deletes))
    def write(self, w: Write) -> None:
        if w.kind == "put":
            resp = self.store.put(w.key, w.value)
        else:
            resp = self.store.delete_range(w.key, w.end)  # type: ignore[assignment]
        self.model.apply([w])
        assert resp.header.revision == self.model.revision

    @rule(
        compare_key=keys,
        version=st.integers(0, 3),
        success=write_lists(),
        failure=write_lists(),
    )
    def txn(
        self, compare_key: bytes, version: int, success: list[Write], failure: list[Write]
    ) -> None:
        current = self.model.live_at(compare_key, self.model.revision)
        took = (current.version if current else 0) == version
        resp = self.store.txn(
            [Compare(CompareResult.EQUAL, CompareTarget.VERSION, compare_key, version=version)],
            [request_op(w) for w in success],
            [request_op(w) for w in failure],
        )
        self.model.apply(success if took else failure)
        assert resp.succeeded == took
        assert resp.header.revision == self.model.revision

    @precondition(lambda self: self.model.compact_revision < self.model.revision)
    @rule(data=st.data())
    def compact(self, data: st.DataObject) -> None:
        low = max(self.model.compact_revision + 1, 1)
        rev = data.draw(st.integers(low, self.model.revision), label="compact to")
        self.store.compact(rev)
        self.model.compact_revision = rev

    @rule(budget=st.integers(1, 4))
    def compact_step(self, budget: int) -> None:
        self.store.compact_step(budget)  # a no-op unless a background compaction is pending

    @rule(
        data=st.data(),
        key=keys,
        end=st.sampled_from(ENDS),
        limit=st.integers(0, 4),
        count_only=st.booleans(),
        keys_only=st.booleans(),
    )
    def range(
        self,
        data: st.DataObject,
        key: bytes,
        end: bytes,
        limit: int,
        count_only: bool,
        keys_only: bool,
    ) -> None:
        m = self.model
        floor = max(m.compact_revision, 1)
        revision = data.draw(
            st.one_of(st.just(0), st.just(floor), st.integers(floor, m.revision)),
            label="revision",
        )
        resp = self.store.range(
            key, end, revision=revision, limit=limit, count_only=count_only, keys_only=keys_only
        )
        live = m.live(key, end, revision or m.revision)
        kvs = [] if count_only else live[:limit] if limit else live
        if keys_only:
            kvs = [
                KeyValue(kv.key, b"", kv.create_revision, kv.mod_revision, kv.version) for kv in kvs
            ]
        assert list(resp.kvs) == kvs
        assert resp.count == len(live)
        assert resp.more == (not count_only and 0 < limit < len(live))
        assert resp.header.revision == m.revision

    @precondition(lambda self: self.model.compact_revision > 1)
    @rule(data=st.data(), key=keys, end=st.sampled_from(ENDS), count_only=st.booleans())
    def range_below_compaction(
        self, data: st.DataObject, key: bytes, end: bytes, count_only: bool
    ) -> None:
        revision = data.draw(st.integers(1, self.model.compact_revision - 1), label="revision")
        with pytest.raises(CompactedError):
            self.store.range(key, end, revision=revision, count_only=count_only)

    @rule(key=keys, end=st.sampled_from(ENDS), ahead=st.integers(1, 3))
    def range_in_the_future(self, key: bytes, end: bytes, ahead: int) -> None:
        with pytest.raises(FutureRevisionError):
            self.store.range(key, end, revision=self.model.revision + ahead)

    @invariant()
    def every_revision_agrees(self) -> None:
        """The whole keyspace at every revision still readable, and the revisions."""
        if not hasattr(self, "store"):
            return
        m = self.model
        assert self.store.revision == m.revision
        assert self.store.compact_revision == m.compact_revision
        for revision in range(max(m.compact_revision, 1), m.revision + 1):
            resp = self.store.range(b"\x00", b"\0", revision=revision)
            live = m.live(b"\x00", b"\0", revision)
            assert (list(resp.kvs), resp.count) == (live, len(live)), revision


RangeMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_range_model = RangeMachine.TestCase
