"""Key-range permissions: etcd's ``authpb.Permission`` and the range check of
``server/auth/range_perm_cache.go``.

A permission is ``(perm_type, key, range_end)``: ``range_end`` empty means the single key
``key``; ``range_end == b"\\0"`` means every key ``>= key`` (open-ended, etcd's convention);
otherwise the half-open interval ``[key, range_end)``. A single key ``k`` is the interval
``[k, k + b"\\0")`` (the only key in it is ``k``), so a point permission also covers a range
request for exactly that key.

``covers(intervals, key, range_end)`` is etcd's ``Contains``: a request for ``[key,
range_end)`` is allowed when the UNION of the user's intervals of that type covers it whole
(two adjacent permissions ``[a, m)`` and ``[m, z)`` together allow ``[a, z)``). A request
whose ``range_end`` is not empty and not after ``key`` selects no key; it is checked as the
single key ``key`` (conservative: never allows more than a point request would).

``UserPerms`` is a user's merged read and write intervals (READWRITE counts as both), built
once per user per auth revision by the caller's cache.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum


class PermType(IntEnum):
    """authpb.Permission_Type; the gateway spells them READ, WRITE, READWRITE."""

    READ = 0
    WRITE = 1
    READWRITE = 2


@dataclass(frozen=True, slots=True)
class Permission:
    perm_type: PermType
    key: bytes
    range_end: bytes = b""


# An interval [lo, hi); hi None = no upper bound.
Interval = tuple[bytes, "bytes | None"]


def interval(key: bytes, range_end: bytes) -> Interval:
    """The keys a (key, range_end) pair names, as etcd reads it (module docstring)."""
    if range_end == b"\0":
        return key, None
    if not range_end or range_end <= key:
        return key, key + b"\0"
    return key, range_end


def merge(intervals: Iterable[Interval]) -> tuple[Interval, ...]:
    """Sorted, disjoint, non-adjacent intervals with the same union."""
    out: list[list] = []
    for lo, hi in sorted(intervals, key=lambda iv: iv[0]):
        if out:
            last = out[-1]
            if last[1] is None or lo <= last[1]:  # overlapping or adjacent
                if last[1] is not None and (hi is None or hi > last[1]):
                    last[1] = hi
                continue
        out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


def covers(merged: tuple[Interval, ...], key: bytes, range_end: bytes) -> bool:
    """Whether merged intervals (``merge``'s output) cover the request's keys whole."""
    lo, hi = interval(key, range_end)
    for mlo, mhi in merged:  # merged and non-adjacent: one interval must hold it all
        if mlo <= lo and (mhi is None or (hi is not None and hi <= mhi)):
            return True
    return False


@dataclass(frozen=True, slots=True)
class UserPerms:
    read: tuple[Interval, ...]
    write: tuple[Interval, ...]

    @classmethod
    def of(cls, perms: Iterable[Permission]) -> UserPerms:
        read: list[Interval] = []
        write: list[Interval] = []
        for p in perms:
            iv = interval(p.key, p.range_end)
            if p.perm_type in (PermType.READ, PermType.READWRITE):
                read.append(iv)
            if p.perm_type in (PermType.WRITE, PermType.READWRITE):
                write.append(iv)
        return cls(merge(read), merge(write))

    def can_read(self, key: bytes, range_end: bytes = b"") -> bool:
        return covers(self.read, key, range_end)

    def can_write(self, key: bytes, range_end: bytes = b"") -> bool:
        return covers(self.write, key, range_end)
