"""Request-id deduplication table: a retried write is applied once.

Contract: a write may carry ``(client_id, request_id)`` (``client_id != 0``). The table
remembers the outcome (response or error) of the last ``ids_per_client`` request ids of each
of the ``max_clients`` most recently active clients. ``lookup`` returns the remembered outcome
of a pair or ``MISS``; ``remember`` records one. Both are deterministic functions of the
sequence of calls, so every replica that applies the same log holds the same table, and the
table travels in snapshots (``export`` / ``from_export`` keep the order, which decides what is
evicted next).

Bounds: at most ``max_clients * ids_per_client`` outcomes. A retry that arrives after its id
was evicted (more than ``ids_per_client`` newer requests of the same client, or the client idle
while ``max_clients`` others wrote) is applied again; the bounds are the retry window.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

DEFAULT_IDS_PER_CLIENT = 64
DEFAULT_MAX_CLIENTS = 4096

MISS: Any = object()  # sentinel: the pair was not seen (outcomes are never None)


class DedupTable:
    __slots__ = ("ids_per_client", "max_clients", "_clients")

    def __init__(
        self, ids_per_client: int = DEFAULT_IDS_PER_CLIENT, max_clients: int = DEFAULT_MAX_CLIENTS
    ) -> None:
        if ids_per_client < 1 or max_clients < 1:
            raise ValueError("dedup bounds must be positive")
        self.ids_per_client = ids_per_client
        self.max_clients = max_clients
        # client_id -> (request_id -> outcome), both in least-recently-used-first order.
        self._clients: OrderedDict[int, OrderedDict[int, Any]] = OrderedDict()

    def lookup(self, client_id: int, request_id: int) -> Any:
        ids = self._clients.get(client_id)
        if ids is None:
            return MISS
        return ids.get(request_id, MISS)

    def client_ids(self, client_id: int) -> OrderedDict[int, Any]:
        """The request-id table of ``client_id``, created if new, marked most recently used
        (evicting the least recently used client beyond ``max_clients``). The store's hot
        path uses it to look up and then record with one table access."""
        clients = self._clients
        ids = clients.get(client_id)
        if ids is None:
            ids = OrderedDict()
            clients[client_id] = ids
            if len(clients) > self.max_clients:
                clients.popitem(last=False)
        else:
            clients.move_to_end(client_id)
        return ids

    def remember(self, client_id: int, request_id: int, outcome: Any) -> None:
        ids = self.client_ids(client_id)
        ids[request_id] = outcome
        if len(ids) > self.ids_per_client:
            ids.popitem(last=False)

    def __len__(self) -> int:
        return sum(len(ids) for ids in self._clients.values())

    @property
    def client_count(self) -> int:
        return len(self._clients)

    def export(self) -> list[tuple[int, list[tuple[int, Any]]]]:
        """A point-in-time copy: [(client_id, [(request_id, outcome), ...]), ...] in LRU order."""
        return [(cid, list(ids.items())) for cid, ids in self._clients.items()]

    @classmethod
    def from_export(
        cls,
        exported: list[tuple[int, list[tuple[int, Any]]]],
        ids_per_client: int = DEFAULT_IDS_PER_CLIENT,
        max_clients: int = DEFAULT_MAX_CLIENTS,
    ) -> DedupTable:
        table = cls(ids_per_client, max_clients)
        # Keep the newest entries if the bounds shrank since the snapshot was taken.
        for cid, items in exported[-max_clients:]:
            table._clients[cid] = OrderedDict(items[-ids_per_client:])
        return table
