"""Typed WAL errors.

Every problem found in the bytes of a segment is a ``CorruptError`` carrying the segment
file and the byte offset of the frame at fault, so a node that refuses to start can name
both (DESIGN §6). ``TornWriteError`` is the one corruption that ``wal.repair`` may fix: a
partially written tail of the last segment. Everything else is reported, never skipped.
"""

from __future__ import annotations


class WalError(Exception):
    """Base class of all WAL errors."""


class CorruptError(WalError):
    """The bytes of ``file`` at ``offset`` are not a valid continuation of the log."""

    def __init__(self, file: str, offset: int, reason: str) -> None:
        self.file = str(file)
        self.offset = int(offset)
        self.reason = reason
        super().__init__(f"{self.file} at offset {self.offset}: {reason}")


class CRCMismatchError(CorruptError):
    """A record's CRC does not match the running CRC-32C of the log."""


class TornWriteError(CorruptError):
    """The last segment ends in a partially written record (crash during a write).

    Only unsynced data can be torn, so nothing acknowledged under the ``always`` policy is
    lost by ``wal.repair(dir)``, which truncates the segment at ``offset``.
    """


class MetadataMismatchError(CorruptError):
    """A segment's metadata record differs from the metadata read before it."""


class SnapshotMismatchError(CorruptError):
    """The WAL has a snapshot record at the requested index but with another term."""


class SnapshotNotFoundError(WalError):
    """The snapshot given to ``open``/``verify`` has no snapshot record in the WAL."""


class SegmentNotFoundError(WalError):
    """No segment can hold the requested index, or the directory holds no segment at all."""


class SegmentSequenceError(WalError):
    """The segments to read do not have consecutive sequence numbers (one is missing)."""


class WalExistsError(WalError, FileExistsError):
    """``create`` was asked to build a WAL where a non-empty directory already exists."""


class LockedError(WalError):
    """A segment is locked by another WAL instance (this or another process)."""


class WalStateError(WalError):
    """The call is not valid in the WAL's current state (e.g. ``save`` before ``read_all``,
    anything after ``close``, appending to a WAL opened for reading)."""


class WalFailedError(WalError):
    """An earlier write or fsync failed; the WAL refuses further appends.

    After a failed fsync the kernel may have dropped the dirty pages, so retrying could
    acknowledge data that is not on disk. The process must reopen (and so re-read) the WAL.
    """
