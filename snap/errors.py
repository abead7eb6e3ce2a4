"""Typed errors of the snapshot store.

Two families, handled differently by the loader:

* ``CorruptSnapshotError`` and its subclasses: the bytes of one ``.snap`` file are not a valid
  snapshot (empty, undecodable, CRC mismatch, name disagreeing with the content). The loader
  quarantines such a file as ``*.snap.broken`` and tries the next older one.
* Everything else (``NoSnapshotError``, ``SnapshotTooLargeError``, ``OSError``): the file is
  left untouched and the error propagates, because it says nothing about the file's bytes
  (a permission problem or a too-small limit must not cost us a good snapshot).
"""


class SnapError(Exception):
    """Base class of every error raised by ``snap``."""


class NoSnapshotError(SnapError):
    """No usable snapshot: none exists, none matches the WAL, or all were broken."""

    def __init__(self, dir_path: str, broken: tuple[str, ...] = (), detail: str = "") -> None:
        self.dir_path = dir_path
        self.broken = broken  # paths quarantined as *.snap.broken during this load
        msg = f"snap: no available snapshot in {dir_path}"
        if detail:
            msg += f" ({detail})"
        if broken:
            msg += f"; quarantined {len(broken)} broken file(s): {', '.join(broken)}"
        super().__init__(msg)


class SnapshotTooLargeError(SnapError):
    """A snapshot exceeds the configured ``max_snapshot_bytes`` (a policy limit, not damage)."""

    def __init__(self, path: str, size_bytes: int, max_snapshot_bytes: int) -> None:
        self.path = path
        self.size_bytes = size_bytes
        self.max_snapshot_bytes = max_snapshot_bytes
        super().__init__(
            f"snap: {path}: {size_bytes} bytes exceeds max_snapshot_bytes={max_snapshot_bytes}"
        )


class CorruptSnapshotError(SnapError):
    """The file at ``path`` is not a valid snapshot; ``offset`` locates the problem if known."""

    def __init__(self, path: str, reason: str, offset: int | None = None) -> None:
        self.path = path
        self.reason = reason
        self.offset = offset
        where = f" at offset {offset}" if offset is not None else ""
        super().__init__(f"snap: {path}{where}: {reason}")


class EmptySnapshotError(CorruptSnapshotError):
    """The file is empty or its snappb record carries no raft snapshot bytes (etcd's
    ``ErrEmptySnapshot``)."""


class SnapshotDecodeError(CorruptSnapshotError):
    """The file is not a well-formed snappb record or raft snapshot (truncated, malformed)."""


class CRCMismatchError(CorruptSnapshotError):
    """The CRC-32C stored in the file differs from the CRC of its data (etcd's
    ``ErrCRCMismatch``)."""

    def __init__(self, path: str, stored_crc: int, computed_crc: int) -> None:
        self.stored_crc = stored_crc
        self.computed_crc = computed_crc
        super().__init__(
            path, f"crc mismatch: stored {stored_crc:#010x}, computed {computed_crc:#010x}"
        )


class NameMismatchError(CorruptSnapshotError):
    """The (term, index) in the file name differ from the snapshot's metadata, so matching the
    file against the WAL's snapshot records by name would be unsound."""
