"""raftkv's backup file (``raftkv snapshot save`` / ``POST /v3/maintenance/snapshot``).

etcd's snapshot file is its bolt database followed by the SHA-256 of everything before it.
We are not bolt; ours keeps the same idea — a self-contained copy of one member's state at
one revision whose last 32 bytes are the SHA-256 of all the bytes before them:

    offset 0    b"RKVSNAP\\x01"                      magic + format version 1
    offset 8    u32 big-endian n
    offset 12   n bytes of JSON header: {"format": 1, "revision", "compact_revision",
                "raft_index", "raft_term", "cluster_id" (hex), "member_id" (hex),
                "keys" (live keys at the revision), "created_unix"}
    then        the state image, exactly what the member puts in a raft snapshot after the
                member-registry frame: the alarm frame while an alarm is raised
                (``kvserver.server.alarms``), the auth frame once auth was used
                (``kvserver.auth.store``), the lease frame
                (``kvserver.lease.snapshot.frame_snapshot``), then the MVCC stream (``kvserver.mvcc.snapshot``; it ends with its own
                counts trailer, so truncation inside the body is caught a second time)
    last 32     SHA-256 of every byte above

The membership is deliberately not in the file: a restore starts a new cluster whose
members come from the restore's flags (etcdctl's rule).

``encode`` yields the file as it is produced (nothing is built whole), one piece per image
chunk, empty ones too: the store's stream hands out an empty chunk where it scanned a stretch
of keys that wrote nothing, a point where its consumer may let the event loop run (the
pieces joined are the same bytes either way); ``read`` checks the
magic, the header and the hash while streaming and refuses a file whose hash does not match
with ``SnapshotFileError`` (its message names the file and both hashes).
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass

MAGIC = b"RKVSNAP\x01"
FORMAT = 1
HASH_BYTES = 32
READ_CHUNK_BYTES = 1 << 20
MAX_HEADER_BYTES = 1 << 16


class SnapshotFileError(ValueError):
    """Not a raftkv snapshot file, or a damaged one."""


def encode_header(header: dict) -> bytes:
    body = json.dumps({"format": FORMAT, **header}, sort_keys=True, separators=(",", ":")).encode()
    return MAGIC + struct.pack(">I", len(body)) + body


def encode(header: dict, image_chunks: Iterable[bytes]) -> Generator[bytes, None, None]:
    """The whole file, piece by piece: header, each image chunk as it comes (empty ones
    included: they are yield points), then the SHA-256."""
    digest = hashlib.sha256()
    head = encode_header(header)
    digest.update(head)
    yield head
    for chunk in image_chunks:
        digest.update(chunk)
        yield chunk
    yield digest.digest()


@dataclass(frozen=True)
class SnapshotInfo:
    header: dict
    size_bytes: int  # the whole file, hash included
    sha256: str  # hex; verified

    @property
    def revision(self) -> int:
        return int(self.header.get("revision", 0))

    @property
    def keys(self) -> int:
        return int(self.header.get("keys", 0))


def _parse_header(buf: bytes, where: str) -> tuple[dict, int]:
    if len(buf) < 12 or buf[:8] != MAGIC:
        raise SnapshotFileError(f"{where}: not a raftkv snapshot file (bad magic)")
    (n,) = struct.unpack(">I", buf[8:12])
    if n > MAX_HEADER_BYTES or len(buf) < 12 + n:
        raise SnapshotFileError(f"{where}: truncated or malformed snapshot header")
    try:
        header = json.loads(buf[12 : 12 + n])
    except ValueError:
        raise SnapshotFileError(f"{where}: unreadable snapshot header") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise SnapshotFileError(
            f"{where}: unknown snapshot format "
            f"{header.get('format') if isinstance(header, dict) else '?'}"
        )
    return header, 12 + n


def read(
    fileobj,
    where: str,
    on_image: Callable[[bytes], None] | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> SnapshotInfo:
    """Stream ``fileobj`` (binary, read()), verify the hash; image bytes go to ``on_image``
    (only call its result trustworthy once ``read`` returned: a mismatch raises at the end)."""
    digest = hashlib.sha256()
    head = b""
    while True:  # the header may straddle reads
        more = fileobj.read(READ_CHUNK_BYTES)
        head += more
        if (
            not more
            or len(head) >= 12 + MAX_HEADER_BYTES
            or (len(head) >= 12 and len(head) >= 12 + struct.unpack(">I", head[8:12])[0])
        ):
            break
    header, body_at = _parse_header(head, where)
    digest.update(head[:body_at])
    total = len(head)
    pending = head[body_at:]  # image bytes not yet known not to be the hash
    if on_progress:
        on_progress(total)
    while True:
        chunk = fileobj.read(READ_CHUNK_BYTES)
        if not chunk:
            break
        total += len(chunk)
        pending += chunk
        if len(pending) > HASH_BYTES:
            out, pending = pending[:-HASH_BYTES], pending[-HASH_BYTES:]
            digest.update(out)
            if on_image:
                on_image(out)
        if on_progress:
            on_progress(total)
    if len(pending) < HASH_BYTES:
        raise SnapshotFileError(f"{where}: truncated snapshot file (no SHA-256 trailer)")
    if len(pending) > HASH_BYTES:
        out, pending = pending[:-HASH_BYTES], pending[-HASH_BYTES:]
        digest.update(out)
        if on_image:
            on_image(out)
    want = digest.hexdigest()
    got = bytes(pending).hex()
    if got != want:
        raise SnapshotFileError(
            f"{where}: snapshot hash mismatch: the file says sha256 {got}, its content hashes "
            f"to {want}; the file is damaged or truncated, refusing to use it"
        )
    return SnapshotInfo(header, total, want)
