"""Typed WAL errors.

Every problem found in the bytes of a segment is a ``CorruptError`` carrying the segment
file and the byte offset of the frame at fault, so a node that refuses to start can name
both. ``TornWriteError`` is the one corruption that ``wal.repair`` may fix: a
partially written tail of the last segment. Everything else is reported, never skipped.
"""

from __future__ import annotations

import errno
import os

# errnos that mean "the disk (or the quota) is full": freeing space is the fix
DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


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


def free_bytes(path: str) -> int | None:
    """Bytes an unprivileged writer may still use on the file system holding ``path`` (the
    nearest existing parent is asked); None if unknown."""
    path = os.path.abspath(path)
    while path and not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def is_disk_full(exc: BaseException | None) -> bool:
    """Whether ``exc`` or an exception it was raised from is ENOSPC/EDQUOT."""
    seen = 0
    while exc is not None and seen < 16:
        if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def describe_os_error(exc: OSError, path: str, doing: str) -> str:
    """``"<doing> <path>: <strerror>"``, and for a full disk how much is free and where:
    every disk error of the WAL names the file, so an operator knows what to free."""
    text = f"{doing} {path}: {exc.strerror or exc}"
    if exc.errno in DISK_FULL_ERRNOS:
        where = os.path.dirname(os.path.abspath(path))
        free = free_bytes(where)
        shown = "unknown" if free is None else f"{free} bytes"
        text += (
            f" (free space on the file system holding {where}: {shown}; free some "
            f"space there or move the directory to a larger disk)"
        )
    return text


def os_error_at(exc: OSError, path: str, doing: str) -> OSError:
    """The same OSError (errno kept) with a message from ``describe_os_error``."""
    return OSError(exc.errno, describe_os_error(exc, path, doing))
