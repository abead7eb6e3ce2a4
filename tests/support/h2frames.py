"""Reading what an HTTP/2 server wrote, for tests that speak raw frames."""

from __future__ import annotations

import struct

from kvserver.api.grpc import h2


def frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    out, i = [], 0
    while len(data) - i >= 9:
        length_type, flags, sid = struct.unpack_from(">IBI", data, i)
        n = length_type >> 8
        out.append((length_type & 0xFF, flags, sid, data[i + 9 : i + 9 + n]))
        i += 9 + n
    return out


def goaway_code(data: bytes) -> int | None:
    for kind, _, _, payload in frames(data):
        if kind == h2.GOAWAY:
            return struct.unpack(">I", payload[4:8])[0]
    return None
