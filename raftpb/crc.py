"""CRC-32C (Castagnoli), chainable like Go's crc32.Update.

``crc32c(data, prev)`` continues a running checksum: crc32c(b, crc32c(a)) == crc32c(a + b).
Uses crcmod's C extension (the reference); importing this module fails loudly if only the
slow pure-Python fallback is available, because the WAL computes a CRC for every record it
writes or reads.

``crc32c_fast`` is the same function, computed by the optional ``crc32c`` package (SSE4.2 /
ARMv8 CRC instructions, several times faster than crcmod's table) when it is installed and
agrees with crcmod on known values and on chaining at import; otherwise, or with
``RAFTKV_WAL_CRC=crcmod`` in the environment, it is crcmod. ``FAST_IMPLEMENTATION`` names
the one in use. The WAL's records and the snapshot files use it.
"""

import os
import sys
from collections.abc import Callable

import crcmod.predefined

if not getattr(
    sys.modules["crcmod.crcmod"], "_usingExtension", False
):  # pragma: no cover - install problem
    raise ImportError("crcmod was installed without its C extension; reinstall with a compiler")

# crcmod is untyped: its CRC functions take (data, running value) and return the new value.
_crc32c: Callable[[bytes | bytearray | memoryview, int], int] = (
    crcmod.predefined.mkPredefinedCrcFun("crc-32c")
)


def crc32c(data: bytes | bytearray | memoryview, prev: int = 0) -> int:
    """Return the CRC-32C of ``data``, continuing from the running value ``prev``."""
    return _crc32c(data, prev)


def _pick() -> tuple[Callable[[bytes | bytearray | memoryview, int], int], str]:
    if os.environ.get("RAFTKV_WAL_CRC", "") == "crcmod":
        return _crc32c, "crcmod"
    try:
        from crc32c import crc32c as fast  # optional accelerator
    except ImportError:
        return _crc32c, "crcmod"
    try:
        probes: list[tuple[bytes | memoryview, int]] = [
            (b"somedata", 0),
            (b"", 0x12345678),
            (bytes(range(256)) * 3, 0xDEADBEEF),
            (memoryview(b"abcdefgh")[2:5], 7),
        ]
        if all(fast(d, p) == _crc32c(d, p) for d, p in probes) and fast(b"somedata") == 0x741F6A05:
            return fast, "crc32c"
    except Exception:  # noqa: BLE001 - any surprise: stay on the reference implementation
        pass
    return _crc32c, "crcmod"


crc32c_fast, FAST_IMPLEMENTATION = _pick()
