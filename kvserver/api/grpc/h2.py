"""HTTP/2 as the gRPC server needs it: frame layout, settings, and the header codec (the
connection's state machine that uses them is ``kvserver.api.grpc.h2_machine``).

Only what a server of gRPC calls uses (RFC 9113, RFC 7541):

- ``FRAME`` packs and unpacks the 9-byte frame header; ``frame(type, flags, sid, payload)``
  builds one frame.
- ``HeaderDecoder`` decodes header blocks (``kvserver.api.grpc.hpack_decoder``; the peer's
  dynamic table is state the connection must keep in step). A block made only of references
  to entries already in the table decodes to the same headers every time, and gRPC clients
  without deadlines send exactly such blocks once their first call has filled the table, so
  those answers are cached (up to a byte budget) until a block changes the table. A block
  that opens with more table size updates than RFC 7541 allows is refused from its bytes,
  before any decoding.
- ``encode_headers`` writes header blocks as literals that are never indexed: our answers
  never touch the peer's decoder table, so a block can be built once and sent on any
  connection (the answers' headers and the trailers of each status are constants).
"""

from __future__ import annotations

import struct
from typing import ClassVar, Final

from hpack.exceptions import HPACKError, OversizedHeaderListError

from kvserver.api.grpc.hpack_decoder import Decoder

# Frame types
DATA: Final = 0x0
HEADERS: Final = 0x1
PRIORITY: Final = 0x2
RST_STREAM: Final = 0x3
SETTINGS: Final = 0x4
PUSH_PROMISE: Final = 0x5
PING: Final = 0x6
GOAWAY: Final = 0x7
WINDOW_UPDATE: Final = 0x8
CONTINUATION: Final = 0x9

# Flags
END_STREAM: Final = 0x1
ACK: Final = 0x1
END_HEADERS: Final = 0x4
PADDED: Final = 0x8
PRIORITY_FLAG: Final = 0x20

# Settings
SETTINGS_HEADER_TABLE_SIZE: Final = 0x1
SETTINGS_ENABLE_PUSH: Final = 0x2
SETTINGS_MAX_CONCURRENT_STREAMS: Final = 0x3
SETTINGS_INITIAL_WINDOW_SIZE: Final = 0x4
SETTINGS_MAX_FRAME_SIZE: Final = 0x5
SETTINGS_MAX_HEADER_LIST_SIZE: Final = 0x6

# Error codes
NO_ERROR: Final = 0x0
PROTOCOL_ERROR: Final = 0x1
INTERNAL_ERROR: Final = 0x2
FLOW_CONTROL_ERROR: Final = 0x3
STREAM_CLOSED: Final = 0x5
FRAME_SIZE_ERROR: Final = 0x6
REFUSED_STREAM: Final = 0x7
CANCEL: Final = 0x8
COMPRESSION_ERROR: Final = 0x9
ENHANCE_YOUR_CALM: Final = 0xB

PREFACE: Final = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DEFAULT_WINDOW: Final = 65_535
DEFAULT_MAX_FRAME: Final = 16_384
MAX_WINDOW: Final = 2**31 - 1
MAX_FRAME_LIMIT: Final = 2**24 - 1

FRAME = struct.Struct(">IBI")  # (length << 8 | type), flags, stream id (top bit reserved)
SETTING = struct.Struct(">HI")
U32 = struct.Struct(">I")


class ConnectionError_(Exception):
    """The peer broke the protocol or a budget: the connection ends with GOAWAY and this
    code (``budget``: which of ``kvserver.api.grpc.budgets.BUDGETS`` it met, if any)."""

    # A subclass that always stands for one budget names it here.
    BUDGET: ClassVar[str | None] = None

    def __init__(self, code: int, message: str, budget: str | None = None):
        super().__init__(message)
        self.code = code
        self.budget = budget if budget is not None else self.BUDGET


def frame(kind: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    return FRAME.pack((len(payload) << 8) | kind, flags, sid) + payload


def settings_frame(settings: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join([SETTING.pack(k, v) for k, v in settings.items()]))


def window_update(sid: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, sid, U32.pack(increment))


def rst_stream(sid: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, sid, U32.pack(code))


def goaway(last_sid: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, U32.pack(last_sid) + U32.pack(code) + debug)


# --- header blocks ---------------------------------------------------------------------------


def _integer(value: int, prefix_bits: int, first: int) -> bytes:
    """RFC 7541 5.1: ``value`` with an N-bit prefix; ``first`` holds the flag bits."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string(data: bytes) -> bytes:
    return _integer(len(data), 7, 0) + data  # no Huffman coding


# HPACK's static table entries an answer uses (RFC 7541 appendix A)
_STATUS_200_INDEX = 8
_STATIC_NAME_INDEX = {"content-type": 31}


def encode_headers(headers: list[tuple[str, str]]) -> bytes:
    """A header block of literals never added to the peer's table (``:status: 200`` is the
    static table's entry)."""
    out = []
    for name, value in headers:
        if name == ":status" and value == "200":
            out.append(_integer(_STATUS_200_INDEX, 7, 0x80))
            continue
        index = _STATIC_NAME_INDEX.get(name)
        if index is not None:  # literal without indexing, indexed name
            out.append(_integer(index, 4, 0x00) + _string(value.encode()))
        else:  # literal without indexing, new name
            out.append(b"\x00" + _string(name.encode()) + _string(value.encode()))
    return b"".join(out)


MAX_TABLE_SIZE_UPDATES: Final = 2  # at the start of a block (RFC 7541 4.2)


class HeaderListTooLarge(ConnectionError_):
    """A block that decodes to more than the header-list budget."""

    BUDGET = "header_list"


class TooManyTableUpdates(ConnectionError_):
    """A block that starts with more dynamic-table size updates than RFC 7541 allows."""

    BUDGET = "table_updates"


def leading_table_updates(block: bytes | bytearray, stop_after: int) -> int:
    """How many dynamic-table size updates start ``block`` (counting stops past
    ``stop_after``): the count is read from the bytes alone, so a block of nothing but
    updates costs a scan, not a decode."""
    count = pos = 0
    end = len(block)
    while pos < end and block[pos] & 0xE0 == 0x20 and count <= stop_after:
        count += 1
        if block[pos] & 0x1F == 0x1F:  # a multi-byte integer: skip its continuation bytes
            pos += 1
            while pos < end and block[pos] & 0x80:
                pos += 1
        pos += 1
    return count


class HeaderDecoder:
    """The peer's header blocks, decoded in the order they arrive (see the module doc).

    Bounds: the decoded list (``max_header_list_size``, RFC 7541's accounting), the dynamic
    table the peer may ask for (``table_size``), the leading size updates of a block (two),
    and the answers cached for blocks of table references (``cache_bytes``, counted as the
    blocks' bytes plus the decoded headers' RFC 7541 size)."""

    def __init__(
        self, max_header_list_size: int, *, table_size: int = 4096, cache_bytes: int = 64 * 1024
    ):
        self._decoder = Decoder(max_header_list_size, table_size)
        self._cache: dict[bytes, list[tuple[str, str]]] = {}
        self._cache_bytes = 0
        self.cache_limit = cache_bytes

    @property
    def cached_bytes(self) -> int:
        return self._cache_bytes

    def decode(self, block: bytes) -> list[tuple[str, str]]:
        cached = self._cache.get(block)
        if cached is not None:
            return cached
        if leading_table_updates(block, MAX_TABLE_SIZE_UPDATES) > MAX_TABLE_SIZE_UPDATES:
            raise TooManyTableUpdates(COMPRESSION_ERROR, "too many table size updates")
        generation = self._decoder.generation
        try:
            headers = self._decoder.decode(block)
        except OversizedHeaderListError:
            raise HeaderListTooLarge(COMPRESSION_ERROR, "header list too large") from None
        except HPACKError as exc:
            raise ConnectionError_(COMPRESSION_ERROR, f"bad header block: {exc}") from None
        if self._decoder.generation == generation:
            cost = len(block) + sum(len(n) + len(v) + 32 for n, v in headers)
            if cost <= self.cache_limit:
                if self._cache_bytes + cost > self.cache_limit:
                    self._cache.clear()
                    self._cache_bytes = 0
                self._cache[block] = headers  # only table references: the same answer next time
                self._cache_bytes += cost
        elif self._cache:
            self._cache.clear()  # the table changed: references may now mean other headers
            self._cache_bytes = 0
        return headers
