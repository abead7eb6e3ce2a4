"""The store's history index: key -> history list, with the keys in order, and no step whose
cost grows with the number of keys.

Contract
--------
``KeyIndex`` is the part of ``sortedcontainers.SortedDict`` the store uses (``get``, ``[]``,
``in``, assignment, ``del``, ``len``, iteration and ``irange`` in key order, ``values``,
``update``), with the same answers. Values are never None (the store's values are history
lists), so ``get`` returning None means "absent". Not thread-safe; like the store, it is
read by one thread, or by a forked snapshot child that never writes.

Why not a SortedDict: a dict grows its hash table in one step, rehashing every key. At 1.4
million keys that step took 63 ms in a quiet process and 0.3-0.6 s on a loaded member, all
on the loop that runs raft. Here the hash part is split:

- ``_base``: the dict the index was built from in bulk (a snapshot restore), grown only by
  a bulk ``update`` (a replay's keys merged at its end, which also re-sorts every key). A
  key put one at a time never goes into it, so it never grows under writes; a key deleted
  from it and put again goes to a shard.
- ``_shards``: ``SHARDS`` dicts, a key's shard chosen by its hash, for every other key. One
  shard's growth rehashes about 1/``SHARDS`` of the keys (a dict of a few thousand: well
  under a millisecond).
- ``_keys``: a SortedList of every key (as SortedDict keeps one): order and ranks.

A key is in ``_base`` or in its shard, never both. A restore costs nothing more than before
(the restored dict becomes ``_base`` as it is), and a key found in ``_base`` costs one dict
probe, as before; a key in a shard costs a second probe and a hash of an already hashed
bytes object (cached by CPython).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from itertools import filterfalse
from typing import Any

from sortedcontainers import SortedList

SHARDS = 1024  # a power of two: a key's shard is hash(key) & (SHARDS - 1)
_MASK = SHARDS - 1
_BULK_FRACTION = 10  # an update of at least 1/10 of the index is a bulk update


class KeyIndex:
    """key -> value, keys in order, the hash part split so it never rehashes all keys."""

    __slots__ = ("_base", "_shards", "_sharded", "_keys")

    def __init__(self, base: dict[bytes, Any] | None = None) -> None:
        """An index holding ``base``, which it takes over: the caller may read it, never change
        it."""
        self._base: dict[bytes, Any] = base if base is not None else {}
        self._shards: list[dict[bytes, Any]] = [{} for _ in range(SHARDS)]
        self._sharded = 0  # invariant: == sum(map(len, _shards))
        self._keys = SortedList(self._base)

    # -- lookups ---------------------------------------------------------------------------

    def get(self, key: bytes, default: Any = None) -> Any:
        value = self._base.get(key)
        if value is None and self._sharded:
            value = self._shards[hash(key) & _MASK].get(key)
        return default if value is None else value

    def __getitem__(self, key: bytes) -> Any:
        value = self._base.get(key)
        if value is None:
            return self._shards[hash(key) & _MASK][key]  # KeyError when absent
        return value

    def __contains__(self, key: object) -> bool:
        return key in self._base or (bool(self._sharded) and key in self._shards[hash(key) & _MASK])

    def values_of(self, keys: list[bytes]) -> list[Any]:
        """``[self[k] for k in keys]`` (KeyError for an absent key), with the base's probes
        in a C loop: the loop a range or a snapshot runs over a page of keys."""
        base = self._base
        if not self._sharded:
            return list(map(base.__getitem__, keys))
        shards = self._shards
        if not base:
            return [shards[hash(k) & _MASK][k] for k in keys]
        return [
            shards[hash(k) & _MASK][k] if v is None else v
            for k, v in zip(keys, map(base.get, keys), strict=True)
        ]

    # -- changes ---------------------------------------------------------------------------

    def __setitem__(self, key: bytes, value: Any) -> None:
        base = self._base
        if key in base:
            base[key] = value
            return
        shard = self._shards[hash(key) & _MASK]
        if key not in shard:
            self._keys.add(key)
            self._sharded += 1
        shard[key] = value

    def __delitem__(self, key: bytes) -> None:
        base = self._base
        if key in base:
            del base[key]
        else:
            del self._shards[hash(key) & _MASK][key]  # KeyError when absent
            self._sharded -= 1
        self._keys.remove(key)

    def update(self, other: Mapping[bytes, Any]) -> None:
        """Add or replace every item of ``other``.

        A bulk update (``other`` at least a tenth of the index: a replay's keys merged at its
        end) folds the shards and ``other`` into the base in C loops, and the new keys are
        sorted in with one sort; that is SortedList.update's rule, whose re-sort is O(N)
        anyway. Such an update is the one place where the base grows and rehashes every
        key in one step, as the one sort does. A smaller update inserts key by key, into
        the shards."""
        if len(other) * _BULK_FRACTION >= len(self._keys):
            base = self._base
            for shard in self._shards:
                if shard:
                    base.update(shard)
                    shard.clear()
            self._sharded = 0
            new = list(filterfalse(base.__contains__, other))
            base.update(other)
            self._keys.update(new)
            return
        base = self._base
        shards = self._shards
        new = []
        for key, value in other.items():
            if key in base:
                base[key] = value
                continue
            shard = shards[hash(key) & _MASK]
            if key not in shard:
                new.append(key)
            shard[key] = value
        self._sharded += len(new)
        self._keys.update(new)

    # -- order -----------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._keys)

    def irange(
        self,
        minimum: bytes | None = None,
        maximum: bytes | None = None,
        inclusive: tuple[bool, bool] = (True, True),
        reverse: bool = False,
    ) -> Iterator[bytes]:
        """The keys in [minimum, maximum] (bounds per ``inclusive``), in order."""
        return self._keys.irange(minimum, maximum, inclusive, reverse)

    def values(self) -> Iterator[Any]:
        """Every value, in no particular order."""
        yield from self._base.values()
        for shard in self._shards:
            yield from shard.values()
