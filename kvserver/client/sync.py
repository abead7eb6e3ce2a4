"""The blocking client: ``AsyncClient`` driven by a private event loop on a background thread.

Design. A ``Client`` owns one daemon thread running one asyncio event loop, started on the
first call, and one ``AsyncClient`` living on that loop. Each blocking method submits the
matching coroutine with ``asyncio.run_coroutine_threadsafe`` and waits for its result. So:

- all the async client's behaviour (leader discovery, failover, retries with the same request
  id, deadlines, one persistent connection pool) is shared, not re-implemented;
- a ``Client`` may be used from any thread, and from several threads at once (their calls run
  concurrently on the loop and share the connection pool) — e.g. from Spark driver threads;
- it also works where an event loop is already running in the calling thread (Jupyter, an
  async framework), where ``asyncio.run`` / ``loop.run_until_complete`` would fail.

The wait in the calling thread is bounded too (the async deadline plus a margin); if it is
interrupted (``KeyboardInterrupt``) the in-flight call is cancelled. ``close()`` (or leaving a
``with`` block) closes the connections and stops the thread; a client that is garbage-collected
unclosed is cleaned up by a finalizer. Calling a ``Client`` method from the client's own loop
thread raises ``RuntimeError`` (it would deadlock).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import weakref
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from kvserver.client.aio import DEFAULT_ENDPOINT, AsyncClient
from kvserver.client.alarms import AlarmResult
from kvserver.client.columnar import ArrowRange, KeyRanks
from kvserver.client.errors import ClientError, RequestTimeoutError
from kvserver.client.leases import KeepAlive, SyncKeepAlive
from kvserver.client.members import MemberAddResult, MemberChangeResult
from kvserver.client.txn import KeyLike, Txn
from kvserver.client.types import (
    CompactResult,
    DeleteResult,
    EndpointStatus,
    KeyValue,
    Lease,
    LeaseList,
    LeaseRevokeResult,
    LeaseTimeToLive,
    Member,
    PutResult,
    RangeResult,
    Status,
    TxnResult,
)
from kvserver.client.watch import DEFAULT_RECONNECT_TIMEOUT_S, SyncWatch
from kvserver.kvpb.alarm import AlarmType
from kvserver.kvpb.kv import SortOrder, SortTarget, TxnRequest

T = TypeVar("T")

WAIT_MARGIN_S = 5.0  # extra wait in the calling thread beyond the async deadline
SHUTDOWN_WAIT_S = 5.0


def _run_loop(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
    asyncio.set_event_loop(loop)
    ready.set()
    try:
        loop.run_forever()
    finally:
        pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def _shutdown(
    loop: asyncio.AbstractEventLoop, thread: threading.Thread, aclient: AsyncClient
) -> None:
    """Close the async client on its loop, then stop the loop and join its thread."""
    if loop.is_closed():
        return
    if thread is threading.current_thread():  # finalizer running on the loop itself
        loop.call_soon(loop.stop)
        return
    try:
        asyncio.run_coroutine_threadsafe(aclient.close(), loop).result(SHUTDOWN_WAIT_S)
    except (concurrent.futures.TimeoutError, RuntimeError):
        pass
    try:
        loop.call_soon_threadsafe(loop.stop)
    except RuntimeError:  # the loop closed meanwhile
        return
    thread.join(SHUTDOWN_WAIT_S)


class Client:
    """Blocking client for raftkv (and etcd's JSON gateway). Options as ``AsyncClient``;
    methods and results are the same, without ``await``. Use as a context manager or call
    ``close()``."""

    def __init__(self, endpoints: str | Sequence[str] = DEFAULT_ENDPOINT, **options: Any) -> None:
        # Built here so bad options fail in the constructor, not on first use.
        self._aclient = AsyncClient(endpoints, **options)
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._finalizer: weakref.finalize | None = None
        self._closed = False

    @property
    def endpoints(self) -> tuple[str, ...]:
        return self._aclient.endpoints

    @property
    def client_id(self) -> int:
        return self._aclient.client_id

    @property
    def leader_endpoint(self) -> str | None:
        return self._aclient.leader_endpoint

    @property
    def user(self) -> str | None:
        return self._aclient.user

    def close(self) -> None:
        with self._lock:
            self._closed = True
            finalizer, self._finalizer = self._finalizer, None
        if finalizer is not None:
            finalizer()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client(endpoints={list(self.endpoints)!r})"

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._closed:
                raise ClientError("the client is closed")
            if self._loop is None:
                loop = asyncio.new_event_loop()
                ready = threading.Event()
                thread = threading.Thread(
                    target=_run_loop, args=(loop, ready), name="raftkv-client-loop", daemon=True
                )
                thread.start()
                ready.wait()
                self._loop, self._thread = loop, thread
                # Holds no reference to self, so an unclosed Client can still be collected.
                self._finalizer = weakref.finalize(self, _shutdown, loop, thread, self._aclient)
            return self._loop

    def _run(self, coro: Coroutine[Any, Any, T], *, bounded: bool = True) -> T:
        """Run ``coro`` on the client's loop and wait for it: at most the client's
        ``timeout_s`` (plus a margin), or, with ``bounded=False``, as long as the call itself
        takes (calls with their own deadline, such as a watch's reconnect timeout)."""
        try:
            loop = self._ensure_loop()
        except BaseException:
            coro.close()
            raise
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError(
                "a blocking Client method was called from the client's own "
                "event loop thread; use AsyncClient there"
            )
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result(self._aclient.timeout_s + WAIT_MARGIN_S if bounded else None)
        except BaseException as exc:
            if future.done():
                raise  # the call's own outcome (note: RequestTimeoutError is a TimeoutError)
            future.cancel()  # the wait was interrupted or the loop is stuck: abandon the call
            if isinstance(exc, concurrent.futures.TimeoutError):
                raise RequestTimeoutError(
                    "the client's event loop did not finish the call in time"
                ) from None
            raise

    # -----------------------------------------------------------------------------------------
    # The API (same signatures as AsyncClient; a test keeps them in step)

    def auth_request(self, op: str, payload: dict[str, Any] | None = None) -> Any:
        return self._run(self._aclient.auth_request(op, payload))

    def put(
        self, key: KeyLike, value: KeyLike, *, lease: int = 0, prev_kv: bool = False
    ) -> PutResult:
        return self._run(self._aclient.put(key, value, lease=lease, prev_kv=prev_kv))

    def get(
        self, key: KeyLike, *, revision: int = 0, serializable: bool = False
    ) -> KeyValue | None:
        return self._run(self._aclient.get(key, revision=revision, serializable=serializable))

    def range(
        self,
        key: KeyLike,
        range_end: KeyLike | None = None,
        *,
        prefix: bool = False,
        limit: int = 0,
        revision: int = 0,
        serializable: bool = False,
        keys_only: bool = False,
        count_only: bool = False,
        sort_order: SortOrder | str = SortOrder.NONE,
        sort_target: SortTarget | str = SortTarget.KEY,
    ) -> RangeResult:
        return self._run(
            self._aclient.range(
                key,
                range_end,
                prefix=prefix,
                limit=limit,
                revision=revision,
                serializable=serializable,
                keys_only=keys_only,
                count_only=count_only,
                sort_order=sort_order,
                sort_target=sort_target,
            )
        )

    def range_arrow(
        self,
        key: KeyLike,
        range_end: KeyLike | None = None,
        *,
        prefix: bool = False,
        limit: int = 0,
        revision: int = 0,
        serializable: bool = False,
        value_format: str = "binary",
        key_format: str = "string",
    ) -> ArrowRange:
        return self._run(
            self._aclient.range_arrow(
                key,
                range_end,
                prefix=prefix,
                limit=limit,
                revision=revision,
                serializable=serializable,
                value_format=value_format,
                key_format=key_format,
            )
        )

    def key_ranks(
        self,
        key: KeyLike,
        range_end: KeyLike | None = None,
        *,
        ranks: Sequence[int],
        prefix: bool = False,
        revision: int = 0,
        serializable: bool = False,
    ) -> KeyRanks:
        return self._run(
            self._aclient.key_ranks(
                key,
                range_end,
                ranks=ranks,
                prefix=prefix,
                revision=revision,
                serializable=serializable,
            )
        )

    def delete(
        self,
        key: KeyLike,
        range_end: KeyLike | None = None,
        *,
        prefix: bool = False,
        prev_kv: bool = False,
    ) -> DeleteResult:
        return self._run(self._aclient.delete(key, range_end, prefix=prefix, prev_kv=prev_kv))

    def txn(self, txn: Txn | TxnRequest) -> TxnResult:
        return self._run(self._aclient.txn(txn))

    def compact(self, revision: int, *, physical: bool = False) -> CompactResult:
        return self._run(self._aclient.compact(revision, physical=physical))

    def watch(
        self,
        key: KeyLike,
        range_end: KeyLike | None = None,
        *,
        prefix: bool = False,
        start_revision: int = 0,
        prev_kv: bool = False,
        filters: Sequence[str] = (),
        progress_notify: bool = False,
        reconnect_timeout_s: float = DEFAULT_RECONNECT_TIMEOUT_S,
    ) -> SyncWatch:
        awatch = self._aclient.watch(
            key,
            range_end,
            prefix=prefix,
            start_revision=start_revision,
            prev_kv=prev_kv,
            filters=filters,
            progress_notify=progress_notify,
            reconnect_timeout_s=reconnect_timeout_s,
        )
        # Returns once the watcher exists (a watch from "now" then misses nothing after it).
        try:
            self._run(awatch.start(), bounded=False)
        except BaseException:
            self._run(awatch.close())
            raise
        return SyncWatch(self._ensure_loop(), awatch)

    def lease_grant(self, ttl_s: int, lease_id: int = 0) -> Lease:
        return self._run(self._aclient.lease_grant(ttl_s, lease_id))

    def lease_revoke(self, lease_id: int) -> LeaseRevokeResult:
        return self._run(self._aclient.lease_revoke(lease_id))

    def lease_keepalive_once(self, lease_id: int) -> int:
        return self._run(self._aclient.lease_keepalive_once(lease_id))

    def lease_time_to_live(self, lease_id: int, keys: bool = False) -> LeaseTimeToLive:
        return self._run(self._aclient.lease_time_to_live(lease_id, keys))

    def lease_leases(self) -> LeaseList:
        return self._run(self._aclient.lease_leases())

    def keep_alive(
        self,
        lease_id: int,
        *,
        interval_s: float | None = None,
        on_refresh: Callable[[int], Any] | None = None,
    ) -> SyncKeepAlive:
        """Keep a lease alive from the client's own event loop thread (no extra thread) until
        closed: ``with client.keep_alive(lease.id) as ka: ...``. Returns after the first
        refresh (raising ``LeaseNotFoundError`` etc. if it failed); ``on_refresh`` runs on the
        loop thread. See ``kvserver.client.leases``."""
        keepalive = KeepAlive(self._aclient, lease_id, interval_s=interval_s, on_refresh=on_refresh)
        self._run(keepalive.start())
        return SyncKeepAlive(self._ensure_loop(), keepalive)

    def status(self, endpoint: str | None = None) -> Status:
        return self._run(self._aclient.status(endpoint))

    def statuses(self) -> tuple[EndpointStatus, ...]:
        return self._run(self._aclient.statuses())

    def member_list(self) -> tuple[Member, ...]:
        return self._run(self._aclient.member_list())

    def member_add(self, peer_urls: Sequence[str], *, is_learner: bool = False) -> MemberAddResult:
        return self._run(self._aclient.member_add(peer_urls, is_learner=is_learner))

    def member_remove(self, member_id: int) -> MemberChangeResult:
        return self._run(self._aclient.member_remove(member_id))

    def member_promote(self, member_id: int) -> MemberChangeResult:
        return self._run(self._aclient.member_promote(member_id))

    def alarm_list(self) -> AlarmResult:
        return self._run(self._aclient.alarm_list())

    def alarm_disarm(self, member_id: int = 0, alarm: AlarmType = AlarmType.NONE) -> AlarmResult:
        return self._run(self._aclient.alarm_disarm(member_id, alarm))

    def find_leader(self) -> str | None:
        return self._run(self._aclient.find_leader())


for _name in (
    "put",
    "get",
    "range",
    "delete",
    "txn",
    "compact",
    "watch",
    "status",
    "statuses",
    "member_list",
    "member_add",
    "member_remove",
    "member_promote",
    "find_leader",
    "lease_grant",
    "lease_revoke",
    "lease_keepalive_once",
    "lease_time_to_live",
    "lease_leases",
):
    getattr(Client, _name).__doc__ = getattr(AsyncClient, _name).__doc__
del _name
