"""The WAL's CRC-32C function: crcmod (the reference, always there) or a hardware one.

``crc32c_update(data, prev)`` continues a running CRC-32C exactly like ``raftpb.crc32c``
(Go's ``crc32.Update`` with the Castagnoli table). It is called once or twice per record,
so on the replay path it is a quarter of the time with crcmod's byte-at-a-time table. When
the optional ``crc32c`` package (SSE4.2 / ARMv8 CRC instructions) is installed it is used
instead, after checking at import that it agrees with crcmod on known values and on
chaining; otherwise, or with ``RAFTKV_WAL_CRC=crcmod`` in the environment, crcmod is used.
Both compute the same function; tests check them against each other.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from raftpb.crc import _crc32c as _crcmod

# (data, running CRC) -> the CRC continued over data
CrcFunction = Callable[[bytes | bytearray | memoryview, int], int]


def _pick() -> tuple[CrcFunction, str]:
    if os.environ.get("RAFTKV_WAL_CRC", "") == "crcmod":
        return _crcmod, "crcmod"
    try:
        from crc32c import crc32c as fast  # optional accelerator
    except ImportError:
        return _crcmod, "crcmod"
    try:
        probes: list[tuple[bytes | memoryview, int]] = [
            (b"somedata", 0),
            (b"", 0x12345678),
            (bytes(range(256)) * 3, 0xDEADBEEF),
            (memoryview(b"abcdefgh")[2:5], 7),
        ]
        if all(fast(d, p) == _crcmod(d, p) for d, p in probes) and fast(b"somedata") == 0x741F6A05:
            return fast, "crc32c"
    except Exception:  # noqa: BLE001 - any surprise: stay on the reference implementation
        pass
    return _crcmod, "crcmod"


crc32c_update, IMPLEMENTATION = _pick()
