"""CRC-32C (Castagnoli), chainable like Go's crc32.Update.

``crc32c(data, prev)`` continues a running checksum: crc32c(b, crc32c(a)) == crc32c(a + b).
Uses crcmod's C extension; importing this module fails loudly if only the slow pure-Python
fallback is available, because the WAL computes a CRC for every record it writes or reads.
"""

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
