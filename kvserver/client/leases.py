"""Lease calls of the client: etcd's Lease service over the JSON gateway, and keep-alive.

The calls (methods of ``AsyncClient`` and ``Client``; this module has their JSON and the
keep-alive machinery):

- ``lease_grant(ttl_s, lease_id=0)`` -> ``Lease(id, ttl_s)`` — ``POST /v3/lease/grant``
  ``{"TTL", "ID"}``; ID 0 lets the server choose. The server may raise the TTL to its minimum.
- ``lease_revoke(id)`` -> ``LeaseRevokeResult`` — ``/v3/lease/revoke`` ``{"ID"}``; the keys
  attached to the lease are deleted. ``LeaseNotFoundError`` when there is no such lease.
- ``lease_keepalive_once(id)`` -> the TTL (s) the lease has again — ``/v3/lease/keepalive``,
  which answers one ``{"result": {"ID", "TTL"}}`` line per request; a result without a TTL
  (or TTL 0) means the lease is gone: ``LeaseNotFoundError``.
- ``lease_time_to_live(id, keys=False)`` -> ``LeaseTimeToLive`` (remaining TTL, granted TTL,
  attached keys as bytes) — ``/v3/lease/timetolive``. An unknown lease is not an error: its
  ``ttl_s`` is -1 (``expired`` is true), as etcd answers.
- ``lease_leases()`` -> ``LeaseList`` — ``/v3/lease/leases``.

Grant and revoke are writes: they carry the client's ``X-Raftkv-Client-Id`` and a request id,
the same on every retry of the call (see ``kvserver.client.aio``). Keep-alive and
time-to-live are leader-only on the server (a follower forwards them); the client sends every
lease call to the leader when it knows it, and fails over like any other call.

Keep-alive. ``keep_alive(id, interval_s=None, on_refresh=None)`` returns a ``KeepAlive`` (async)
or ``SyncKeepAlive`` (blocking client): a background task on the client's event loop that
refreshes the lease once at start (so a lease that does not exist fails at once), then every
``interval_s`` (default: a third of the TTL the server last answered, as etcd's client does).
A refresh that fails with a retryable error is tried again every ``RETRY_INTERVAL_S`` — each
try is a full client call, with failover between endpoints — until the lease's TTL, counted
from the last refresh sent that succeeded, has run out; then the keep-alive stops with that
error (the lease may have expired on the server). ``LeaseNotFoundError`` or any other
non-retryable failure stops it at once. ``error`` holds why it stopped (``None`` while it
runs or after ``close()``); ``wait()`` blocks until it stops and raises that error. Leaving an
``async with`` / ``with`` block closes it; if the body finished normally but the keep-alive had
failed, leaving raises the keep-alive's error, so a lost lease is not missed. ``close()`` does
not revoke the lease (it expires after its TTL unless revoked); it returns once the refresh
task has ended, which it does at its next await (each refresh is bounded with
``asyncio.timeout``, not ``wait_for``, which on Python 3.11 can drop the cancel; and the task
checks a closed flag before every refresh, so no refresh is sent after ``close()``). ``on_refresh(ttl_s)`` is called
on the client's event loop after each successful refresh (on the blocking client: on its loop
thread, so keep it short); an exception from it stops the keep-alive with that exception.

Lease IDs as people type them (``parse_lease_id``): ``0x``-prefixed or containing a hex letter:
hexadecimal; otherwise decimal. ``format_lease_id`` prints etcdctl's 16-digit hex, with ``0x``
in front when those digits happen to be all decimal, so what is printed always parses back to
the same ID.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable
from typing import Any, Protocol

from kvserver.client import codec
from kvserver.client.errors import (
    ClientError,
    LeaseNotFoundError,
    ResponseFormatError,
    error_class,
)
from kvserver.client.types import Lease, LeaseList, LeaseRevokeResult, LeaseTimeToLive
from kvserver.kvpb.service_errors import GrpcCode

log = logging.getLogger("raftkv.client")

GRANT_PATH = "/v3/lease/grant"
REVOKE_PATH = "/v3/lease/revoke"
KEEPALIVE_PATH = "/v3/lease/keepalive"
TIME_TO_LIVE_PATH = "/v3/lease/timetolive"
LEASES_PATH = "/v3/lease/leases"

INT64_MAX = (1 << 63) - 1
RETRY_INTERVAL_S = 0.5  # between failed refreshes (etcd's client waits 500 ms too)
MIN_INTERVAL_S = 0.05  # never refresh more often than this, whatever the TTL

OnRefresh = Callable[[int], Any]


class LeaseRefresher(Protocol):
    """What a ``KeepAlive`` needs of its client (``AsyncClient`` has it)."""

    async def lease_keepalive_once(self, lease_id: int) -> int: ...


# ---------------------------------------------------------------------------------------------
# Requests


def check_id(lease_id: int, *, allow_zero: bool = False) -> int:
    if isinstance(lease_id, bool) or not isinstance(lease_id, int):
        raise ValueError(f"lease id must be an int, got {lease_id!r}")
    low = 0 if allow_zero else 1
    if not low <= lease_id <= INT64_MAX:
        raise ValueError(f"lease id must be in [{low}, 2**63-1], got {lease_id}")
    return lease_id


def encode_grant(ttl_s: int, lease_id: int) -> dict[str, Any]:
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, int):
        raise ValueError(f"lease TTL must be an int (seconds), got {ttl_s!r}")
    if not 0 <= ttl_s <= INT64_MAX:
        raise ValueError(f"lease TTL must be >= 0 seconds, got {ttl_s}")
    check_id(lease_id, allow_zero=True)
    body: dict[str, Any] = {"TTL": str(ttl_s)}
    if lease_id:
        body["ID"] = str(lease_id)
    return body


def encode_id(lease_id: int) -> dict[str, Any]:
    return {"ID": str(check_id(lease_id))}


def encode_time_to_live(lease_id: int, keys: bool) -> dict[str, Any]:
    body = encode_id(lease_id)
    if keys:
        body["keys"] = True
    return body


# ---------------------------------------------------------------------------------------------
# Answers


def _doc(raw: Any, what: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ResponseFormatError(f"{what}: expected a JSON object, got {type(raw).__name__}")
    return raw


def _int(doc: dict[str, Any], *names: str) -> int:
    for name in names:
        if name in doc:
            return codec.to_int(doc[name], name)
    return 0


def decode_grant(raw: Any) -> Lease:
    doc = _doc(raw, "lease grant response")
    lease = Lease(
        _int(doc, "ID", "id"), _int(doc, "TTL", "ttl"), codec.decode_header(doc.get("header"))
    )
    if lease.id == 0:
        raise ResponseFormatError("lease grant response has no lease ID")
    return lease


def decode_revoke(raw: Any) -> LeaseRevokeResult:
    doc = _doc(raw, "lease revoke response")
    return LeaseRevokeResult(codec.decode_header(doc.get("header")))


def decode_time_to_live(raw: Any) -> LeaseTimeToLive:
    doc = _doc(raw, "lease time-to-live response")
    keys = doc.get("keys") or []
    if not isinstance(keys, list):
        raise ResponseFormatError("lease time-to-live response: keys is not a list")
    return LeaseTimeToLive(
        id=_int(doc, "ID", "id"),
        ttl_s=_int(doc, "TTL", "ttl"),
        granted_ttl_s=_int(doc, "grantedTTL", "granted_ttl", "grantedTtl"),
        keys=tuple(codec.to_bytes(k, "keys") for k in keys),
        header=codec.decode_header(doc.get("header")),
    )


def decode_leases(raw: Any) -> LeaseList:
    doc = _doc(raw, "lease leases response")
    items = doc.get("leases") or []
    if not isinstance(items, list):
        raise ResponseFormatError("lease leases response: leases is not a list")
    ids = tuple(_int(_doc(item, "lease status"), "ID", "id") for item in items)
    return LeaseList(ids, codec.decode_header(doc.get("header")))


def decode_keepalive(raw: Any, lease_id: int) -> int:
    """The TTL of a keep-alive answer line ``{"result": {...}}``; a stream error line
    ``{"error": {"grpc_code", "message", ...}}`` becomes its typed error; no TTL means the
    lease does not exist."""
    doc = _doc(raw, "lease keep-alive response")
    if "error" in doc and "result" not in doc:
        err = _doc(doc["error"], "lease keep-alive error")
        message = str(err.get("message") or "keep-alive stream error")
        try:
            code: GrpcCode | None = GrpcCode(int(err.get("grpc_code")))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            code = None
        http_status = err.get("http_code") if isinstance(err.get("http_code"), int) else None
        raise error_class(code, http_status, message)(message, code=code, http_status=http_status)
    result = _doc(doc.get("result", doc), "lease keep-alive result")
    ttl_s = _int(result, "TTL", "ttl")
    if ttl_s <= 0:
        raise LeaseNotFoundError("etcdserver: requested lease not found", code=GrpcCode.NOT_FOUND)
    answered = _int(result, "ID", "id")
    if answered and answered != lease_id:
        raise ResponseFormatError(f"keep-alive answered lease {answered:x}, not {lease_id:x}")
    return ttl_s


# ---------------------------------------------------------------------------------------------
# IDs as people read and type them


def format_lease_id(lease_id: int) -> str:
    """etcdctl's form (16 hex digits); ``0x`` in front when they are all decimal digits."""
    text = f"{lease_id:016x}"
    return "0x" + text if text.isdigit() else text


def parse_lease_id(text: str, *, allow_zero: bool = False) -> int:
    """``0x``-prefixed or with a hex letter: hexadecimal; otherwise decimal. The one parser of
    lease IDs (the CLI's too). ``allow_zero``: accept 0, "no lease" (``put --lease 0``)."""
    raw = text.strip().lower()
    try:
        if raw.startswith("0x"):
            value = int(raw[2:], 16)
        elif any(c in "abcdef" for c in raw):
            value = int(raw, 16)
        else:
            value = int(raw, 10)
    except ValueError:
        raise ValueError(f"bad lease id {text!r}: want hex (as printed) or decimal") from None
    low = 0 if allow_zero else 1
    if not low <= value <= INT64_MAX:
        raise ValueError(f"lease id {text!r} is out of range (want {low} .. 2**63-1)")
    return value


# ---------------------------------------------------------------------------------------------
# Keep-alive


class KeepAlive:
    """Keeps one lease alive from a background task (see the module docstring)."""

    def __init__(
        self,
        client: LeaseRefresher,
        lease_id: int,
        *,
        interval_s: float | None = None,
        on_refresh: OnRefresh | None = None,
    ) -> None:
        check_id(lease_id)
        if interval_s is not None and not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self.lease_id = lease_id
        self.interval_s = interval_s
        self._client = client
        self._on_refresh = on_refresh
        self.ttl_s: int | None = None  # the TTL the server last answered
        self.refreshes = 0  # successful refreshes, the first one included
        self.failures = 0  # failed refresh calls (each already retried by the client)
        self.error: BaseException | None = None
        self._task: asyncio.Task[None] | None = None
        self._done: asyncio.Event | None = None
        self._closed = False
        self._expires_at = 0.0  # loop time: sent time of the last good refresh + its TTL

    @property
    def alive(self) -> bool:
        """Started, not closed, and not stopped by a failure."""
        return self._task is not None and not self._task.done()

    def __repr__(self) -> str:
        state = "alive" if self.alive else ("failed" if self.error else "stopped")
        return (
            f"KeepAlive(lease={format_lease_id(self.lease_id)}, {state}, ttl_s={self.ttl_s}, "
            f"refreshes={self.refreshes})"
        )

    async def start(self) -> KeepAlive:
        """Refresh once now (raising ``LeaseNotFoundError`` etc. if that fails), then keep
        refreshing in the background."""
        if self._task is not None or self._closed:
            raise ClientError("this keep-alive was already started")
        loop = asyncio.get_running_loop()
        self._done = asyncio.Event()
        sent_s = loop.time()
        await self._refreshed(await self._client.lease_keepalive_once(self.lease_id), sent_s)
        self._task = loop.create_task(self._run(), name=f"raftkv-keepalive-{self.lease_id:x}")
        return self

    async def __aenter__(self) -> KeepAlive:
        return await self.start()

    async def __aexit__(self, exc_type, exc, tb) -> None:
        await self.close()
        if exc_type is None and self.error is not None:
            raise self.error

    async def close(self) -> None:
        """Stop refreshing (the lease stays until its TTL runs out or it is revoked)."""
        self._closed = True
        task = self._task
        if task is not None:
            running = asyncio.current_task()
            if running is not None and running is task:
                running.cancel()  # close() from on_refresh: the task ends at its next await
                return
            if not task.done():
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    # Our own cancel of the task, unless the caller is being cancelled too.
                    current = asyncio.current_task()
                    if current is not None and current.cancelling():
                        raise
        if self._done is not None:
            self._done.set()

    async def wait(self) -> None:
        """Until the keep-alive stops: returns after ``close()``, raises the failure that
        stopped it otherwise."""
        if self._done is None:
            raise ClientError("the keep-alive was not started")
        await self._done.wait()
        if self.error is not None:
            raise self.error

    async def _refreshed(self, ttl_s: int, sent_s: float) -> None:
        self.ttl_s = ttl_s
        self.refreshes += 1
        self._expires_at = sent_s + ttl_s
        if self._on_refresh is not None:
            result = self._on_refresh(ttl_s)
            if asyncio.iscoroutine(result):
                await result

    def _interval(self) -> float:
        if self.interval_s is not None:
            return self.interval_s
        return max((self.ttl_s or 0) / 3, MIN_INTERVAL_S)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            # ``_closed`` is checked as well as relying on ``close()``'s cancel: a loop that
            # only ends by cancellation hangs ``close()`` for ever if one cancel is lost.
            while not self._closed:
                await asyncio.sleep(self._interval())
                await self._refresh_before_expiry(loop)
        except Exception as exc:  # a ClientError, or the on_refresh callback's failure
            self.error = exc
            log.info("keep-alive of lease %x stopped: %s", self.lease_id, exc)
        finally:
            if self._done is not None:
                self._done.set()

    async def _refresh_before_expiry(self, loop: asyncio.AbstractEventLoop) -> None:
        last: ClientError | None = None
        while not self._closed:
            remaining_s = self._expires_at - loop.time()
            if remaining_s <= 0:
                raise _expired(self.lease_id, self.ttl_s, last)
            sent_s = loop.time()
            try:
                # A refresh is no use after the lease's deadline: bound the call by it. Not
                # ``asyncio.wait_for``: on Python 3.11 it swallows a cancel (``close()``) that
                # arrives as the call completes (CPython gh-86296), and the loop never ends.
                # ``asyncio.timeout`` runs the call in this task, so a cancel always lands.
                async with asyncio.timeout(remaining_s):
                    ttl_s = await self._client.lease_keepalive_once(self.lease_id)
            except ClientError as exc:  # first: RequestTimeoutError is a TimeoutError too
                if not exc.retryable:
                    raise
                last = exc
                self.failures += 1
                log.debug("keep-alive of lease %x failed, retrying: %s", self.lease_id, exc)
                await asyncio.sleep(
                    max(
                        0.0, min(RETRY_INTERVAL_S, self._interval(), self._expires_at - loop.time())
                    )
                )
                continue
            except TimeoutError:  # our deadline: the lease's TTL ran out
                raise _expired(self.lease_id, self.ttl_s, last) from None
            await self._refreshed(ttl_s, sent_s)
            return


def _expired(lease_id: int, ttl_s: int | None, last: ClientError | None) -> ClientError:
    """The error a keep-alive stops with when no refresh got through in time: the last
    failure's type (retryable: the cluster may just have been unreachable), saying so."""
    what = f"keep-alive {format_lease_id(lease_id)}"
    message = (
        f"no refresh of lease {format_lease_id(lease_id)} succeeded within its "
        f"{ttl_s} s TTL; it may have expired"
    )
    if last is None:
        return ClientError(message, operation=what)
    return type(last)(
        f"{message}: {last.message}",
        code=last.code,
        http_status=last.http_status,
        endpoint=last.endpoint,
        operation=what,
        attempts=last.attempts,
    )


class SyncKeepAlive:
    """A ``KeepAlive`` running on a blocking ``Client``'s event loop thread; the same
    attributes, blocking methods. Made by ``Client.keep_alive``."""

    def __init__(self, loop: asyncio.AbstractEventLoop, keepalive: KeepAlive) -> None:
        self._loop = loop
        self._ka = keepalive

    lease_id = property(lambda self: self._ka.lease_id)
    ttl_s = property(lambda self: self._ka.ttl_s)
    refreshes = property(lambda self: self._ka.refreshes)
    failures = property(lambda self: self._ka.failures)
    error = property(lambda self: self._ka.error)
    alive = property(lambda self: self._ka.alive)

    def __repr__(self) -> str:
        return "Sync" + repr(self._ka)

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:  # called on the loop thread (from on_refresh): don't block
            self._loop.create_task(self._ka.close())
            return
        # Set from this thread too: the refresh loop checks it before every refresh, so it
        # stops even if the loop is too busy to run close() within the wait below.
        self._ka._closed = True
        try:
            asyncio.run_coroutine_threadsafe(self._ka.close(), self._loop).result(10.0)
        except RuntimeError:
            pass  # the client's loop is stopping: its tasks are cancelled anyway
        except concurrent.futures.TimeoutError:
            # The loop is blocked (a slow on_refresh?); the keep-alive is marked closed, so
            # it sends no further refresh, and close() runs when the loop moves again.
            log.warning("keep-alive of lease %x: close() did not finish within 10 s", self.lease_id)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the keep-alive stops (``True``; raises its failure) or ``timeout_s``
        passes (``False``)."""
        future = asyncio.run_coroutine_threadsafe(self._ka.wait(), self._loop)
        try:
            future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()  # cancels only the wait, not the keep-alive
            return False
        except BaseException:
            if not future.done():
                future.cancel()
            raise
        return True

    def __enter__(self) -> SyncKeepAlive:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()
        if exc_type is None and self._ka.error is not None:
            raise self._ka.error


__all__ = [
    "KeepAlive",
    "SyncKeepAlive",
    "format_lease_id",
    "parse_lease_id",
]
