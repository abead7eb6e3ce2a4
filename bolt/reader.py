"""Read a bolt database (``bolt.format``), checking every page it touches.

``BoltReader(data)`` takes the file's bytes (``bytes`` or a ``memoryview``/``mmap``, so a
file of gigabytes stays in the page cache: ``open_file``), picks the current meta page and
reads the freelist. ``buckets()`` lists the top-level buckets, ``items(path)`` yields a
bucket's ``(key, value)`` pairs in key order (``value`` is a ``Bucket`` for a nested bucket),
``bucket(path)`` says whether one exists. Inline and nested buckets, overflow pages and both
freelist encodings are read.

Refusal, not repair: anything that does not hold raises ``BoltError`` naming the page and
the check (bad magic or checksum in both meta pages, a high-water mark past the end of the
file, a page outside the file or below the meta pages, a page whose header names another
page, a wrong page type, elements or keys outside their page, keys out of order or outside
their branch's range, a page referenced twice in one walk, a tree deeper than
``MAX_DEPTH``, a malformed bucket value, a freelist entry out of range or repeated). A
reader never reads outside ``data`` and never loops: every page is visited at most once
per walk. Errors can surface mid-iteration; a caller that must not act on a damaged file
reads everything it needs before acting.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass

from bolt.format import (
    BRANCH,
    BRANCH_ELEMENT,
    BUCKET_HEADER,
    BUCKET_LEAF_FLAG,
    FREELIST,
    LEAF,
    LEAF_ELEMENT,
    MAGIC,
    MAX_PAGE_SIZE,
    META,
    META_BODY,
    META_BYTES,
    MIN_PAGE_SIZE,
    NO_FREELIST,
    PAGE_HEADER,
    U64,
    VERSION,
    BoltError,
    Meta,
    fnv64a,
    page_type,
)

MAX_DEPTH = 64  # a B+tree of 4 KiB pages is 4-5 levels deep at a billion keys
_HEADER = PAGE_HEADER.size


@dataclass(frozen=True, slots=True)
class Bucket:
    """A bucket found in a leaf: its root page, or its inline page's bytes (``root`` 0)."""

    root: int
    sequence: int
    inline: bytes | None = None


def open_file(path: str, size: int | None = None) -> tuple[BoltReader, mmap.mmap]:
    """A reader over the file mapped read-only (the first ``size`` bytes, default all of it),
    and the mapping (close it when done). An empty file is refused."""
    with open(path, "rb") as f:
        length = os.fstat(f.fileno()).st_size
        if length == 0:
            raise BoltError(None, "size", f"{path} is empty")
        mapping = mmap.mmap(f.fileno(), length, access=mmap.ACCESS_READ)
    try:
        return BoltReader(memoryview(mapping)[: size if size is not None else length]), mapping
    except BaseException:
        mapping.close()
        raise


def looks_like_bolt(head: bytes) -> bool:
    """Whether ``head`` (the file's first 32 bytes or more) starts like a bolt meta page."""
    if len(head) < _HEADER + 8:
        return False
    flags: int = PAGE_HEADER.unpack_from(head, 0)[1]
    magic: int
    version: int
    magic, version = struct.unpack_from("<II", head, _HEADER)
    return flags == META and magic == MAGIC and version == VERSION


class BoltReader:
    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        self._data = memoryview(data).cast("B")
        self.size = len(self._data)
        self.meta = self._current_meta()
        self.page_size = self.meta.page_size
        self.free_pages = self._read_freelist()

    # --- meta -------------------------------------------------------------------------------

    def _meta_at(self, pgid: int, page_size: int) -> Meta:
        off = pgid * page_size
        if off + _HEADER + META_BYTES > self.size:
            raise BoltError(pgid, "meta", f"the file ({self.size} bytes) ends inside the page")
        pid, flags, _, _ = PAGE_HEADER.unpack_from(self._data, off)
        if flags != META:
            raise BoltError(pgid, "meta", f"page type {page_type(flags)}, want meta")
        body = bytes(self._data[off + _HEADER : off + _HEADER + META_BODY.size])
        magic, version, psize, mflags, root, seq, freelist, hwm, txid = META_BODY.unpack(body)
        (checksum,) = U64.unpack_from(self._data, off + _HEADER + META_BODY.size)
        if magic != MAGIC:
            raise BoltError(pgid, "magic", f"{magic:#x}, want {MAGIC:#x}")
        if version != VERSION:
            raise BoltError(pgid, "version", f"{version}, want {VERSION}")
        if checksum != fnv64a(body):
            raise BoltError(
                pgid, "checksum", f"{checksum:#x}, the meta hashes to {fnv64a(body):#x}"
            )
        if pid != pgid:
            raise BoltError(pgid, "page id", f"the header says page {pid}")
        if psize != page_size:
            raise BoltError(pgid, "page size", f"{psize}, read as {page_size}")
        if hwm < 3 or hwm * page_size > self.size:
            raise BoltError(
                pgid,
                "high-water mark",
                f"{hwm} pages of {page_size} bytes; the file has {self.size} bytes (truncated?)",
            )
        if not 2 <= root < hwm:
            raise BoltError(pgid, "root bucket", f"page {root} outside pages 2..{hwm - 1}")
        if freelist != NO_FREELIST and not 2 <= freelist < hwm:
            raise BoltError(pgid, "freelist", f"page {freelist} outside pages 2..{hwm - 1}")
        return Meta(psize, mflags, root, seq, freelist, hwm, txid)

    def _current_meta(self) -> Meta:
        if self.size < _HEADER + META_BYTES:
            raise BoltError(None, "size", f"{self.size} bytes is too short for a bolt file")
        sizes = []
        (first_size,) = U64.unpack_from(self._data, _HEADER + 8)  # page_size, flags
        first_size &= 0xFFFFFFFF
        if _valid_page_size(first_size):
            sizes.append(first_size)
        sizes += [s for s in (4096, 8192, 16384, 32768, 65536, 1024, 2048, 512) if s not in sizes]
        errors: list[BoltError] = []
        metas = []
        for pgid in (0, 1):
            for page_size in sizes if pgid else sizes[:1]:
                try:
                    metas.append(self._meta_at(pgid, page_size))
                    break
                except BoltError as exc:
                    if not errors or errors[-1].page != pgid:
                        errors.append(exc)
        if not metas:
            raise BoltError(
                None, "meta", "no valid meta page: " + "; ".join(str(e) for e in errors)
            )
        return max(metas, key=lambda m: m.txid)

    # --- pages ------------------------------------------------------------------------------

    def _page(self, pgid: int, want: int) -> tuple[int, int, int]:
        """(offset, element count, end offset) of page ``pgid``, checked to be ``want``."""
        if not 2 <= pgid < self.meta.pgid:
            raise BoltError(pgid, "bounds", f"outside pages 2..{self.meta.pgid - 1}")
        off = pgid * self.page_size
        pid, flags, count, overflow = PAGE_HEADER.unpack_from(self._data, off)
        if pid != pgid:
            raise BoltError(pgid, "page id", f"the header says page {pid}")
        if not flags & want:
            raise BoltError(pgid, "page type", f"{page_type(flags)}, want {page_type(want)}")
        end = off + (overflow + 1) * self.page_size
        if pgid + overflow + 1 > self.meta.pgid:
            raise BoltError(pgid, "overflow", f"{overflow} pages run past the high-water mark")
        return off, count, end

    def _read_freelist(self) -> frozenset[int]:
        pgid = self.meta.freelist
        if pgid == NO_FREELIST:
            return frozenset()
        off, count, end = self._page(pgid, FREELIST)
        start = off + _HEADER
        if count == 0xFFFF:
            if start + 8 > end:
                raise BoltError(pgid, "freelist", "the count does not fit the page")
            (count,) = U64.unpack_from(self._data, start)
            start += 8
        if start + 8 * count > end:
            raise BoltError(pgid, "freelist", f"{count} ids do not fit the page")
        ids = self._data[start : start + 8 * count].cast("Q") if count else []
        free = frozenset(ids)
        if len(free) != count:
            raise BoltError(pgid, "freelist", "a page id is listed twice")
        if free and (min(free) < 2 or max(free) >= self.meta.pgid):
            raise BoltError(pgid, "freelist", "a free page id outside the file's pages")
        return free

    # --- buckets ----------------------------------------------------------------------------

    def root(self) -> Bucket:
        return Bucket(self.meta.root, self.meta.sequence)

    def buckets(self) -> list[bytes]:
        """The names of the top-level buckets, in order."""
        return [k for k, v in self._walk(self.root(), "root") if isinstance(v, Bucket)]

    def bucket(self, *path: bytes) -> Bucket | None:
        """The bucket at ``path`` (names from the top), or None."""
        b = self.root()
        for name in path:
            found = None
            for k, v in self._walk(b, name.decode("utf-8", "replace")):
                if k == name:
                    found = v if isinstance(v, Bucket) else None
                    break
                if k > name:
                    break
            if found is None:
                return None
            b = found
        return b

    def items(self, *path: bytes) -> Iterator[tuple[bytes, bytes | Bucket]]:
        """The pairs of the bucket at ``path``, in key order (nothing if it does not exist)."""
        b = self.bucket(*path)
        if b is None:
            return iter(())
        return self._walk(b, "/".join(p.decode("utf-8", "replace") for p in path))

    def walk(self, bucket: Bucket, name: str = "") -> Iterator[tuple[bytes, bytes | Bucket]]:
        return self._walk(bucket, name)

    def _walk(self, bucket: Bucket, name: str) -> Iterator[tuple[bytes, bytes | Bucket]]:
        last: list[bytes | None] = [None]
        if bucket.root == 0:
            if bucket.inline is None:
                raise BoltError(None, "bucket", f"bucket {name!r} has root 0 and no inline page")
            view = memoryview(bucket.inline)
            yield from self._leaf(view, 0, len(view), 0, last, None, None, inline=True)
            return
        yield from self._tree(bucket.root, 0, set(), last, None, None)

    def _tree(
        self,
        pgid: int,
        depth: int,
        seen: set[int],
        last: list[bytes | None],
        lo: bytes | None,
        hi: bytes | None,
    ) -> Iterator[tuple[bytes, bytes | Bucket]]:
        if depth > MAX_DEPTH:
            raise BoltError(pgid, "depth", f"the tree is deeper than {MAX_DEPTH} levels")
        if pgid in seen:
            raise BoltError(pgid, "references", "the page is referenced twice")
        seen.add(pgid)
        if pgid in self.free_pages:
            raise BoltError(pgid, "freelist", "a page in use is on the freelist")
        off, count, end = self._page(pgid, BRANCH | LEAF)
        flags = PAGE_HEADER.unpack_from(self._data, off)[1]
        if flags & LEAF:
            yield from self._leaf(self._data, off, end, pgid, last, lo, hi)
            return
        children = self._branch(off, count, end, pgid, lo, hi)
        # bolt's search sends key k to the child whose element key is the last <= k (the
        # first child also gets the keys below its element key): a child's keys lie in
        # [its key, the next element's key), the first child's from its parent's bound.
        for i, (key, child) in enumerate(children):
            lower = key if i else lo
            upper = children[i + 1][0] if i + 1 < len(children) else hi
            yield from self._tree(child, depth + 1, seen, last, lower, upper)

    def _branch(
        self, off: int, count: int, end: int, pgid: int, lo: bytes | None, hi: bytes | None
    ) -> list[tuple[bytes, int]]:
        data = self._data
        if count == 0:
            raise BoltError(pgid, "elements", "a branch page with no elements")
        if off + _HEADER + count * BRANCH_ELEMENT.size > end:
            raise BoltError(pgid, "elements", f"{count} elements do not fit the page")
        out = []
        prev = None
        for i in range(count):
            e = off + _HEADER + i * BRANCH_ELEMENT.size
            pos, ksize, child = BRANCH_ELEMENT.unpack_from(data, e)
            if e + pos + ksize > end:
                raise BoltError(pgid, "element", f"element {i}'s key lies outside the page")
            key = bytes(data[e + pos : e + pos + ksize])
            if prev is not None and key <= prev:
                raise BoltError(pgid, "key order", f"element {i}'s key is not above the last")
            if hi is not None and key >= hi:
                raise BoltError(pgid, "key range", f"element {i}'s key is above its parent's")
            prev = key
            out.append((key, child))
        return out

    def _leaf(
        self,
        data: memoryview,
        off: int,
        end: int,
        pgid: int,
        last: list[bytes | None],
        lo: bytes | None,
        hi: bytes | None,
        inline: bool = False,
    ) -> Iterator[tuple[bytes, bytes | Bucket]]:
        where = pgid if not inline else None
        if end - off < _HEADER:
            raise BoltError(where, "inline bucket", "shorter than a page header")
        _, flags, count, _ = PAGE_HEADER.unpack_from(data, off)
        if not flags & LEAF:
            raise BoltError(where, "page type", f"{page_type(flags)}, want leaf")
        if off + _HEADER + count * LEAF_ELEMENT.size > end:
            raise BoltError(where, "elements", f"{count} elements do not fit the page")
        for i in range(count):
            e = off + _HEADER + i * LEAF_ELEMENT.size
            eflags, pos, ksize, vsize = LEAF_ELEMENT.unpack_from(data, e)
            k0 = e + pos
            if k0 + ksize + vsize > end:
                raise BoltError(where, "element", f"element {i}'s key or value lies outside")
            if eflags & ~BUCKET_LEAF_FLAG:
                raise BoltError(where, "element", f"element {i} has unknown flags {eflags:#x}")
            key = bytes(data[k0 : k0 + ksize])
            prev = last[0]
            if prev is not None and key <= prev:
                raise BoltError(where, "key order", f"element {i}'s key is not above the last")
            if (lo is not None and key < lo) or (hi is not None and key >= hi):
                raise BoltError(where, "key range", f"element {i}'s key is outside its branch")
            last[0] = key
            value = bytes(data[k0 + ksize : k0 + ksize + vsize])
            if eflags & BUCKET_LEAF_FLAG:
                yield key, self._bucket_value(value, where, i)
            else:
                yield key, value

    def _bucket_value(self, value: bytes, where: int | None, i: int) -> Bucket:
        if len(value) < BUCKET_HEADER.size:
            raise BoltError(where, "bucket", f"element {i}'s bucket header is truncated")
        root, seq = BUCKET_HEADER.unpack_from(value, 0)
        if root == 0:
            return Bucket(0, seq, value[BUCKET_HEADER.size :])
        if len(value) != BUCKET_HEADER.size:
            raise BoltError(where, "bucket", f"element {i} has a root page and inline bytes")
        return Bucket(root, seq)


def _valid_page_size(n: int) -> bool:
    return MIN_PAGE_SIZE <= n <= MAX_PAGE_SIZE and n & (n - 1) == 0
