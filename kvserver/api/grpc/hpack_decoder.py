"""HPACK (RFC 7541) header-block decoding, lean enough for every gRPC call a front end reads.

``Decoder.decode(block)`` gives a block's headers as ``(name, value)`` strings and keeps the
peer's dynamic table in step, as ``hpack.Decoder`` does, and it accepts and refuses exactly
the blocks that one does (``tests/grpcapi/test_hpack_decoder.py`` checks both on random
blocks). It raises ``hpack``'s exceptions, so callers handle either decoder alike.

Why not ``hpack.Decoder`` itself: a grpc-go client that sets a deadline sends a new
``grpc-timeout`` value with every call, indexed, so its blocks never repeat and every call
is decoded field by field. ``hpack`` builds each field as bytes through several calls and
then converts it to text; that was over a third of a front end's CPU under etcd's Go
benchmark client. Here the tables hold text already, so a reference (most of a gRPC block)
is a lookup, and only literals are decoded (Huffman with ``hpack``'s own table).

Bounds, as ``hpack`` 4.2's: an integer takes at most ``VARINT_MAX_CONTINUATION`` bytes after
its prefix; the decoded list at most ``max_header_list_size`` (RFC 7541's accounting: name,
value and 32 bytes a field); the peer's table at most ``max_allowed_table_size``, checked at
each size update and again at the block's end; size updates only before the block's first
field. ``generation`` changes whenever the dynamic table does (callers cache answers for
blocks that leave it alone).
"""

from __future__ import annotations

from collections import deque

from hpack.exceptions import (
    HPACKDecodingError,
    InvalidTableIndex,
    InvalidTableSizeError,
    OversizedHeaderListError,
)
from hpack.huffman_table import decode_huffman
from hpack.table import HeaderTable

VARINT_MAX_CONTINUATION = 5  # bytes after an integer's prefix, as hpack 4.2 allows
ENTRY_OVERHEAD = 32  # RFC 7541 4.1
DEFAULT_TABLE_SIZE = 4096  # RFC 9113 6.5.2: SETTINGS_HEADER_TABLE_SIZE's initial value

# Index 1..61 (index 0 is never valid): each entry as the dynamic table holds its own, the
# header and its name's and value's lengths in bytes.
_STATIC: tuple[tuple[tuple[str, str], tuple[int, int]], ...] = tuple(
    ((n.decode(), v.decode()), (len(n), len(v))) for n, v in HeaderTable.STATIC_TABLE
)
_STATIC_LEN = len(_STATIC)


def _integer(data: bytes, pos: int, prefix_bits: int) -> tuple[int, int]:
    """The integer whose ``prefix_bits``-bit prefix is in ``data[pos]``, and the position
    after it (RFC 7541 5.1)."""
    mask = (1 << prefix_bits) - 1
    try:
        value = data[pos] & mask
        pos += 1
        if value < mask:
            return value, pos
        shift = 0
        for _ in range(VARINT_MAX_CONTINUATION):
            byte = data[pos]
            pos += 1
            value += (byte & 0x7F) << shift
            if not byte & 0x80:
                return value, pos
            shift += 7
    except IndexError:
        raise HPACKDecodingError("truncated integer") from None
    raise HPACKDecodingError("integer representation too long")


class Decoder:
    """One connection's HPACK decoding context (the peer encoder's dynamic table)."""

    def __init__(self, max_header_list_size: int, max_allowed_table_size: int):
        self.max_header_list_size = max_header_list_size
        self.max_allowed_table_size = max_allowed_table_size
        self.table_size = DEFAULT_TABLE_SIZE  # the peer's current maximum
        self.generation = 0
        # Newest first, as _STATIC's entries: (header, (name bytes, value bytes)).
        self._entries: deque[tuple[tuple[str, str], tuple[int, int]]] = deque()
        self._size = 0  # the table's RFC 7541 size

    def dynamic_entries(self) -> list[tuple[str, str]]:
        """The peer's dynamic table, newest first."""
        return [header for header, _ in self._entries]

    def decode(self, block: bytes) -> list[tuple[str, str]]:
        headers: list[tuple[str, str]] = []
        listed = 0  # the decoded list's RFC 7541 size so far
        pos, end = 0, len(block)
        try:
            while pos < end:
                byte = block[pos]
                if byte & 0x80:  # an indexed field
                    index, pos = _integer(block, pos, 7)
                    header, (name_len, value_len) = self._entry(index)
                elif byte & 0x40:  # a literal, added to the table
                    header, name_len, value_len, pos = self._literal(block, pos, 6)
                    self._add(header, name_len, value_len)
                elif byte & 0x20:  # a dynamic table size update
                    if headers:
                        raise HPACKDecodingError("table size update after a field")
                    new_size, pos = _integer(block, pos, 5)
                    if new_size > self.max_allowed_table_size:
                        raise InvalidTableSizeError("table size above the allowed maximum")
                    self._resize(new_size)
                    continue
                else:  # a literal not indexed (0x00) or never indexed (0x10)
                    header, name_len, value_len, pos = self._literal(block, pos, 4)
                headers.append(header)
                listed += name_len + value_len + ENTRY_OVERHEAD
                if listed > self.max_header_list_size:
                    raise OversizedHeaderListError("header list too large")
        except UnicodeDecodeError:
            raise HPACKDecodingError("a header is not UTF-8") from None
        if self.table_size > self.max_allowed_table_size:
            raise InvalidTableSizeError("the peer did not shrink its table")
        return headers

    def _entry(self, index: int) -> tuple[tuple[str, str], tuple[int, int]]:
        if 0 < index <= _STATIC_LEN:
            return _STATIC[index - 1]
        dynamic = index - _STATIC_LEN - 1
        if not 0 <= dynamic < len(self._entries):
            raise InvalidTableIndex(f"no table entry {index}")
        return self._entries[dynamic]

    def _literal(
        self, block: bytes, pos: int, prefix_bits: int
    ) -> tuple[tuple[str, str], int, int, int]:
        """A literal field at ``pos``: the header, its name's and value's lengths in bytes,
        and the position after it."""
        name_index, pos = _integer(block, pos, prefix_bits)
        if name_index:
            (name, _), (name_len, _) = self._entry(name_index)
        else:
            raw, pos = _string(block, pos)
            name, name_len = raw.decode(), len(raw)
        raw, pos = _string(block, pos)
        return (name, raw.decode()), name_len, len(raw), pos

    def _add(self, header: tuple[str, str], name_len: int, value_len: int) -> None:
        self.generation += 1
        size = name_len + value_len + ENTRY_OVERHEAD
        if size > self.table_size:  # an entry larger than the table empties it (4.4)
            self._entries.clear()
            self._size = 0
            return
        self._entries.appendleft((header, (name_len, value_len)))
        self._size += size
        self._evict()

    def _resize(self, new_size: int) -> None:
        self.generation += 1
        self.table_size = new_size
        self._evict()

    def _evict(self) -> None:
        while self._size > self.table_size:
            _, (name_len, value_len) = self._entries.pop()
            self._size -= name_len + value_len + ENTRY_OVERHEAD


def _string(block: bytes, pos: int) -> tuple[bytes, int]:
    """A string literal at ``pos`` (Huffman-coded or not) and the position after it."""
    if pos >= len(block):
        raise HPACKDecodingError("truncated header block")
    huffman = block[pos] & 0x80
    length, pos = _integer(block, pos, 7)
    raw = block[pos : pos + length]
    if len(raw) != length:
        raise HPACKDecodingError("truncated header block")
    return (decode_huffman(raw) if huffman else bytes(raw)), pos + length
