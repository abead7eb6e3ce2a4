"""raftkv's state image -> etcd's bolt database (the file ``etcdctl snapshot save`` writes,
without the SHA-256 trailer, which the sender appends).

``write_etcd_db(image, out, consistent_index=..., members=...)`` decodes the image (alarm
frame, auth frame, lease frame, MVCC stream: ``kvserver.archive.snapfile``) and writes, with
``bolt.BoltWriter``, the ten buckets a fresh etcd 3.4 has (``kvserver.etcdsnap.schema``):

* ``key``: every version the store keeps, in revision order: each key's retained version
  below the compact revision, then every version from it on. raftkv numbers a
  transaction's writes by their order inside the revision; they become etcd's sub
  revisions 0, 1, ... in that order. A delete is a tombstone key whose value carries only
  the key, as etcd writes it;
* ``meta``: ``consistent_index`` (the raft index of the image), and when the store was
  compacted ``scheduledCompactRev`` = ``finishedCompactRev`` = the compact revision;
* ``lease``: each lease's ID, granted TTL and checkpointed remaining TTL;
* ``auth``, ``authUsers``, ``authRoles``: enabled, revision, users (their password hashes as
  raftkv keeps them: a user created in etcd keeps its bcrypt hash and logs in to etcd as
  before; a password set in raftkv is an scrypt hash that etcd cannot check, so such users
  need ``etcdctl user passwd`` after the move), roles and permissions;
* ``alarm``: the raised alarms;
* ``members`` (``members``: ``(id, name, peer URLs, client URLs, is learner)``),
  ``members_removed`` (empty), ``cluster`` (``clusterVersion`` 3.4.0).

Not written: raftkv's request de-duplication tables (they serve raftkv's own clients'
retries and mean nothing to etcd).

Memory: the decoded store (a list of its versions) plus one bolt page; the file goes to
``out`` page by page. Run it off the member's event loop: ``kvserver.etcdsnap.convert`` runs
it in a child process.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter
from typing import BinaryIO

from bolt import BoltWriter, BucketRef
from kvserver.auth.store import AuthStore, split_auth_frame
from kvserver.etcdpb import auth_pb2, kv_pb2, lease_pb2, rpc_pb2
from kvserver.etcdsnap import schema as S
from kvserver.kvpb.kv import KeyValue
from kvserver.lease.snapshot import decode_snapshot, split_snapshot
from kvserver.mvcc.snapshot import SnapshotLoader, SnapshotParts
from kvserver.server.alarms import AlarmStore, split_alarm_frame

FEED_BYTES = 1 << 20
CLUSTER_VERSION = b"3.4.0"
_MOD_KEY = attrgetter("mod_revision", "key")


@dataclass(frozen=True)
class EtcdMember:
    id: int
    name: str
    peer_urls: tuple[str, ...]
    client_urls: tuple[str, ...] = ()
    is_learner: bool = False


@dataclass(frozen=True)
class Exported:
    size_bytes: int
    revision: int
    compact_revision: int
    versions: int
    leases: int
    users: int


def decode_image(
    image: bytes | bytearray | memoryview,
) -> tuple[AlarmStore, AuthStore, list, SnapshotParts]:
    """(alarms, auth, leases, store parts) of a state image; ``SnapshotFormatError`` if it
    does not decode."""
    alarm_blob, rest = split_alarm_frame(memoryview(image))
    alarms = AlarmStore.restore(alarm_blob)
    auth_blob, rest = split_auth_frame(rest)
    auth = AuthStore.restore(auth_blob)
    lease_blob, rest = split_snapshot(rest)
    leases = decode_snapshot(lease_blob)[0] if lease_blob is not None else []
    loader = SnapshotLoader()
    for i in range(0, len(rest), FEED_BYTES):
        loader.feed(bytes(rest[i : i + FEED_BYTES]))
    return alarms, auth, leases, loader.finish()


def _key_pairs(records: Iterable[KeyValue]) -> Iterator[tuple[bytes, bytes]]:
    encode = kv_pb2.KeyValue
    prev_main = -1
    sub = 0
    for kv in records:
        main = kv.mod_revision
        sub = sub + 1 if main == prev_main else 0
        prev_main = main
        if kv.create_revision == 0:
            yield S.revision_key(main, sub, True), encode(key=kv.key).SerializeToString()
        else:
            yield (
                S.revision_key(main, sub),
                encode(
                    key=kv.key,
                    create_revision=kv.create_revision,
                    mod_revision=main,
                    version=kv.version,
                    value=kv.value,
                    lease=kv.lease,
                ).SerializeToString(),
            )


def _member_json(m: EtcdMember) -> bytes:
    body: dict = {"id": m.id, "peerURLs": list(m.peer_urls)}
    if m.is_learner:
        body["isLearner"] = True
    if m.name:
        body["name"] = m.name
    if m.client_urls:
        body["clientURLs"] = list(m.client_urls)
    return json.dumps(body, separators=(",", ":")).encode()


def write_etcd_db(
    image: bytes | bytearray | memoryview,
    out: BinaryIO,
    *,
    consistent_index: int = 0,
    members: Iterable[EtcdMember] = (),
) -> Exported:
    alarms, auth, leases, parts = decode_image(image)
    w = BoltWriter(out)
    refs: dict[bytes, BucketRef] = {}
    base = sorted(parts.base, key=_MOD_KEY)
    records = chain(base, parts.log)
    refs[S.KEY] = w.write_bucket(_key_pairs(records))
    versions = len(base) + len(parts.log)
    del base
    meta = [(S.CONSISTENT_INDEX, S.pack_u64(consistent_index))]
    if parts.compact_revision > 0:
        rev = S.revision_key(parts.compact_revision, 0)
        meta += [(S.FINISHED_COMPACT, rev), (S.SCHEDULED_COMPACT, rev)]
    refs[S.META] = w.write_bucket(meta)
    refs[S.LEASE] = w.write_bucket(
        sorted(
            (
                S.lease_key(lid),
                lease_pb2.Lease(ID=lid, TTL=ttl, RemainingTTL=remaining).SerializeToString(),
            )
            for lid, ttl, remaining in leases
        )
    )
    refs[S.AUTH] = w.write_bucket(
        [
            (S.AUTH_ENABLED, b"\x01" if auth.enabled else b"\x00"),
            (S.AUTH_REVISION, S.pack_u64(auth.revision)),
        ]
    )
    refs[S.AUTH_USERS] = w.write_bucket(
        (
            u.name.encode(),
            auth_pb2.User(
                name=u.name.encode(),
                password=u.password_hash,
                roles=list(u.roles),
                options=auth_pb2.UserAddOptions(no_password=not u.password_hash),
            ).SerializeToString(),
        )
        for u in sorted(auth.users.values(), key=lambda u: u.name.encode())
    )
    refs[S.AUTH_ROLES] = w.write_bucket(
        (
            r.name.encode(),
            auth_pb2.Role(
                name=r.name.encode(),
                keyPermission=[
                    auth_pb2.Permission(permType=p.perm_type.name, key=p.key, range_end=p.range_end)
                    for p in r.perms
                ],
            ).SerializeToString(),
        )
        for r in sorted(auth.roles.values(), key=lambda r: r.name.encode())
    )
    refs[S.ALARM] = w.write_bucket(
        sorted(
            (rpc_pb2.AlarmMember(memberID=a.member_id, alarm=a.alarm.name).SerializeToString(), b"")
            for a in alarms.get()
        )
    )
    refs[S.MEMBERS] = w.write_bucket(
        sorted((f"{m.id:x}".encode(), _member_json(m)) for m in members)
    )
    refs[S.MEMBERS_REMOVED] = w.write_bucket([])
    refs[S.CLUSTER] = w.write_bucket([(S.CLUSTER_VERSION, CLUSTER_VERSION)])
    size = w.finish(sorted(refs.items()))
    return Exported(
        size,
        parts.revision,
        parts.compact_revision,
        versions,
        len(leases),
        len(auth.users),
    )
