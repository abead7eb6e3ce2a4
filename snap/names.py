"""Snapshot file names.

    {term:016x}-{index:016x}.snap          a snapshot (lower-case hex, zero-padded, as etcd)
    {term:016x}-{index:016x}.snap.tmp      being written; never read, removed on open
    {term:016x}-{index:016x}.snap.broken   quarantined by the loader; never read or purged

Because both numbers are fixed-width hex, sorting names as strings sorts by (term, index),
which is etcd's "newest" order. Any other file in the directory (etcd keeps its ``db`` there,
for example) is ignored; so is a ``.snap`` file whose name does not parse.
"""

import re
from dataclasses import dataclass

SNAP_SUFFIX = ".snap"
TMP_SUFFIX = ".snap.tmp"
BROKEN_SUFFIX = ".snap.broken"

_MAX_U64 = (1 << 64) - 1
_SNAP_RE = re.compile(r"^([0-9a-f]{16})-([0-9a-f]{16})\.snap$")
_TMP_RE = re.compile(r"^[0-9a-f]{16}-[0-9a-f]{16}\.snap\.tmp$")


@dataclass(frozen=True, slots=True, order=True)
class SnapName:
    """A parsed snapshot file name; ordering is newest-last."""

    term: int  # invariant: 0 <= term <= 2**64 - 1
    index: int  # invariant: 0 <= index <= 2**64 - 1

    def __post_init__(self) -> None:
        if not (0 <= self.term <= _MAX_U64 and 0 <= self.index <= _MAX_U64):
            raise ValueError(f"term/index must be uint64: term={self.term} index={self.index}")

    @property
    def file_name(self) -> str:
        return f"{self.term:016x}-{self.index:016x}{SNAP_SUFFIX}"

    @property
    def tmp_name(self) -> str:
        return self.file_name + ".tmp"

    @property
    def broken_name(self) -> str:
        return self.file_name + ".broken"


def parse_snap_name(name: str) -> SnapName | None:
    """Return the (term, index) of a well-formed ``.snap`` file name, else None."""
    m = _SNAP_RE.match(name)
    if m is None:
        return None
    return SnapName(term=int(m.group(1), 16), index=int(m.group(2), 16))


def is_tmp_name(name: str) -> bool:
    """True for a leftover of an interrupted save (ours only: other ``.tmp`` files are kept)."""
    return _TMP_RE.match(name) is not None
