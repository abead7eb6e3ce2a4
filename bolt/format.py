"""bolt's on-disk layout (bbolt 1.3, the database etcd 3.4 and 3.5 keep in ``member/snap/db``).

A file is a run of pages of ``page_size`` bytes (4096 on Linux/amd64, etcd's), page ``n`` at
offset ``n * page_size``; a page with ``overflow`` > 0 spans that many more pages. All
integers are little-endian (the layout is the in-memory one of the machines etcd runs on).

Page header (16 bytes): ``id`` u64 (the page's own number), ``flags`` u16 (``BRANCH`` 0x01,
``LEAF`` 0x02, ``META`` 0x04, ``FREELIST`` 0x10), ``count`` u16 (elements), ``overflow``
u32.

* Meta page (pages 0 and 1; the valid one with the higher ``txid`` is current), after the
  header: ``magic`` u32 ``0xED0CDAED``, ``version`` u32 (2), ``page_size`` u32, ``flags`` u32,
  the root bucket (``root`` u64 page, ``sequence`` u64), ``freelist`` u64 page (all ones: not
  written), ``pgid`` u64 (the high-water mark: pages in use are below it), ``txid`` u64,
  ``checksum`` u64 = FNV-64a of the 56 bytes before it.
* Branch page: ``count`` elements of (``pos`` u32, ``ksize`` u32, ``pgid`` u64), each key at
  the element's own offset + ``pos``; a child holds the keys from its element's key up to
  the next element's.
* Leaf page: ``count`` elements of (``flags`` u32, ``pos`` u32, ``ksize`` u32, ``vsize`` u32),
  the key at the element's offset + ``pos`` and the value right after it. ``flags`` 0x01:
  the value is a nested bucket.
* A bucket's value: its header (``root`` u64, ``sequence`` u64). ``root`` 0 means an inline
  bucket: a leaf page (header included, ``id`` 0) follows the header inside the value.
* Freelist page: ``count`` page ids (u64); a ``count`` of 0xFFFF means the first u64 is the
  real count.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = 0xED0CDAED
VERSION = 2
DEFAULT_PAGE_SIZE = 4096
MIN_PAGE_SIZE = 512
MAX_PAGE_SIZE = 1 << 16

BRANCH = 0x01
LEAF = 0x02
META = 0x04
FREELIST = 0x10
BUCKET_LEAF_FLAG = 0x01
NO_FREELIST = (1 << 64) - 1

PAGE_HEADER = struct.Struct("<QHHI")  # id, flags, count, overflow
BRANCH_ELEMENT = struct.Struct("<IIQ")  # pos, ksize, pgid
LEAF_ELEMENT = struct.Struct("<IIII")  # flags, pos, ksize, vsize
BUCKET_HEADER = struct.Struct("<QQ")  # root, sequence
META_BODY = struct.Struct("<IIIIQQQQQ")  # magic .. txid (56 bytes), checksum follows
U64 = struct.Struct("<Q")
META_BYTES = META_BODY.size + 8

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3


def fnv64a(data: bytes) -> int:
    """FNV-1a, 64 bits: bolt's meta page checksum."""
    h = _FNV_OFFSET
    for b in data:
        h = ((h ^ b) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def page_type(flags: int) -> str:
    for bit, name in ((BRANCH, "branch"), (LEAF, "leaf"), (META, "meta"), (FREELIST, "freelist")):
        if flags & bit:
            return name
    return f"unknown<{flags:02x}>"


@dataclass(frozen=True, slots=True)
class Meta:
    page_size: int
    flags: int
    root: int  # the root bucket's page
    sequence: int
    freelist: int
    pgid: int  # high-water mark
    txid: int

    def encode(self) -> bytes:
        """The 64 bytes after a meta page's header, checksum included."""
        body = META_BODY.pack(
            MAGIC,
            VERSION,
            self.page_size,
            self.flags,
            self.root,
            self.sequence,
            self.freelist,
            self.pgid,
            self.txid,
        )
        return body + U64.pack(fnv64a(body))


class BoltError(ValueError):
    """A file bolt would not read, or that is damaged: ``page`` is the page at fault (None
    for the file as a whole) and ``check`` names the check that failed."""

    def __init__(self, page: int | None, check: str, detail: str) -> None:
        where = "bolt file" if page is None else f"bolt page {page}"
        super().__init__(f"{where}: {check}: {detail}")
        self.page = page
        self.check = check
