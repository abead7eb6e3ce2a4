"""Reading a run of segments as one log: CRC chained across files, errors typed.

``replay(paths, readers, state)`` scans the segments in order with ``decoder.scan`` and
returns where the data of the last one ends. A bad frame becomes a ``CorruptError``
subclass naming the file and the frame's offset; when it is in the last segment and
``decoder.is_torn`` says the failure is a partially written tail, it is a
``TornWriteError`` instead, which ``tolerate_torn=True`` turns into a normal end of data
(read-only tools; etcd's read mode does the same).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from wal import decoder
from wal.decoder import BadRecord, ScanState, SegmentData, is_torn, is_zero, scan
from wal.errors import (
    CorruptError,
    CRCMismatchError,
    MetadataMismatchError,
    SnapshotMismatchError,
    TornWriteError,
)

_ERROR_FOR_KIND = {
    decoder.CRC: CRCMismatchError,
    decoder.CRC_RECORD: CRCMismatchError,
    decoder.METADATA: MetadataMismatchError,
    decoder.SNAPSHOT_TERM: SnapshotMismatchError,
}


@dataclass(frozen=True, slots=True)
class ReplayEnd:
    end_offset: int  # where the last segment's good data ends
    last_size: int  # that segment's file size
    trailing_garbage: bool  # non-zero bytes after end_offset in the last segment
    torn: TornWriteError | None  # the torn tail that was tolerated, if any


def typed_error(path: str, bad: BadRecord, buf: SegmentData, last: bool) -> CorruptError:
    if last and is_torn(buf, bad.offset, bad.kind):
        return TornWriteError(
            path, bad.offset, f"torn write ({bad.reason}); `raftkv wal repair` truncates it here"
        )
    return _ERROR_FOR_KIND.get(bad.kind, CorruptError)(path, bad.offset, bad.reason)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Replay allocates one object per entry that stays alive; collecting young
    generations over and over while the list grows costs more than the decoding."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def replay(
    paths: Sequence[str],
    readers: Sequence[Callable[[], SegmentData]],
    st: ScanState,
    *,
    tolerate_torn: bool = False,
) -> ReplayEnd:
    """Scan the segments in order; ``readers[i]()`` returns segment i's whole content as
    bytes or a read-only mmap (then the file must not shrink meanwhile: hold its lock)."""
    assert paths and len(paths) == len(readers)
    last_i = len(paths) - 1
    torn = None
    with gc_paused():
        for i, (path, read) in enumerate(zip(paths, readers, strict=True)):
            buf = read()
            try:
                before = st.records
                try:
                    end = scan(buf, 0, st)
                except BadRecord as bad:
                    err = typed_error(path, bad, buf, i == last_i)
                    if not (tolerate_torn and isinstance(err, TornWriteError)):
                        raise err from None
                    torn = err
                    end = bad.offset
                if st.records == before and torn is None:
                    # a segment is renamed into place only after its header (crc, metadata
                    # records) is durable, so an empty one lost its contents
                    raise CorruptError(
                        path,
                        0,
                        "the segment holds no record (every segment starts with a crc record)",
                    )
                if i == last_i:
                    garbage = not is_zero(buf, end, len(buf))
                    return ReplayEnd(end, len(buf), garbage, torn)
            finally:
                _close(buf)
    raise AssertionError("unreachable")


def _close(buf: SegmentData) -> None:
    close = getattr(buf, "close", None)  # an mmap: unmap now rather than at collection
    if close is not None:
        try:
            close()
        except BufferError:
            pass  # still viewed (by a traceback): unmapped when collected
