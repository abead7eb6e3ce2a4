"""etcd's bolt database -> raftkv's state image (what a member's raft snapshot carries after
its member-registry frame: ``kvserver.archive.snapfile`` describes the image).

``read_etcd_db(reader, where)`` reads the buckets of ``kvserver.etcdsnap.schema`` and returns
``Imported``: the image (alarm frame, auth frame, lease frame, MVCC stream) and a summary.
What moves:

* every version in ``key`` with its create and mod revisions, version, value and lease; the
  store's revision is the newest main revision, or the compact revision if higher (etcd's
  rule at start);
* the compact revision: the higher of ``finishedCompactRev`` and ``scheduledCompactRev``.
  A compaction etcd scheduled but had not finished is finished here, as etcd finishes it
  when it starts: each key keeps its newest version at or below it, unless that is a delete;
* leases (ID, granted TTL, checkpointed remaining TTL); the keys attached to a lease are the
  keys whose ``lease`` field names it, as in etcd;
* auth: enabled, its revision, users (name, password hash, roles; etcd's bcrypt hashes are
  verified by raftkv as they are), roles with their permissions;
* raised alarms.

Not moved: the membership (``members``, ``members_removed``, ``cluster``: a restore starts a
new cluster whose members come from its flags, as ``etcdctl snapshot restore`` does), the
consistent index, the term and conf state etcd 3.5 keeps in ``meta``; buckets etcd does not
have are listed in the summary and otherwise ignored.

Anything malformed raises ``EtcdImportError`` naming the bucket and key (bolt-level damage
raises ``bolt.BoltError``, which names the page). Nothing is written anywhere: the caller
builds a data directory only from a complete image.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from dataclasses import dataclass, field
from operator import attrgetter

from google.protobuf.message import DecodeError

from bolt import BoltReader, Bucket
from kvserver.auth.perms import Permission, PermType
from kvserver.auth.store import AuthStore, Role, User, frame_auth
from kvserver.etcdpb import auth_pb2, kv_pb2, lease_pb2, rpc_pb2
from kvserver.etcdsnap import schema as S
from kvserver.kvpb.alarm import AlarmMember, AlarmType
from kvserver.kvpb.kv import KeyValue
from kvserver.kvpb.lease import MAX_LEASE_TTL_S
from kvserver.lease.snapshot import encode_snapshot, frame_snapshot
from kvserver.mvcc.snapshot import serialize_records
from kvserver.server.alarms import AlarmStore

_KEY = attrgetter("key")
_NEVER_COMPACTED = -1  # raftkv's (and etcd's) compact revision of a never-compacted store
IMAGE_CHUNK_BYTES = 1 << 20


class EtcdImportError(ValueError):
    """The bolt file is sound but its etcd content is not what etcd writes."""


@dataclass
class Summary:
    revision: int = 1
    compact_revision: int = _NEVER_COMPACTED
    keys: int = 0  # live keys at the revision
    versions: int = 0  # records in the key bucket read
    leases: int = 0
    users: int = 0
    roles: int = 0
    auth_enabled: bool = False
    alarms: int = 0
    ignored_buckets: list[str] = field(default_factory=list)


@dataclass
class Imported:
    image: bytearray
    summary: Summary


def _pairs(reader: BoltReader, name: bytes) -> Iterator[tuple[bytes, bytes]]:
    for k, v in reader.items(name):
        if isinstance(v, Bucket):
            raise EtcdImportError(f"bucket {name.decode()}: key {k!r} is a nested bucket")
        yield k, v


def _parse(msg_type, raw: bytes, where: str):
    try:
        return msg_type.FromString(raw)
    except (DecodeError, ValueError) as exc:
        raise EtcdImportError(f"{where}: not a {msg_type.DESCRIPTOR.full_name}: {exc}") from None


def _compact_revision(reader: BoltReader, summary: Summary) -> int:
    meta = dict(_pairs(reader, S.META))
    compact = _NEVER_COMPACTED
    for name in (S.FINISHED_COMPACT, S.SCHEDULED_COMPACT):
        raw = meta.get(name)
        if raw is None:
            continue
        try:
            main, _, _ = S.parse_revision_key(raw)
        except ValueError as exc:
            raise EtcdImportError(f"bucket meta: {name.decode()}: {exc}") from None
        compact = max(compact, main)
    return compact


def _store(reader: BoltReader, summary: Summary, compact: int) -> tuple[list, list]:
    """(base, log) in the MVCC stream's order, the compaction at ``compact`` applied."""
    below: dict[bytes, KeyValue | None] = {}  # newest version under ``compact`` (None: a delete)
    at_compact: list[KeyValue] = []  # puts at exactly ``compact``: the log's first records
    touched_at_compact: set[bytes] = set()
    log: list[KeyValue] = []
    live: dict[bytes, bool] = {}
    top = 0
    parse = kv_pb2.KeyValue.FromString
    for raw, value in _pairs(reader, S.KEY):
        try:
            main, _, tomb = S.parse_revision_key(raw)
        except ValueError as exc:
            raise EtcdImportError(f"bucket key: {exc}") from None
        where = f"bucket key: revision {main}"
        try:
            pb = parse(value)
        except (DecodeError, ValueError) as exc:
            raise EtcdImportError(f"{where}: not an mvccpb.KeyValue: {exc}") from None
        if not pb.key:
            raise EtcdImportError(f"{where}: a version with an empty key")
        if tomb:
            kv = KeyValue(pb.key, b"", 0, main, 0, 0)
        else:
            if pb.mod_revision != main or not 1 <= pb.create_revision <= main or pb.version < 1:
                raise EtcdImportError(
                    f"{where}: inconsistent version of {pb.key[:64]!r} (create "
                    f"{pb.create_revision}, mod {pb.mod_revision}, version {pb.version})"
                )
            kv = KeyValue(pb.key, pb.value, pb.create_revision, main, pb.version, pb.lease)
        top = main
        summary.versions += 1
        live[pb.key] = not tomb
        if main < compact:
            below[pb.key] = None if tomb else kv
        elif main == compact:
            touched_at_compact.add(pb.key)
            if not tomb:
                at_compact.append(kv)
        else:
            log.append(kv)
    summary.revision = max(top, compact, 1)
    summary.keys = sum(live.values())
    base = [kv for k, kv in below.items() if kv is not None and k not in touched_at_compact]
    base.sort(key=_KEY)
    return base, at_compact + log


def _leases(reader: BoltReader, summary: Summary) -> list[tuple[int, int, int]]:
    leases = []
    for k, v in _pairs(reader, S.LEASE):
        pb = _parse(lease_pb2.Lease, v, f"bucket lease: key {k.hex()}")
        where = f"bucket lease: lease {pb.ID:x}"
        if k != S.lease_key(pb.ID) or pb.ID == 0:
            raise EtcdImportError(f"{where}: stored under key {k.hex()}")
        if not 1 <= pb.TTL <= MAX_LEASE_TTL_S or pb.RemainingTTL < 0:
            raise EtcdImportError(
                f"{where}: TTL {pb.TTL} s / remaining {pb.RemainingTTL} s outside 1.."
                f"{MAX_LEASE_TTL_S}"
            )
        leases.append((pb.ID, pb.TTL, pb.RemainingTTL))
    leases.sort()
    summary.leases = len(leases)
    return leases


def _name(raw: bytes, where: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise EtcdImportError(f"{where}: name {raw!r} is not UTF-8") from None


def _auth(reader: BoltReader, summary: Summary) -> bytes:
    meta = dict(_pairs(reader, S.AUTH))
    store = AuthStore()
    enabled = meta.get(S.AUTH_ENABLED, b"\x00")
    if enabled not in (b"\x00", b"\x01"):
        raise EtcdImportError(f"bucket auth: authEnabled is {enabled!r}")
    store.enabled = enabled == b"\x01"
    if S.AUTH_REVISION in meta:
        try:
            store.revision = S.u64(meta[S.AUTH_REVISION], "bucket auth: authRevision")
        except ValueError as exc:
            raise EtcdImportError(str(exc)) from None
    for k, v in _pairs(reader, S.AUTH_USERS):
        where = f"bucket authUsers: user {k[:64]!r}"
        pb = _parse(auth_pb2.User, v, where)
        if pb.name != k:
            raise EtcdImportError(f"{where}: the record names {pb.name[:64]!r}")
        name = _name(k, where)
        store.users[name] = User(name, bytes(pb.password), tuple(sorted(set(pb.roles))))
    for k, v in _pairs(reader, S.AUTH_ROLES):
        where = f"bucket authRoles: role {k[:64]!r}"
        pb = _parse(auth_pb2.Role, v, where)
        if pb.name != k:
            raise EtcdImportError(f"{where}: the record names {pb.name[:64]!r}")
        try:
            perms = [Permission(PermType(p.permType), p.key, p.range_end) for p in pb.keyPermission]
        except ValueError as exc:
            raise EtcdImportError(f"{where}: {exc}") from None
        name = _name(k, where)
        store.roles[name] = Role(name, tuple(sorted(perms, key=lambda p: (p.key, p.range_end))))
    summary.users, summary.roles = len(store.users), len(store.roles)
    summary.auth_enabled = store.enabled
    if not store.enabled and store.revision == 1 and not store.users and not store.roles:
        return b""  # auth never used: no frame, as a member writes it
    return frame_auth(store.snapshot())


def _alarms(reader: BoltReader, summary: Summary) -> bytes:
    alarms = []
    for k, _ in _pairs(reader, S.ALARM):
        pb = _parse(rpc_pb2.AlarmMember, k, f"bucket alarm: key {k.hex()}")
        if pb.alarm == 0:
            continue
        try:
            alarms.append(AlarmMember(pb.memberID, AlarmType(pb.alarm)))
        except ValueError:
            raise EtcdImportError(f"bucket alarm: unknown alarm type {pb.alarm}") from None
    summary.alarms = len(alarms)
    return AlarmStore(tuple(alarms)).snapshot_frame()


def read_etcd_db(reader: BoltReader) -> Imported:
    """The state image of the etcd database ``reader`` reads (see the module docstring).

    The cyclic GC is paused meanwhile: a million versions are millions of new objects, none
    in a cycle, and the collections they would trigger walk them again and again (40 % of
    the time of an import)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _read_etcd_db(reader)
    finally:
        if was_enabled:
            gc.enable()


def _read_etcd_db(reader: BoltReader) -> Imported:
    summary = Summary()
    names = reader.buckets()
    if S.KEY not in names or S.META not in names:
        raise EtcdImportError(
            "not an etcd database: no 'key' or 'meta' bucket (buckets: "
            + ", ".join(n.decode("utf-8", "replace") for n in names)
            + ")"
        )
    summary.ignored_buckets = [
        n.decode("utf-8", "replace") for n in names if n not in S.ETCD_BUCKETS
    ]
    compact = _compact_revision(reader, summary)
    summary.compact_revision = compact
    alarm_frame = _alarms(reader, summary)
    auth_frame = _auth(reader, summary)
    lease_frame = frame_snapshot(encode_snapshot(_leases(reader, summary), []))
    base, log = _store(reader, summary, compact)
    image = bytearray(alarm_frame + auth_frame + lease_frame)
    for chunk in serialize_records(summary.revision, compact, base, log, IMAGE_CHUNK_BYTES):
        image += chunk
    return Imported(image, summary)
