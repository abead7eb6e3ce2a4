"""A snapshot stream reads the live store: bounded work per chunk, no per-key copy, and
physical compaction held off while it is open.

``MVCCStore.serialize`` does not copy the index: it reads it a batch of keys at a time while
the store keeps applying. What makes that safe is that the only change that would alter what
the stream reads, cutting old versions, waits until the stream is done. These tests pin that
rule in both compaction modes, and that a stream of a store whose keys hold nothing for the
base section still yields every few thousand keys (an event loop consuming it is never held
for a scan of the whole key space).
"""

from __future__ import annotations

import gc

from kvserver.mvcc import CompactionRequest, DeleteRangeRequest, MVCCStore, PutRequest
from kvserver.mvcc.snapshot import _KEYS_PER_STEP


def _store(background: bool, keys: int = 200, rounds: int = 3) -> MVCCStore:
    s = MVCCStore(compact_in_background=background)
    for r in range(rounds):
        for i in range(keys):
            s.apply(PutRequest(b"k%05d" % i, b"v%d" % r))
    return s


def test_compaction_waits_for_an_open_stream_in_the_background_mode():
    s = _store(background=True)
    expected = b"".join(_store(background=True).serialize(chunk_size_bytes=512))
    stream = s.serialize(chunk_size_bytes=512)
    got = [next(stream)]
    s.apply(CompactionRequest(s.revision))
    before = s.history_size
    assert s.compact_step(10_000) is True  # work waits: nothing is cut
    assert s.history_size == before
    got.extend(stream)  # exhausted: the hold ends
    assert b"".join(got) == expected
    while s.compact_step(1000):
        pass
    assert s.history_size == 200  # one version per key is left


def test_a_compaction_in_the_default_mode_cuts_when_the_stream_ends():
    s = _store(background=False)
    expected = b"".join(_store(background=False).serialize(chunk_size_bytes=512))
    stream = s.serialize(chunk_size_bytes=512)
    got = [next(stream)]
    s.apply(CompactionRequest(s.revision))
    assert s.history_size == 600  # held off
    got.extend(stream)
    assert b"".join(got) == expected
    assert s.history_size == 200


def test_a_closed_or_dropped_stream_releases_the_hold():
    s = _store(background=True)
    stream = s.serialize()
    next(stream)
    stream.close()
    s.apply(CompactionRequest(s.revision))
    assert s.compact_step(100_000) is False and s.history_size == 200

    s = _store(background=True)
    dropped = s.serialize()
    next(dropped)
    del dropped
    gc.collect()
    s.apply(CompactionRequest(s.revision))
    assert s.compact_step(100_000) is False and s.history_size == 200


def test_writes_while_streaming_do_not_reach_the_stream():
    s = _store(background=True)
    expected = b"".join(s.serialize(chunk_size_bytes=256))
    stream = s.serialize(chunk_size_bytes=256)
    got = [next(stream)]
    for i, chunk in enumerate(stream):
        got.append(chunk)
        s.apply(PutRequest(b"k%05d" % (i % 300), b"later"))  # new keys too
        s.apply(DeleteRangeRequest(b"k%05d" % (i % 7)))
    assert b"".join(got) == expected


def test_a_scan_that_finds_nothing_for_the_base_still_yields():
    """Compacted below every key's only version: the base section holds nothing, and the
    stream still hands out a (possibly empty) chunk every ``_KEYS_PER_STEP`` keys."""
    keys = 3 * _KEYS_PER_STEP
    s = MVCCStore()
    for i in range(keys):
        s.apply(PutRequest(b"k%06d" % i, b"v"))
    s.apply(PutRequest(b"other", b"v"))
    s.apply(CompactionRequest(1))  # every key's version is above it: nothing for the base
    chunks = list(s.serialize(chunk_size_bytes=1 << 30))  # output never fills a chunk
    assert len(chunks) >= keys // _KEYS_PER_STEP
    assert MVCCStore.restore(chunks).key_count == keys + 1
