"""Shared helpers of the watch tests: a store + hub pair fed like the driver feeds them."""

from __future__ import annotations

from kvserver.kvpb.watch import WatchResponse
from kvserver.mvcc import DeleteRangeRequest, MVCCStore, PutRequest, RequestOp, TxnRequest
from kvserver.watch.hub import WatchHub, WatchLimits, WatchStream


class Env:
    """An MVCC store and a watch hub. ``apply`` applies a request and notifies the hub at once
    (the driver's contract); with ``defer=True`` the notification is held back until
    ``flush`` (a store that applied ahead of the hub)."""

    def __init__(self, limits: WatchLimits | None = None) -> None:
        self.store = MVCCStore()
        self.hub = WatchHub(self.store, limits)
        self.pending: list[tuple[int, tuple]] = []

    def apply(self, request, *, defer: bool = False):
        result = self.store.apply(request)
        assert result.error is None, result.error
        if result.events:
            self.pending.append((result.revision, result.events))
            if not defer:
                self.flush()
        return result

    def flush(self) -> None:
        for rev, events in self.pending:
            self.hub.notify(rev, events)
        self.pending.clear()

    def put(self, key: bytes, value: bytes = b"v", **kw):
        return self.apply(PutRequest(key, value), **kw)

    def delete(self, key: bytes, range_end: bytes = b"", **kw):
        return self.apply(DeleteRangeRequest(key, range_end), **kw)

    def txn_put(self, keys, value: bytes = b"t", **kw):
        ops = tuple(RequestOp.of(PutRequest(k, value)) for k in keys)
        return self.apply(TxnRequest(success=ops), **kw)


class CountingSource:
    """The store as a hub's source, noting each history read: its keyword arguments and how
    many events it returned."""

    def __init__(self, store: MVCCStore) -> None:
        self.store = store
        self.reads: list[dict] = []
        self.events_per_read: list[int] = []

    @property
    def revision(self) -> int:
        return self.store.revision

    @property
    def compact_revision(self) -> int:
        return self.store.compact_revision

    def replay_part(self, *args, **kwargs):
        events, next_rev, next_skip = self.store.replay_part(*args, **kwargs)
        self.reads.append(kwargs)
        self.events_per_read.append(len(events))
        return events, next_rev, next_skip


def drain(source: WatchStream, max_polls: int = 100_000) -> list[WatchResponse]:
    """Everything the stream (or one-watcher stream) can deliver now, replay included."""
    out = []
    for _ in range(max_polls):
        resp = source.poll()
        if resp is None:
            stream = source if isinstance(source, WatchStream) else source._stream
            if not stream._fill_pending():
                return out
            continue
        out.append(resp)
    raise AssertionError("stream did not settle")


def events_of(responses) -> list[tuple[int, bytes, int]]:
    """(type, key, mod_revision) of every event, in delivery order."""
    return [(int(e.type), e.kv.key, e.kv.mod_revision) for r in responses for e in r.events]
