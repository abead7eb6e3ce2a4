"""A snapshot stream continued from an earlier one (``MVCCStore.serialize_after``) decodes
to exactly what a whole new stream decodes to, and is refused after a compaction.

The model here is the store's own full ``serialize``, which other tests pin against an
independent model; what these tests check is that the continuation, built from the earlier
stream's bytes and the versions since, loses, repeats or reorders nothing: random puts,
deletes, range deletes and retried client writes (the deduplication table), a compaction
before the earlier stream (so it has a base section), and streams chained several times.
"""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvserver.mvcc import (
    CompactionRequest,
    DeleteRangeRequest,
    MVCCStore,
    PutRequest,
    SnapshotFormatError,
    SnapshotLoader,
)
from kvserver.mvcc.snapshot import FORMAT_VERSION, MAGIC, StreamLayout, read_layout

_KEYS = st.binary(min_size=1, max_size=3)
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), _KEYS, st.binary(max_size=40), st.integers(0, 3)),
        st.tuples(st.just("del"), _KEYS, st.just(b""), st.integers(0, 3)),
        st.tuples(st.just("range"), _KEYS, _KEYS, st.integers(0, 3)),
    ),
    max_size=40,
)


def _apply(store: MVCCStore, ops: list, request_ids: list[int]) -> None:
    for op, key, arg, client in ops:
        if op == "put":
            request = PutRequest(key, arg)
        elif op == "del":
            request = DeleteRangeRequest(key)
        else:
            request = DeleteRangeRequest(min(key, arg), max(key, arg) + b"\0")
        # every third write of a client repeats its previous request id: a retry
        request_ids[client] += int(request_ids[client] % 3 != 2)
        store.apply(request, client_id=client, request_id=request_ids[client])


def _decoded(chunks) -> object:
    loader = SnapshotLoader()
    for chunk in chunks:
        loader.feed(bytes(chunk))
    return loader.finish()


@settings(max_examples=150, deadline=None)
@given(
    before=_OPS,
    compact=st.booleans(),
    rounds=st.lists(_OPS, min_size=1, max_size=3),
    chunk=st.sampled_from([64, 1024, 64 * 1024]),
)
def test_a_continued_stream_decodes_as_a_whole_one(before, compact, rounds, chunk):
    store = MVCCStore()
    request_ids = [0, 0, 0, 0]
    store.apply(PutRequest(b"first", b"v"))
    _apply(store, before, request_ids)
    if compact:
        store.apply(CompactionRequest(store.revision))
    prev = b"".join(store.serialize(chunk))
    layout = read_layout(prev)
    for ops in rounds:
        _apply(store, ops, request_ids)
        reported: list[StreamLayout] = []
        continued = store.serialize_after(prev, layout, chunk, reported.append)
        assert continued is not None
        parts = list(continued)
        assert any(isinstance(p, memoryview) for p in parts)  # the earlier body, not copied
        whole = b"".join(store.serialize(chunk))
        assert _decoded(parts) == _decoded([whole])
        prev = b"".join(parts)
        # the layout reported from making the stream is the one read back from it, and the
        # next round continues from the reported one
        assert reported == [read_layout(prev)]
        layout = reported[0]


def test_the_layout_names_the_body_and_the_counts():
    store = MVCCStore()
    for i in range(300):
        store.apply(PutRequest(b"k%03d" % (i % 100), b"v%d" % i))
    store.apply(CompactionRequest(250))
    stream = b"".join(store.serialize(512))
    layout = read_layout(stream)
    assert (layout.revision, layout.compact_revision) == (301, 250)
    # revisions 2..301; the version at exactly 250 is in the log (from the compact revision on)
    assert (layout.base_count, layout.log_count) == (99, 52)
    header = msgpack.packb(
        {"magic": MAGIC, "version": FORMAT_VERSION, "revision": 301, "compact_revision": 250}
    )
    assert layout.body_start == len(header)
    body = msgpack.Unpacker(raw=False)
    body.feed(stream[layout.body_start : layout.body_end])
    sections = [obj[0] for obj in body]
    assert sections == sorted(sections) and set(sections) == {"base", "log"}


def test_a_compaction_since_refuses_a_continuation():
    store = MVCCStore()
    for i in range(50):
        store.apply(PutRequest(b"k%02d" % (i % 10), b"v"))
    prev = b"".join(store.serialize())
    layout = read_layout(prev)
    store.apply(PutRequest(b"k00", b"later"))
    store.apply(CompactionRequest(store.revision - 1))
    assert store.serialize_after(prev, layout) is None


@pytest.mark.parametrize(
    "damage",
    [
        lambda s: s[:-1],  # truncated
        lambda s: s + b"\xc0",  # trailing bytes
        lambda s: (
            msgpack.packb({"magic": MAGIC, "version": 1, "revision": 1, "compact_revision": 0})
            + s[s.index(b"\x92") :]
        ),
        lambda s: b"\x00" + s,
        lambda s: b"",
    ],
)
def test_a_damaged_or_older_stream_has_no_layout(damage):
    store = MVCCStore()
    for i in range(20):
        store.apply(PutRequest(b"k%02d" % i, b"v"))
    with pytest.raises(SnapshotFormatError):
        read_layout(damage(b"".join(store.serialize())))
