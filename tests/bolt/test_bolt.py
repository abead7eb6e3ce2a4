"""bolt/: what the writer writes the reader reads back, and a damaged file is refused.

- Property: random trees of buckets (nested, empty, inline-sized and page-spanning, values
  larger than a page so overflow pages are used), any page size bolt allows, go through
  ``BoltWriter`` and come back equal from ``BoltReader``.
- Damage: every truncation of a file is refused (``BoltError`` naming the check); random
  bytes overwritten anywhere either raise ``BoltError`` naming a page or the file and a
  check, or read (bolt has no checksum over data pages: a changed value byte reads as a
  changed value; the SHA-256 trailer of a snapshot file catches that, see
  ``tests/etcdsnap``); never any other exception, never a hang.
- The reader's checks one by one: a meta page's checksum (the other meta page is then
  used; both bad: refused), keys out of order, a page referenced twice (a cycle), a page
  outside the file.
- The layout matches bbolt's: page ids in headers, the meta checksum (FNV-64a), the meta
  copy at page 1 one transaction older. (``tests/etcdsnap`` checks real etcd and etcdctl
  read what the writer writes and that the reader reads what etcd writes.)
"""

from __future__ import annotations

import io
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bolt import BoltError, BoltReader, BoltWriter, Bucket, BucketRef
from bolt.format import BRANCH, LEAF, PAGE_HEADER, fnv64a

Tree = dict  # name -> bytes value or a nested Tree


def write(tree: Tree, page_size: int = 4096) -> bytes:
    f = io.BytesIO()
    w = BoltWriter(f, page_size=page_size)

    def bucket(t: Tree) -> BucketRef:
        pairs = []
        for k in sorted(t):
            v = t[k]
            pairs.append((k, bucket(v) if isinstance(v, dict) else v))
        return w.write_bucket(pairs)

    w.finish([(k, bucket(v)) for k, v in sorted(tree.items())])
    return f.getvalue()


def read(data: bytes) -> Tree:
    r = BoltReader(data)

    def walk(b: Bucket) -> Tree:
        return {k: walk(v) if isinstance(v, Bucket) else v for k, v in r.walk(b)}

    return walk(r.root())


keys = st.binary(min_size=1, max_size=40)
values = st.one_of(
    st.binary(max_size=64),
    st.binary(max_size=600),
    st.builds(lambda n, b: b * n, st.integers(1, 9000), st.binary(min_size=1, max_size=1)),
)
leaf_maps = st.dictionaries(keys, values, max_size=60)
trees = st.recursive(
    leaf_maps, lambda child: st.dictionaries(keys, child, max_size=4), max_leaves=8
)
top = st.dictionaries(keys, trees, min_size=1, max_size=5)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(top, st.sampled_from([512, 1024, 4096, 16384]))
def test_random_trees_round_trip(tree, page_size):
    data = write(tree, page_size)
    assert len(data) % page_size == 0
    assert read(data) == tree


def test_many_keys_make_a_deep_tree_and_read_back_in_order():
    pairs = {struct.pack(">Q", i) + b"_" + bytes(8): b"v" * (i % 300) for i in range(20000)}
    data = write({b"key": pairs, b"meta": {b"a": b"1"}}, page_size=512)
    r = BoltReader(data)
    got = list(r.items(b"key"))
    assert [k for k, _ in got] == sorted(pairs)
    assert dict(got) == pairs
    root_of_key = r.bucket(b"key")
    assert root_of_key is not None and root_of_key.root != 0  # a tree of pages
    flags = PAGE_HEADER.unpack_from(data, root_of_key.root * 512)[1]
    assert flags == BRANCH
    small = r.bucket(b"meta")
    assert small is not None and small.root == 0 and small.inline  # written inline


def test_layout_is_bbolts():
    data = write({b"b": {b"k": b"v"}})
    for pgid in (0, 1):
        pid, flags, _, _ = PAGE_HEADER.unpack_from(data, pgid * 4096)
        assert (pid, flags) == (pgid, 0x04)
        meta = data[pgid * 4096 + 16 : pgid * 4096 + 16 + 64]
        magic, version, page_size = struct.unpack_from("<III", meta)
        assert (magic, version, page_size) == (0xED0CDAED, 2, 4096)
        assert struct.unpack_from("<Q", meta, 56)[0] == fnv64a(meta[:56])
    txids = [struct.unpack_from("<Q", data, p * 4096 + 16 + 48)[0] for p in (0, 1)]
    assert txids[1] == txids[0] - 1
    r = BoltReader(data)
    assert r.meta.txid == txids[0] and r.free_pages == frozenset()


def test_fnv64a_matches_the_reference_values():
    assert fnv64a(b"") == 0xCBF29CE484222325
    assert fnv64a(b"a") == 0xAF63DC4C8601EC8C
    assert fnv64a(b"foobar") == 0x85944171F73967E8


SAMPLE = {
    b"key": {struct.pack(">Q", i): bytes([i % 251]) * (i % 700) for i in range(400)},
    b"meta": {b"x": b"1", b"nested": {b"deep": b"2"}},
    b"empty": {},
}


SAMPLE_FILE = write(SAMPLE, page_size=1024)


def test_every_truncation_is_refused_naming_the_check():
    sample = SAMPLE_FILE
    for n in list(range(0, 200, 7)) + list(range(1024, len(sample), 97)) + [len(sample) - 1]:
        with pytest.raises(BoltError) as err:
            read(sample[:n])
        assert err.value.check in ("size", "meta", "high-water mark"), str(err.value)


def _damaged(sample: bytes, at: int, value: int) -> bytes:
    data = bytearray(sample)
    data[at % len(data)] = value
    return bytes(data)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(0, 255)), min_size=1, max_size=4))
def test_damaged_bytes_read_or_are_refused_never_crash(damage):
    data = SAMPLE_FILE
    for at, value in damage:
        data = _damaged(data, at, value)
    try:
        read(data)
    except BoltError as exc:
        assert str(exc).startswith(("bolt page ", "bolt file: ")), str(exc)


def test_one_bad_meta_page_falls_back_to_the_other():
    sample = SAMPLE_FILE
    bad0 = _damaged(sample, 16 + 40, sample[16 + 40] ^ 0xFF)  # meta 0's high-water mark
    assert read(bad0) == SAMPLE
    assert BoltReader(bad0).meta.txid == BoltReader(sample).meta.txid - 1
    both = _damaged(bad0, 1024 + 16 + 40, sample[1024 + 16 + 40] ^ 0xFF)
    with pytest.raises(BoltError, match="no valid meta page.*checksum"):
        read(both)


def _leaf_page(data: bytes, page_size: int) -> int:
    for pgid in range(3, len(data) // page_size):
        _, flags, count, _ = PAGE_HEADER.unpack_from(data, pgid * page_size)
        if flags == LEAF and count >= 2:
            return pgid
    raise AssertionError("no leaf page")


def test_keys_out_of_order_are_refused_naming_the_page():
    sample = SAMPLE_FILE
    pgid = _leaf_page(sample, 1024)
    off = pgid * 1024 + 16
    data = bytearray(sample)
    # swap the first two elements' (pos, ksize, vsize) so their keys come out of order
    e0 = data[off : off + 16]
    e1 = data[off + 16 : off + 32]
    pos0, pos1 = struct.unpack_from("<I", e0, 4)[0], struct.unpack_from("<I", e1, 4)[0]
    struct.pack_into("<IIII", data, off, 0, pos1 + 16, *struct.unpack_from("<II", e1, 8))
    struct.pack_into("<IIII", data, off + 16, 0, pos0 - 16, *struct.unpack_from("<II", e0, 8))
    with pytest.raises(BoltError, match=f"bolt page {pgid}: key order"):
        read(bytes(data))


def test_a_cycle_is_refused():
    data = bytearray(write({b"k": {bytes([i]) * 8: b"v" * 100 for i in range(200)}}, 512))
    r = BoltReader(bytes(data))
    root = r.bucket(b"k")
    assert root is not None
    # point the branch's second child at the branch itself
    off = root.root * 512 + 16 + 16
    struct.pack_into("<Q", data, off + 8, root.root)
    with pytest.raises(BoltError, match=f"bolt page {root.root}: (references|page type)"):
        read(bytes(data))


def test_a_page_outside_the_file_is_refused():
    data = bytearray(write({b"k": {bytes([i]) * 8: b"v" * 100 for i in range(200)}}, 512))
    root = BoltReader(bytes(data)).bucket(b"k")
    assert root is not None
    struct.pack_into("<Q", data, root.root * 512 + 16 + 8, 10**9)
    with pytest.raises(BoltError, match="bolt page 1000000000: bounds"):
        read(bytes(data))


def test_writer_refuses_what_bolt_would_not_hold():
    w = BoltWriter(io.BytesIO())
    with pytest.raises(ValueError, match="out of order"):
        w.write_bucket([(b"b", b""), (b"a", b"")])
    with pytest.raises(ValueError, match="keys are 1"):
        w.write_bucket([(b"", b"")])
