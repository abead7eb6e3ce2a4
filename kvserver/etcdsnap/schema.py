"""etcd's backend schema (3.4 and 3.5): the buckets of its bolt database and their encodings.

* ``key``: one pair per version. The key is the revision: 8 bytes big-endian main revision,
  ``_``, 8 bytes big-endian sub revision (the write's place inside its transaction), plus
  ``t`` for a tombstone (a delete). The value is an ``mvccpb.KeyValue``; a tombstone's
  carries only the key.
* ``meta``: ``consistent_index`` (u64 big-endian, the raft index applied), and after a
  compaction ``scheduledCompactRev`` / ``finishedCompactRev`` (a revision, as above, sub 0).
  etcd 3.5 adds ``term`` and ``confState``; they are read past.
* ``lease``: key the lease ID (int64 big-endian), value an ``leasepb.Lease``.
* ``auth``: ``authEnabled`` (one byte, 1 or 0), ``authRevision`` (u64 big-endian);
  ``authUsers`` (name -> ``authpb.User``: the password is etcd's bcrypt hash) and
  ``authRoles`` (name -> ``authpb.Role``).
* ``alarm``: key an ``etcdserverpb.AlarmMember``, empty value.
* ``members`` (member ID in hex -> JSON), ``members_removed`` (ID -> ``removed``) and
  ``cluster`` (``clusterVersion``): the old cluster's membership, which a restore replaces.
"""

from __future__ import annotations

import struct

KEY = b"key"
META = b"meta"
LEASE = b"lease"
AUTH = b"auth"
AUTH_USERS = b"authUsers"
AUTH_ROLES = b"authRoles"
ALARM = b"alarm"
MEMBERS = b"members"
MEMBERS_REMOVED = b"members_removed"
CLUSTER = b"cluster"

CONSISTENT_INDEX = b"consistent_index"
SCHEDULED_COMPACT = b"scheduledCompactRev"
FINISHED_COMPACT = b"finishedCompactRev"
AUTH_ENABLED = b"authEnabled"
AUTH_REVISION = b"authRevision"
CLUSTER_VERSION = b"clusterVersion"

# The buckets a fresh etcd 3.4 creates, in name (bolt) order.
ETCD_BUCKETS = (
    ALARM,
    AUTH,
    AUTH_ROLES,
    AUTH_USERS,
    CLUSTER,
    KEY,
    LEASE,
    MEMBERS,
    MEMBERS_REMOVED,
    META,
)

_REV = struct.Struct(">Q")
_I64 = struct.Struct(">q")
REVISION_BYTES = 17
TOMBSTONE = b"t"


def revision_key(main: int, sub: int, tombstone: bool = False) -> bytes:
    return _REV.pack(main) + b"_" + _REV.pack(sub) + (TOMBSTONE if tombstone else b"")


def parse_revision_key(raw: bytes) -> tuple[int, int, bool]:
    """(main, sub, tombstone) of a ``key`` bucket key; ``ValueError`` if it is not one."""
    if len(raw) not in (REVISION_BYTES, REVISION_BYTES + 1) or raw[8:9] != b"_":
        raise ValueError(f"not a revision key: {raw[:32].hex()}")
    if len(raw) == REVISION_BYTES + 1 and raw[17:] != TOMBSTONE:
        raise ValueError(f"unknown revision key marker {raw[17:]!r}")
    (main,) = _REV.unpack_from(raw, 0)
    (sub,) = _REV.unpack_from(raw, 9)
    if main >= 1 << 63 or sub >= 1 << 63:
        raise ValueError(f"revision out of int64 range: {raw.hex()}")
    return main, sub, len(raw) == REVISION_BYTES + 1


def u64(raw: bytes, what: str) -> int:
    if len(raw) != 8:
        raise ValueError(f"{what}: {len(raw)} bytes, want 8")
    return int(_REV.unpack(raw)[0])


def pack_u64(n: int) -> bytes:
    return _REV.pack(n)


def lease_key(lease_id: int) -> bytes:
    return _I64.pack(lease_id)
