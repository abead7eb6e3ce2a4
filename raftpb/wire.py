"""Proto2 wire-format primitives: varints, tags and a field reader.

Only what etcd's messages use: wire type 0 (varint) and 2 (length-delimited); types 1 and 5
(fixed64/fixed32) are skipped when met as unknown fields. Varints are unsigned 64-bit;
a varint longer than 10 bytes or overflowing 64 bits is a DecodeError.
"""

from collections.abc import Iterator
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from mmap import mmap

# What the decoders read: any of these indexes to an int and slices to bytes-like.
Buf: TypeAlias = "bytes | bytearray | memoryview | mmap"

VARINT = 0
FIXED64 = 1
BYTES = 2
FIXED32 = 5

_MAX_U64 = (1 << 64) - 1


class DecodeError(ValueError):
    """The bytes are not a valid encoding of the expected message."""


def encode_varint(value: int) -> bytes:
    if value < 0x80:
        if value < 0:
            raise ValueError(f"varint must be unsigned, got {value}")
        return bytes((value,))
    if value > _MAX_U64:
        raise ValueError(f"varint overflows 64 bits: {value}")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def decode_varint(buf: Buf, pos: int) -> tuple[int, int]:
    """Return (value, new_pos) for the varint starting at ``buf[pos]``."""
    try:
        b = buf[pos]
        if b < 0x80:
            return b, pos + 1
        result = b & 0x7F
        shift = 7
        pos += 1
        while True:
            b = buf[pos]
            result |= (b & 0x7F) << shift
            pos += 1
            if b < 0x80:
                break
            shift += 7
            if shift >= 70:
                raise DecodeError("varint longer than 10 bytes")
    except IndexError:
        raise DecodeError("truncated varint") from None
    if result > _MAX_U64:
        raise DecodeError("varint overflows 64 bits")
    return result, pos


def tag(field: int, wire_type: int) -> bytes:
    return encode_varint((field << 3) | wire_type)


def uint_field(field: int, value: int) -> bytes:
    return tag(field, VARINT) + encode_varint(value)


def bytes_field(field: int, value: bytes) -> bytes:
    return tag(field, BYTES) + encode_varint(len(value)) + bytes(value)


def iter_fields(buf: Buf) -> Iterator[tuple[int, int, int | bytes]]:
    """Yield (field_number, wire_type, value) for each field of a message.

    ``value`` is an int for varints and fixed-width fields and a bytes slice for
    length-delimited fields.
    """
    pos = 0
    end = len(buf)
    value: int | bytes
    while pos < end:
        key, pos = decode_varint(buf, pos)
        field, wire_type = key >> 3, key & 7
        if field == 0:
            raise DecodeError("field number 0 is invalid")
        if wire_type == VARINT:
            value, pos = decode_varint(buf, pos)
        elif wire_type == BYTES:
            length, pos = decode_varint(buf, pos)
            if pos + length > end:
                raise DecodeError(f"field {field}: length {length} runs past end of message")
            value = bytes(buf[pos : pos + length])
            pos += length
        elif wire_type == FIXED64:
            if pos + 8 > end:
                raise DecodeError(f"field {field}: truncated fixed64")
            value = int.from_bytes(buf[pos : pos + 8], "little")
            pos += 8
        elif wire_type == FIXED32:
            if pos + 4 > end:
                raise DecodeError(f"field {field}: truncated fixed32")
            value = int.from_bytes(buf[pos : pos + 4], "little")
            pos += 4
        else:
            raise DecodeError(f"field {field}: unsupported wire type {wire_type}")
        yield field, wire_type, value


def uint_value(field: int, wire_type: int, value: int | bytes) -> int:
    """``value`` of a field from ``iter_fields`` that must be a varint; DecodeError if not."""
    if wire_type != VARINT or not isinstance(value, int):  # an int whenever it is a varint
        raise DecodeError(f"field {field}: wire type {wire_type}, expected {VARINT}")
    return value


def bytes_value(field: int, wire_type: int, value: int | bytes) -> bytes:
    """``value`` of a field from ``iter_fields`` that must be length-delimited; DecodeError
    if not."""
    if wire_type != BYTES or not isinstance(value, bytes):  # bytes whenever it is delimited
        raise DecodeError(f"field {field}: wire type {wire_type}, expected {BYTES}")
    return value
