"""kvserver.etcdsnap: raftkv's state <-> etcd's bolt database, without etcd.

- Property: random stores (puts with leases, deletes of ranges, transactions writing
  several keys in one revision, compactions), random leases, users, roles and alarms go
  raftkv image -> etcd bolt file -> raftkv image and come back equal: every retained
  version, the revision, the compact revision, leases, auth, alarms.
- The file is etcd's schema byte for byte where etcd fixes it: revision keys
  (main ``_`` sub, ``t`` for a delete, a transaction's writes numbered 0, 1, ...), a
  tombstone's value carrying only the key, the meta keys, the ten buckets.
- A compaction etcd scheduled but had not finished is finished on import (as etcd does when
  it starts); a never compacted store stays so.
- Files: etcdctl's trailer is checked (any byte changed: refused), a data dir's db has
  none; a truncated file is refused; a restore of a damaged file builds nothing.
- The conversion child (``kvserver.etcdsnap.convert``) gives the same file as the in-process
  writer.
"""

from __future__ import annotations

import hashlib
import io
import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bolt import BoltError, BoltReader, BoltWriter
from kvserver.archive.datadir import RestoreTarget
from kvserver.archive.store import ArchiveError
from kvserver.auth.perms import Permission, PermType
from kvserver.auth.store import AuthStore, Role, User, frame_auth
from kvserver.etcdpb import kv_pb2, lease_pb2
from kvserver.etcdsnap import schema as S
from kvserver.etcdsnap.convert import ConvertError, image_to_bolt
from kvserver.etcdsnap.exporter import decode_image, write_etcd_db
from kvserver.etcdsnap.file import EtcdFileError, open_snapshot
from kvserver.etcdsnap.importer import EtcdImportError, read_etcd_db
from kvserver.etcdsnap.restore import restore_etcd
from kvserver.kvpb.alarm import AlarmMember, AlarmType
from kvserver.kvpb.kv import DeleteRangeRequest, PutRequest
from kvserver.lease.snapshot import encode_snapshot, frame_snapshot
from kvserver.mvcc.store import MVCCStore
from kvserver.server.alarms import AlarmStore

KEYS = [b"k%02d" % i for i in range(12)]

ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("put"),
            st.sampled_from(KEYS),
            st.binary(max_size=40),
            st.sampled_from([0, 0, 7, 1 << 40]),
        ),
        st.tuples(st.just("del"), st.integers(0, 11), st.integers(1, 4)),
        st.tuples(st.just("txn"), st.lists(st.sampled_from(KEYS), min_size=2, max_size=4)),
        st.tuples(st.just("compact"), st.floats(0, 1)),
    ),
    max_size=60,
)
names = st.text("abcdefgh", min_size=1, max_size=6)
auths = st.builds(
    lambda enabled, rev, users, roles: (enabled, rev, users, roles),
    st.booleans(),
    st.integers(1, 1000),
    st.dictionaries(
        names,
        st.tuples(st.sampled_from([b"", b"$2a$10$x", b"scrypt$1"]), st.lists(names, max_size=3)),
        max_size=4,
    ),
    st.dictionaries(
        names,
        st.lists(
            st.tuples(
                st.sampled_from(list(PermType)),
                st.binary(min_size=1, max_size=4),
                st.binary(max_size=4),
            ),
            max_size=3,
            unique_by=lambda p: (p[1], p[2]),
        ),
        max_size=3,
    ),
)


def build_store(operations) -> MVCCStore:
    s = MVCCStore()
    for op in operations:
        if op[0] == "put":
            s.put(op[1], op[2], lease=op[3])
        elif op[0] == "del":
            s.delete_range(KEYS[op[1]], KEYS[min(11, op[1] + op[2])])
        elif op[0] == "txn":
            s.txn((), [PutRequest(k, b"t%d" % i) for i, k in enumerate(dict.fromkeys(op[1]))])
        elif s.revision > 1:
            target = 1 + int(op[1] * (s.revision - 1))
            if target > max(s.compact_revision, 0):
                s.compact(target)
    while s.compact_step(1 << 20):
        pass
    return s


def image_of(store: MVCCStore, leases=(), auth=None, alarms=()) -> bytes:
    head = AlarmStore(tuple(alarms)).snapshot_frame()
    if auth is not None:
        head += frame_auth(auth.snapshot())
    head += frame_snapshot(encode_snapshot(sorted(leases), []))
    return head + b"".join(store.serialize())


def auth_store(spec) -> AuthStore:
    enabled, rev, users, roles = spec
    a = AuthStore(enabled=enabled, revision=rev)
    for name, (pw, rs) in users.items():
        a.users[name] = User(name, pw, tuple(sorted(set(rs))))
    for name, perms in roles.items():
        ps = sorted((Permission(t, k, e) for t, k, e in perms), key=lambda p: (p.key, p.range_end))
        a.roles[name] = Role(name, tuple(ps))
    return a


def to_bolt(image: bytes, **kw) -> bytes:
    f = io.BytesIO()
    write_etcd_db(image, f, **kw)
    return f.getvalue()


def state(image: bytes):
    alarms, auth, leases, parts = decode_image(image)
    auth_state = (auth.enabled, auth.revision, auth.users, auth.roles)
    return (
        alarms.get(),
        auth_state,
        leases,
        parts.revision,
        parts.compact_revision,
        parts.base,
        parts.log,
    )


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops,
    st.dictionaries(
        st.integers(1, 1 << 62), st.tuples(st.integers(1, 10**6), st.integers(0, 10**6)), max_size=4
    ),
    auths,
    st.lists(
        st.tuples(st.integers(1, 1 << 63), st.sampled_from([AlarmType.NOSPACE, AlarmType.CORRUPT])),
        max_size=3,
        unique=True,
    ),
)
def test_random_states_round_trip_through_etcds_format(operations, leases, auth, alarms):
    store = build_store(operations)
    lease_rows = [(i, ttl, rem) for i, (ttl, rem) in leases.items()]
    alarm_rows = [AlarmMember(m, t) for m, t in alarms]
    original = image_of(store, lease_rows, auth_store(auth), alarm_rows)
    db = to_bolt(original, consistent_index=42)
    imported = read_etcd_db(BoltReader(db))
    assert state(imported.image) == state(original)
    s = imported.summary
    assert (s.revision, s.compact_revision, s.keys) == (
        store.revision,
        store.compact_revision,
        store.key_count,
    )
    # the restored store answers as the original at every retained revision
    restored = MVCCStore.from_parts(decode_image(imported.image)[3])
    for rev in range(max(store.compact_revision, 1), store.revision + 1):
        want = store.range(b"\0", b"\0", revision=rev).kvs
        assert restored.range(b"\0", b"\0", revision=rev).kvs == want


def test_etcd_schema_details():
    s = MVCCStore()
    s.put(b"a", b"1")  # rev 2
    s.txn((), [PutRequest(b"b", b"2"), PutRequest(b"c", b"3"), DeleteRangeRequest(b"a")])  # 3
    s.put(b"b", b"22", lease=5)  # rev 4
    s.compact(2)
    while s.compact_step(1000):
        pass
    r = BoltReader(to_bolt(image_of(s, [(5, 60, 0)]), consistent_index=7))
    assert r.buckets() == sorted(S.ETCD_BUCKETS)
    keys = list(r.items(S.KEY))
    # rev 3 holds b, c and the delete of a, numbered in order
    assert [k for k, _ in keys] == [
        S.revision_key(2, 0),
        S.revision_key(3, 0),
        S.revision_key(3, 1),
        S.revision_key(3, 2, True),
        S.revision_key(4, 0),
    ]
    assert keys[3][1] == kv_pb2.KeyValue(key=b"a").SerializeToString()
    last = kv_pb2.KeyValue.FromString(keys[4][1])
    assert (last.key, last.create_revision, last.mod_revision, last.version, last.lease) == (
        b"b",
        3,
        4,
        2,
        5,
    )
    assert dict(r.items(S.META)) == {
        S.CONSISTENT_INDEX: struct.pack(">Q", 7),
        S.FINISHED_COMPACT: S.revision_key(2, 0),
        S.SCHEDULED_COMPACT: S.revision_key(2, 0),
    }
    [(lk, lv)] = r.items(S.LEASE)
    assert lk == struct.pack(">q", 5) and lease_pb2.Lease.FromString(lv).TTL == 60
    assert dict(r.items(S.CLUSTER)) == {b"clusterVersion": b"3.4.0"}


def _etcd_db(key_pairs, meta) -> bytes:
    f = io.BytesIO()
    w = BoltWriter(f)
    refs = {S.KEY: w.write_bucket(key_pairs), S.META: w.write_bucket(sorted(meta.items()))}
    w.finish(sorted(refs.items()))
    return f.getvalue()


def _put(key: bytes, value: bytes, create: int, mod: int, version: int) -> bytes:
    return kv_pb2.KeyValue(
        key=key, value=value, create_revision=create, mod_revision=mod, version=version
    ).SerializeToString()


def test_a_scheduled_compaction_is_finished_on_import():
    pairs = [
        (S.revision_key(2, 0), _put(b"a", b"1", 2, 2, 1)),
        (S.revision_key(3, 0), _put(b"a", b"2", 2, 3, 2)),
        (S.revision_key(4, 0), _put(b"b", b"1", 4, 4, 1)),
        (S.revision_key(5, 0, True), kv_pb2.KeyValue(key=b"b").SerializeToString()),
        (S.revision_key(6, 0), _put(b"a", b"3", 2, 6, 3)),
    ]
    meta = {S.FINISHED_COMPACT: S.revision_key(2, 0), S.SCHEDULED_COMPACT: S.revision_key(5, 0)}
    imported = read_etcd_db(BoltReader(_etcd_db(pairs, meta)))
    _, _, _, parts = decode_image(imported.image)
    assert (parts.revision, parts.compact_revision) == (6, 5)
    assert [(kv.key, kv.mod_revision) for kv in parts.base] == [(b"a", 3)]  # b deleted at 5
    assert [(kv.key, kv.mod_revision) for kv in parts.log] == [(b"a", 6)]
    never = read_etcd_db(BoltReader(_etcd_db(pairs, {}))).summary
    assert (never.compact_revision, never.versions, never.keys) == (-1, 5, 1)


@pytest.mark.parametrize(
    "pairs, message",
    [
        ([(b"\x00" * 17, _put(b"a", b"", 1, 1, 1))], "not a revision key"),
        ([(S.revision_key(2, 0), b"\xff\xff")], "revision 2: not an mvccpb.KeyValue"),
        ([(S.revision_key(2, 0), _put(b"a", b"", 2, 3, 1))], "revision 2: inconsistent"),
        (
            [(S.revision_key(2, 0), _put(b"", b"", 2, 2, 1))],
            "revision 2: a version with an empty key",
        ),
    ],
)
def test_content_etcd_would_not_write_is_refused(pairs, message):
    with pytest.raises(EtcdImportError, match=message):
        read_etcd_db(BoltReader(_etcd_db(pairs, {})))


def test_etcd_35_meta_keys_and_unknown_buckets_are_read_past():
    pairs = [(S.revision_key(2, 0), _put(b"a", b"1", 2, 2, 1))]
    meta = {
        S.CONSISTENT_INDEX: struct.pack(">Q", 9),
        b"term": struct.pack(">Q", 3),  # etcd 3.5
        b"confState": b'{"voters":[1]}',  # etcd 3.5
    }
    f = io.BytesIO()
    w = BoltWriter(f)
    refs = {
        S.KEY: w.write_bucket(pairs),
        S.META: w.write_bucket(sorted(meta.items())),
        b"downgrade": w.write_bucket([]),  # a bucket raftkv does not know
    }
    w.finish(sorted(refs.items()))
    summary = read_etcd_db(BoltReader(f.getvalue())).summary
    assert (summary.revision, summary.keys, summary.compact_revision) == (2, 1, -1)
    assert summary.ignored_buckets == ["downgrade"]


def test_a_bolt_file_without_etcds_buckets_is_refused():
    f = io.BytesIO()
    w = BoltWriter(f)
    w.finish([(b"other", w.write_bucket([]))])
    with pytest.raises(EtcdImportError, match="not an etcd database"):
        read_etcd_db(BoltReader(f.getvalue()))


@pytest.fixture
def snapshot_file(tmp_path):
    s = MVCCStore()
    for i in range(500):
        s.put(b"key%03d" % (i % 120), os.urandom(100))
    db = to_bolt(image_of(s))
    path = tmp_path / "snap.db"
    path.write_bytes(db + hashlib.sha256(db).digest())
    return path, db, s


def test_trailer_checked_and_data_dir_db_read_without_one(snapshot_file, tmp_path):
    path, db, store = snapshot_file
    with open_snapshot(str(path)) as snap:
        assert snap.sha256 == hashlib.sha256(db).hexdigest()
        assert read_etcd_db(snap.reader).summary.revision == store.revision
    plain = tmp_path / "db"
    plain.write_bytes(db)
    with open_snapshot(str(plain)) as snap:
        assert snap.sha256 is None and snap.size_bytes == len(db)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.integers(0, 1 << 30), st.integers(1, 255))
def test_any_changed_byte_of_a_snapshot_with_its_trailer_is_refused(snapshot_file, at, flip):
    path, db, _ = snapshot_file
    data = bytearray(path.read_bytes())
    data[at % len(data)] ^= flip
    bad = path.with_suffix(".bad")
    bad.write_bytes(bytes(data))
    with pytest.raises(EtcdFileError, match="hash mismatch"):
        open_snapshot(str(bad))


def test_truncated_files_are_refused(snapshot_file, tmp_path):
    path, db, _ = snapshot_file
    cut = tmp_path / "cut"
    for n in (100, 4096, len(db) - 4096, len(db) + 5):
        cut.write_bytes(db[:n] if n <= len(db) else db + b"x" * 5)
        with pytest.raises((EtcdFileError, BoltError)) as err:
            open_snapshot(str(cut))
        assert "truncated" in str(err.value) or "high-water mark" in str(err.value)


def test_a_damaged_file_restores_nothing(snapshot_file, tmp_path):
    path, db, _ = snapshot_file
    data = bytearray(db)
    # a record's value no longer a KeyValue: bolt reads it, the importer refuses it
    damaged = tmp_path / "damaged.db"
    idx = data.find(b"key000")
    data[idx - 3 : idx + 3] = b"\xff" * 6
    damaged.write_bytes(bytes(data))
    target = RestoreTarget(str(tmp_path / "new"), "n1", "n1=http://127.0.0.1:2380")
    with pytest.raises((EtcdImportError, BoltError, ArchiveError)):
        restore_etcd(str(damaged), target)
    assert not (tmp_path / "new").exists()
    info, member = restore_etcd(str(path), target)
    assert os.path.isdir(os.path.join(member.data_dir, "member", "wal"))
    assert info.summary.keys == 120


async def test_conversion_child_writes_the_same_file(snapshot_file):
    _, db, store = snapshot_file
    image = image_of(store)
    got, summary = await image_to_bolt(memoryview(image))
    assert bytes(got) == db == to_bolt(image)
    assert summary["revision"] == store.revision and summary["versions"] == 500


async def test_conversion_child_failure_is_reported():
    with pytest.raises(ConvertError, match="exit 3"):
        await image_to_bolt(memoryview(b"not an image"))
