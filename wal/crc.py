"""The WAL's CRC-32C function: ``raftpb.crc.crc32c_fast`` under the WAL's names.

``crc32c_update(data, prev)`` continues a running CRC-32C exactly like ``raftpb.crc32c``
(Go's ``crc32.Update`` with the Castagnoli table). It is called once or twice per record,
so on the replay path it is a quarter of the time with crcmod's byte-at-a-time table: the
hardware ``crc32c`` package is used when it is installed and agrees with crcmod
(``raftpb.crc`` checks at import; ``RAFTKV_WAL_CRC=crcmod`` forces the reference).
``IMPLEMENTATION`` names the one in use. Both compute the same function; tests check them
against each other.
"""

from __future__ import annotations

from collections.abc import Callable

from raftpb.crc import FAST_IMPLEMENTATION, crc32c_fast

# (data, running CRC) -> the CRC continued over data
CrcFunction = Callable[[bytes | bytearray | memoryview, int], int]

crc32c_update: CrcFunction = crc32c_fast
IMPLEMENTATION = FAST_IMPLEMENTATION
