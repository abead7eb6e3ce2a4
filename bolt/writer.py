"""Write a bolt database (``bolt.format``) from sorted key/value streams, page by page.

What it writes (a subset of what bolt can hold, all of it readable by bbolt 1.3 and passing
its ``Tx.Check``, which ``etcdctl snapshot status`` runs):

* pages of ``page_size`` bytes (4096 by default, etcd's on Linux/amd64); meta pages 0 and 1
  (page 0 with ``txid``, page 1 with ``txid - 1``, as bolt's ``Tx.WriteTo`` writes a copy);
  an empty freelist at page 2; the data pages from page 3 on, every one of them in use;
* each bucket as a B+tree built bottom-up: leaves filled in key order up to the page size
  (a single pair larger than a page gets overflow pages), then branch levels over them;
  a bucket whose pairs fit a quarter page is written inline in its parent's leaf, as bolt
  does with small buckets;
* nested buckets: a bucket's value may be another bucket (``BucketRef``); the root bucket
  holds the top-level ones.

Use: ``w = BoltWriter(f)`` on a seekable binary file; ``ref = w.write_bucket(pairs)`` for each
bucket, children before their parents (``pairs`` iterable in strictly ascending key order,
each value ``bytes`` or a ``BucketRef``); ``w.finish(top_level_pairs)`` writes the root
bucket, the freelist and the meta pages and returns the file's size. Memory: one page being
filled plus one (key, page) entry per page written (tens of thousands at a million keys),
never the data. Keys out of order, an empty key, a key over ``MAX_KEY_BYTES`` or a value over
``MAX_VALUE_BYTES`` raise ``ValueError`` (bolt's own limits).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import BinaryIO

from bolt.format import (
    BRANCH,
    BRANCH_ELEMENT,
    BUCKET_HEADER,
    BUCKET_LEAF_FLAG,
    DEFAULT_PAGE_SIZE,
    FREELIST,
    LEAF,
    LEAF_ELEMENT,
    META,
    PAGE_HEADER,
    Meta,
)

MAX_KEY_BYTES = 32768
MAX_VALUE_BYTES = (1 << 31) - 2
_HEADER = PAGE_HEADER.size
_FIRST_DATA_PAGE = 3


@dataclass(frozen=True, slots=True)
class BucketRef:
    """A written bucket: the bytes its parent stores as the value (flagged as a bucket)."""

    value: bytes


class BoltWriter:
    def __init__(self, f: BinaryIO, page_size: int = DEFAULT_PAGE_SIZE) -> None:
        self.f = f
        self.page_size = page_size
        self.next_pgid = _FIRST_DATA_PAGE
        self.closed = False

    # --- pages ------------------------------------------------------------------------------

    def _write_page(self, flags: int, elements: list[tuple[bytes, bytes, int]]) -> int:
        """Write one branch or leaf page of ``elements`` (key, value, leaf flags or child
        pgid) at the next free page; its page id."""
        pgid = self.next_pgid
        body = self._page_body(flags, elements)
        size = _HEADER + len(body)
        overflow = max(0, -(-size // self.page_size) - 1)
        page = PAGE_HEADER.pack(pgid, flags, len(elements), overflow) + body
        self.f.seek(pgid * self.page_size)
        self.f.write(page.ljust((overflow + 1) * self.page_size, b"\0"))
        self.next_pgid += overflow + 1
        return pgid

    @staticmethod
    def _page_body(flags: int, elements: list[tuple[bytes, bytes, int]]) -> bytes:
        n = len(elements)
        heads = []
        data = []
        if flags == LEAF:
            at = n * LEAF_ELEMENT.size  # bytes from the first element to the next key
            for i, (k, v, eflags) in enumerate(elements):
                pos = at - i * LEAF_ELEMENT.size
                heads.append(LEAF_ELEMENT.pack(eflags, pos, len(k), len(v)))
                data.append(k)
                data.append(v)
                at += len(k) + len(v)
        else:
            at = n * BRANCH_ELEMENT.size
            for i, (k, _, child) in enumerate(elements):
                pos = at - i * BRANCH_ELEMENT.size
                heads.append(BRANCH_ELEMENT.pack(pos, len(k), child))
                data.append(k)
                at += len(k)
        return b"".join(heads) + b"".join(data)

    # --- buckets ----------------------------------------------------------------------------

    def write_bucket(
        self, pairs: Iterable[tuple[bytes, bytes | BucketRef]], sequence: int = 0
    ) -> BucketRef:
        """Write a bucket of ``pairs`` (strictly ascending keys); what its parent stores."""
        if self.closed:
            raise ValueError("the writer is finished")
        limit = self.page_size - _HEADER
        page: list[tuple[bytes, bytes, int]] = []
        used = 0
        leaves: list[tuple[bytes, int]] = []  # (first key, pgid) of each page written
        prev: bytes | None = None
        for key, value in pairs:
            if not key or len(key) > MAX_KEY_BYTES:
                raise ValueError(f"bolt keys are 1..{MAX_KEY_BYTES} bytes, got {len(key)}")
            if prev is not None and key <= prev:
                raise ValueError(f"keys out of order: {key!r} after {prev!r}")
            prev = key
            if isinstance(value, BucketRef):
                raw, eflags = value.value, BUCKET_LEAF_FLAG
            else:
                raw, eflags = bytes(value), 0
            if len(raw) > MAX_VALUE_BYTES:
                raise ValueError(f"a bolt value is at most {MAX_VALUE_BYTES} bytes")
            size = LEAF_ELEMENT.size + len(key) + len(raw)
            if page and used + size > limit:
                leaves.append((page[0][0], self._write_page(LEAF, page)))
                page, used = [], 0
            page.append((key, raw, eflags))
            used += size
        if not leaves and _HEADER + used <= self.page_size // 4:
            inline = PAGE_HEADER.pack(0, LEAF, len(page), 0) + self._page_body(LEAF, page)
            return BucketRef(BUCKET_HEADER.pack(0, sequence) + inline)
        if page or not leaves:
            leaves.append((page[0][0] if page else b"", self._write_page(LEAF, page)))
        level = leaves
        while len(level) > 1:
            level = self._branch_level(level)
        return BucketRef(BUCKET_HEADER.pack(level[0][1], sequence))

    def _branch_level(self, children: list[tuple[bytes, int]]) -> list[tuple[bytes, int]]:
        limit = self.page_size - _HEADER
        out: list[tuple[bytes, int]] = []
        page: list[tuple[bytes, bytes, int]] = []
        used = 0
        for key, child in children:
            size = BRANCH_ELEMENT.size + len(key)
            if len(page) >= 2 and used + size > limit:
                out.append((page[0][0], self._write_page(BRANCH, page)))
                page, used = [], 0
            page.append((key, b"", child))
            used += size
        out.append((page[0][0], self._write_page(BRANCH, page)))
        return out

    def finish(
        self, buckets: Iterable[tuple[bytes, BucketRef]], txid: int = 2, sequence: int = 0
    ) -> int:
        """Write the root bucket (its pairs: the top-level buckets, in name order), the
        freelist and the meta pages; the file's size in bytes."""
        pairs = list(buckets)
        if any(not isinstance(v, BucketRef) for _, v in pairs):
            raise ValueError("the root bucket holds buckets only")
        limit = self.page_size - _HEADER
        root: list[tuple[bytes, bytes, int]] = [(k, v.value, BUCKET_LEAF_FLAG) for k, v in pairs]
        for k, _ in pairs:  # checked as write_bucket checks, then written as a real page:
            if not k or len(k) > MAX_KEY_BYTES:  # a meta page's root is never inline
                raise ValueError(f"bad bucket name {k!r}")
        if any(a[0] >= b[0] for a, b in zip(root, root[1:], strict=False)):
            raise ValueError("bucket names out of order")
        if sum(LEAF_ELEMENT.size + len(k) + len(v) for k, v, _ in root) <= limit:
            root_pgid = self._write_page(LEAF, root)
        else:
            ref = self.write_bucket(pairs)
            root_pgid = int.from_bytes(ref.value[:8], "little")
            if root_pgid == 0:  # inline: cannot be, it did not fit a page
                raise AssertionError("root bucket written inline")
        hwm = self.next_pgid
        self.f.seek(2 * self.page_size)
        self.f.write(PAGE_HEADER.pack(2, FREELIST, 0, 0).ljust(self.page_size, b"\0"))
        for pgid, tx in ((0, txid), (1, txid - 1)):
            meta = Meta(self.page_size, 0, root_pgid, sequence, 2, hwm, tx)
            page = PAGE_HEADER.pack(pgid, META, 0, 0) + meta.encode()
            self.f.seek(pgid * self.page_size)
            self.f.write(page.ljust(self.page_size, b"\0"))
        self.f.seek(hwm * self.page_size)
        self.f.truncate()
        self.closed = True
        return hwm * self.page_size
