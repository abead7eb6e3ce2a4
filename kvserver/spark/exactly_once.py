"""``exactly_once``: a ``foreachBatch`` wrapper that runs each micro-batch id's function once.

::

    from kvserver.spark.exactly_once import exactly_once

    sink = exactly_once(write_batch, "orders-to-warehouse", ["http://127.0.0.1:2379"])
    query = df.writeStream.foreachBatch(sink).option("checkpointLocation", ckpt).start()

For each call ``sink(df, batch_id)``:

1. if the marker ``<prefix><name>/<batch_id, 20 digits>`` exists in raftkv, the batch was
   finished before: the call returns without running the function (``skipped`` records it);
2. otherwise it runs ``foreach_batch_fn(df, batch_id)``;
3. when the function returned, it writes the marker in a txn that creates it only if absent
   (and, with ``fence=``, only while the lock is held: ``FencedOutError`` otherwise).

Why a replay happens. Spark records a micro-batch as done in its checkpoint (``commits/``)
*after* ``foreachBatch`` returns. A driver that dies between the two — or a query restarted
from a checkpoint whose last commit file was lost — runs the same batch id again, with the
same data when the source is replayable. Step 1 makes that replay a no-op once the marker
is written.

What must still be idempotent in ``foreach_batch_fn`` — the window. The marker is written
after the function's side effects, not atomically with them (they are in other systems).
If the driver dies (or the marker write fails) **after** the function made any side effect
and **before** the marker is committed, the batch runs again in full on the replay. So the
function must tolerate being run again for the same ``batch_id`` after a partial or
complete earlier run: e.g. overwrite an output keyed by ``batch_id`` (a directory per batch,
replaced by a rename), or make its own writes put-if-absent by ``batch_id``. What it does
*not* need to tolerate: a second run after its marker is committed (skipped), or two runs
of the same batch id at the same time through wrappers guarded by the same ``fence`` (the
second one's marker write is refused). Without a fence, two concurrent queries with the same
``name`` can both run a batch; the second marker write then finds the marker present and
the call logs it and returns (it is counted in ``duplicates``).

Failures. An exception from the function propagates (no marker: Spark fails the query and a
restart replays the batch). A failure to read or write the marker propagates too (a
``ClientError``): the batch may then run again on replay, within the window above.

The wrapper pickles without its client (it reconnects to the same endpoints), so it also
works where Spark ships the function to another Python process.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from kvserver.client import Client, Cmp, Op, Txn
from kvserver.client.txn import as_bytes
from kvserver.spark.commitlog import fenced_out_detail, resolve_fence
from kvserver.spark.fencing import FencedOutError
from kvserver.spark.txn_reads import range_kvs

log = logging.getLogger("raftkv.spark.exactly_once")

DEFAULT_PREFIX = "__raftkv/batches/"
BATCH_DIGITS = 20

__all__ = ["DEFAULT_PREFIX", "ExactlyOnceBatch", "exactly_once"]


class ExactlyOnceBatch:
    """The wrapper ``exactly_once`` returns (see the module docstring)."""

    def __init__(
        self,
        fn: Callable[[Any, int], Any],
        name: str,
        client_or_endpoints: Client | str | Sequence[str],
        *,
        prefix: str = DEFAULT_PREFIX,
        fence=None,
    ) -> None:
        if not callable(fn):
            raise TypeError("foreach_batch_fn must be callable as fn(df, batch_id)")
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError(f"a name is a non-empty string without '/', got {name!r}")
        self.fn = fn
        self.name = name
        self.prefix = as_bytes(prefix) + name.encode() + b"/"
        self.fence = fence
        if isinstance(client_or_endpoints, Client):
            self._client: Client | None = client_or_endpoints
            self._owns_client = False
            self.endpoints = tuple(client_or_endpoints.endpoints)
        else:
            self._client = None
            self._owns_client = True
            self.endpoints = (
                tuple(client_or_endpoints.split(","))
                if isinstance(client_or_endpoints, str)
                else tuple(client_or_endpoints)
            )
        self.ran: list[int] = []  # batch ids whose function ran in this process
        self.skipped: list[int] = []  # batch ids skipped as already finished
        self.duplicates: list[int] = []  # ran, but another run had written the marker first
        self._lock = threading.Lock()

    # Pickled without the client and the counters' lock (Spark may ship the wrapper).
    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_client"] = None
        state["_owns_client"] = True
        del state["_lock"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    @property
    def client(self) -> Client:
        with self._lock:
            if self._client is None:
                self._client = Client(list(self.endpoints))
            return self._client

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None and self._owns_client:
            client.close()

    def marker_key(self, batch_id: int) -> bytes:
        if isinstance(batch_id, bool) or not isinstance(batch_id, int) or batch_id < 0:
            raise ValueError(f"a batch id is an integer >= 0, got {batch_id!r}")
        return self.prefix + f"{batch_id:0{BATCH_DIGITS}d}".encode()

    def is_done(self, batch_id: int) -> bool:
        return self.client.get(self.marker_key(batch_id)) is not None

    def done_batches(self) -> list[int]:
        """Every batch id with a marker, ascending."""
        rr = self.client.range(self.prefix, prefix=True, keys_only=True)
        return sorted(int(kv.key[len(self.prefix) :]) for kv in rr.kvs)

    def forget_below(self, batch_id: int) -> int:
        """Delete the markers of batch ids below ``batch_id`` (Spark replays only batches
        after its last committed one, so markers far behind it are no longer needed);
        returns how many were deleted."""
        return self.client.delete(self.prefix, self.marker_key(batch_id)).deleted

    def __call__(self, df: Any, batch_id: int) -> None:
        key = self.marker_key(int(batch_id))
        fence = resolve_fence(self.fence)  # a lock that knows it lost stops us here
        if self.client.get(key) is not None:
            log.info("%s: batch %d was finished before; skipped", self.name, batch_id)
            self.skipped.append(int(batch_id))
            return
        self.fn(df, batch_id)
        self.ran.append(int(batch_id))
        marker = json.dumps({"batch_id": int(batch_id), "finished_at": time.time()}).encode()
        compares = [Cmp.version(key) == 0]
        checks = [Op.get(key, keys_only=True)]
        if fence is not None:
            compares.append(fence.compare())
            checks.append(Op.get(fence.key, keys_only=True))
        result = self.client.txn(Txn().when(*compares).then(Op.put(key, marker)).otherwise(*checks))
        if result.succeeded:
            return
        if fence is not None:
            detail = fenced_out_detail(fence, range_kvs(result, -1))
            if detail is not None:
                raise FencedOutError(
                    fence.key,
                    fence.token,
                    f"{self.name}: marker of batch {batch_id} refused "
                    f"(the batch's side effects may stand): {detail}",
                )
        log.warning("%s: batch %d was finished concurrently by another run", self.name, batch_id)
        self.duplicates.append(int(batch_id))


def exactly_once(
    foreach_batch_fn: Callable[[Any, int], Any],
    name: str,
    client_or_endpoints: Client | str | Sequence[str],
    *,
    prefix: str = DEFAULT_PREFIX,
    fence=None,
) -> ExactlyOnceBatch:
    """Wrap ``foreach_batch_fn(df, batch_id)`` so each batch id of query ``name`` is run
    once (see the module docstring for exactly what must stay idempotent)."""
    return ExactlyOnceBatch(foreach_batch_fn, name, client_or_endpoints, prefix=prefix, fence=fence)
