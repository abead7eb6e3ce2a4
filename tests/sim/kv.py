"""The simulated application: a tiny put-only key-value state machine, one per node.

Contract:
- A write is the raft entry data ``b"<op_id>:<key>"`` (ASCII; op ids are unique per write,
  so the op id doubles as the written value). Applying it sets ``data[key] = (op_id,
  revision)`` where the revision is the entry's log index. Writes are deduplicated by op id
  (a client retries a write with the same op id, the log may hold it twice): only the first
  copy takes effect, the later copies are no-ops, as deduplication of retries requires.
- Every applied entry (writes, empty no-ops, conf changes) extends a CRC-32 ``chain`` over
  ``(index, term, type, data)``. Two nodes with the same chain at the same applied index
  applied the same sequence; the chain travels inside snapshots so that a node restored
  from a snapshot can still be compared with nodes that applied entry by entry.
- Snapshot bytes are ``pickle`` of plain tuples (sorted, so the bytes are deterministic):
  ``(applied_index, chain, ((key, op_id, revision), ...), (op_id, ...))``.
"""

from __future__ import annotations

import pickle
import struct
import zlib

_ENTRY_HEADER = struct.Struct(">QQB")  # index, term, type: the chained prefix of every entry


def encode_put(op_id: int, key: str) -> bytes:
    return b"%d:%s" % (op_id, key.encode())


def decode_put(data: bytes) -> tuple[int, str]:
    op, _, key = data.partition(b":")
    return int(op), key.decode()


def chain_step(chain: int, index: int, term: int, entry_type: int, data: bytes) -> int:
    return zlib.crc32(data, zlib.crc32(_ENTRY_HEADER.pack(index, term, entry_type), chain))


class KVStore:
    """One node's state machine (volatile: rebuilt from a snapshot + the log after a crash)."""

    __slots__ = ("applied", "chain", "data", "seen")

    def __init__(self) -> None:
        self.applied = 0  # invariant: applied <= the node's commit index
        self.chain = 0
        self.data: dict[str, tuple[int, int]] = {}  # key -> (op_id, revision)
        self.seen: set[int] = set()  # op ids already applied (dedup of retried writes)

    def apply(self, index: int, term: int, entry_type: int, data: bytes) -> int | None:
        """Apply one committed entry; return the op id it wrote (None: no-op/dup/conf)."""
        self.applied = index
        self.chain = chain_step(self.chain, index, term, entry_type, data)
        if entry_type != 0 or not data:
            return None
        op, key = decode_put(data)
        if op in self.seen:
            return None
        self.seen.add(op)
        self.data[key] = (op, index)
        return op

    def get(self, key: str) -> tuple[int | None, int]:
        """Return (op_id, revision) of the key's last write, (None, 0) if never written."""
        return self.data.get(key, (None, 0))

    def to_bytes(self) -> bytes:
        items = tuple((k, op, rev) for k, (op, rev) in sorted(self.data.items()))
        return pickle.dumps((self.applied, self.chain, items, tuple(sorted(self.seen))))

    @classmethod
    def from_bytes(cls, raw: bytes) -> KVStore:
        kv = cls()
        if raw:
            applied, chain, items, seen = pickle.loads(raw)
            kv.applied, kv.chain = applied, chain
            kv.data = {k: (op, rev) for k, op, rev in items}
            kv.seen = set(seen)
        return kv
