"""A snapshot's data on its way into a ``.snap`` file, held in the page cache, not the heap.

Why: at a million keys a snapshot image is a few hundred megabytes, and it arrives in
pieces: this member's state machine produces it 64 KiB at a time, a leader streams it in
64 KiB chunks. Holding the pieces until the last one came, then joining them, cost the
member as much heap as the image, twice at the peak, and CPython's allocator kept much of
that after it was freed.

Contract: ``SpillFile(directory)`` is an anonymous temporary file in ``directory`` (``O_TMPFILE``
where the filesystem has it, else a file unlinked as soon as it is created), so a crash
leaves nothing behind. ``append(parts)`` writes the parts at the end, with one ``writev``
per at most ``IOV_MAX`` parts; it does disk I/O, so call it from a worker thread, one call
at a time. ``map()`` ends the writing and returns all that was appended as one read-only
``memoryview`` of the file: its pages live in the page cache (clean once written back,
reclaimable), and it stays valid after the file is closed. ``close()`` drops the file
without mapping it (idempotent; after ``map`` it does nothing more). Nothing is fsynced:
the data becomes durable as the ``.snap`` file written from the mapping.

``await spill_chunks(chunks, directory)`` is how the member's event loop fills one: it takes
the chunks (an iterable, one chunk per loop turn, or an async iterable), hands each batch of
about ``SPILL_BATCH_BYTES`` to a worker thread while it gathers the next, and returns the
mapping; at most two batches are in the heap at a time.
"""

from __future__ import annotations

import asyncio
import mmap
import os
import tempfile
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Sequence

# How much of an image a producer holds before it hands the batch to ``append``: big enough
# that the writes are few, small against an image of hundreds of megabytes.
SPILL_BATCH_BYTES = 4 << 20

# Linux refuses a writev of more buffers than this (the usual IOV_MAX).
_MAX_BUFFERS_PER_WRITE = 1024


class SpillFile:
    def __init__(self, directory: str | None = None):
        self._file = tempfile.TemporaryFile(dir=directory, prefix="snap-spill-")
        self.size = 0

    def append(self, parts: Sequence[bytes | memoryview]) -> None:
        views = [memoryview(p).cast("B") for p in parts if len(p)]
        fd = self._file.fileno()
        i = 0
        while i < len(views):
            written = os.writev(fd, views[i : i + _MAX_BUFFERS_PER_WRITE])
            self.size += written
            while written:  # a short write: resume inside the part it stopped in
                if written >= len(views[i]):
                    written -= len(views[i])
                    i += 1
                else:
                    views[i] = views[i][written:]
                    written = 0

    def fileno(self) -> int:
        """The file's descriptor (valid until ``map`` or ``close``): to hand the file to
        another process (``snap.continued``)."""
        return self._file.fileno()

    def map(self) -> memoryview:
        """Everything appended, mapped read-only; the file is closed (its pages stay mapped)."""
        try:
            if self.size == 0:
                return memoryview(b"")
            return memoryview(mmap.mmap(self._file.fileno(), self.size, access=mmap.ACCESS_READ))
        finally:
            self._file.close()

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> SpillFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def spill_chunks(
    chunks: Iterable[bytes | memoryview] | AsyncIterable[bytes | memoryview],
    directory: str | None = None,
) -> memoryview:
    """All of ``chunks`` in a ``SpillFile`` in ``directory``, mapped (see the module doc)."""
    with SpillFile(directory) as spill:
        await fill(spill, chunks)
        return spill.map()


async def fill(
    spill: SpillFile,
    chunks: Iterable[bytes | memoryview] | AsyncIterable[bytes | memoryview],
) -> None:
    """Append ``chunks`` to ``spill`` as ``spill_chunks`` does (a chunk per loop turn, the
    writes in a worker thread a batch at a time)."""
    loop = asyncio.get_running_loop()
    batch: list[bytes | memoryview] = []
    batch_bytes = 0
    writing: asyncio.Future[None] | None = None
    try:
        async for chunk in _one_per_turn(chunks):
            batch.append(chunk)
            batch_bytes += len(chunk)
            if batch_bytes >= SPILL_BATCH_BYTES:
                if writing is not None:
                    await writing
                writing = loop.run_in_executor(None, spill.append, batch)
                batch, batch_bytes = [], 0
    finally:
        if writing is not None:  # never close the file under a running write
            await asyncio.shield(writing)
    await loop.run_in_executor(None, spill.append, batch)


async def _one_per_turn(
    chunks: Iterable[bytes | memoryview] | AsyncIterable[bytes | memoryview],
) -> AsyncIterator[bytes | memoryview]:
    if isinstance(chunks, AsyncIterable):
        async for chunk in chunks:
            yield chunk
    else:
        for chunk in chunks:
            yield chunk
            await asyncio.sleep(0)  # a producer on the loop (the store's stream) yields here


def drop_resident_pages(data: bytes | memoryview) -> None:
    """If ``data`` is mapped from a file (a ``map()`` above, or ``snap.map_data``), drop
    its pages from this process's resident set: reading a snapshot through its mapping (a
    restore, a send) leaves hundreds of megabytes counted in the member's RSS. The pages
    stay in the page cache, and a later read maps them back. Anything else: no-op."""
    mapped = data.obj if isinstance(data, memoryview) else None
    if isinstance(mapped, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
        try:
            mapped.madvise(mmap.MADV_DONTNEED)
        except (OSError, ValueError):  # closed, or the platform refuses: only memory is lost
            pass
