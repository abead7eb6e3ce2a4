"""Watch iterators: every change to a key, a range or a prefix, in order, each exactly once.

::

    async with AsyncClient(endpoints) as client:
        async for event in client.watch("jobs/", prefix=True, start_revision=1):
            print(event.type.name, event.key, event.value, event.revision)

    with Client(endpoints) as client:
        with client.watch("jobs/", prefix=True) as events:
            for event in events:             # blocks; events.get(timeout_s=...) to poll
                ...

Wire protocol: ``POST /v3/watch`` of etcd's JSON gateway (``kvserver.api.http.watch``): one
``{"create_request": ...}`` body, a chunked answer of ``{"result": WatchResponse}`` lines. It
works against raftkv and against etcd 3.4+.

Guarantees
----------
The iterator yields ``WatchEvent``s in revision order (events of one revision in the order
the server applied them), each once, from ``start_revision`` (0: from the revision after the
one current when the watch is created) for as long as the caller iterates. It keeps
``next_revision``: every event below it has been received. When the stream breaks — the
connection drops, the member is killed or stops, the server cancels the watcher as too slow,
a retryable error line arrives — it reconnects (the leader when known, else another endpoint;
backoff between rounds) and creates the watch again from ``next_revision``. A member serving
a resumed watch replays its history from there (or, if it is behind, waits until it applies
that revision), and every member numbers revisions alike, so nothing is missed or repeated.
(As a safety net, events of a revision already received are dropped.)

Creating the watch is bounded by the client's ``timeout_s``; reconnecting after that gives
up, raising the last failure (``ConnectionFailedError`` and friends), when no endpoint gives a
working stream for ``reconnect_timeout_s``. If the history the watch needs
has been compacted, iteration raises ``WatchCompactedError`` (a ``CompactedError``) with
``compact_revision``: the caller re-reads the state and watches again from there. A watch the
server refuses (an empty range, too many watchers) raises ``WatchCanceledError`` with the
server's ``cancel_reason``.

Liveness: a member that is alive but stopped (SIGSTOP) or partitioned keeps the connection
open and sends nothing; the iterator cannot tell that from a quiet key (as with etcd's gRPC
watch without keep-alives). ``progress_notify=True`` makes the server send a progress
response every progress interval (10 min by default) which advances ``next_revision``.

``close()`` (or leaving ``async with``) ends the iteration and the HTTP request, which frees
the watcher on the server.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import aiohttp

from kvserver.client import codec
from kvserver.client.errors import (
    ClientError,
    CompactedError,
    ConnectionFailedError,
    ResponseFormatError,
    UnavailableError,
    error_class,
)
from kvserver.client.retry import INVALID_AUTH_TOKEN, RetryEngine, Route, Stopped
from kvserver.client.txn import KeyLike, key_range
from kvserver.kvpb.kv import Event, EventType
from kvserver.kvpb.service_errors import GrpcCode
from kvserver.kvpb.watch import WatchFilter, WatchResponse

log = logging.getLogger("raftkv.client.watch")

WATCH_PATH = "/v3/watch"
MAX_LINE_BYTES = 64 * 1024 * 1024  # one response line (etcd fragments above ~2 MiB)
DEFAULT_RECONNECT_TIMEOUT_S = 60.0
_READ_CHUNK_BYTES = 1 << 16
_FILTER_NAMES = tuple(WatchFilter.__members__)  # NOPUT, NODELETE

__all__ = [
    "WatchCanceledError",
    "WatchCompactedError",
    "WatchEvent",
    "AsyncWatch",
    "SyncWatch",
    "decode_watch_response",
]


# ---------------------------------------------------------------------------------------------
# Results and errors


@dataclass(frozen=True, slots=True)
class WatchEvent(Event):
    """One change: ``type`` PUT or DELETE, the key-value after it (a DELETE's ``kv`` holds only
    ``key`` and ``mod_revision``) and, when asked for with ``prev_kv=True``, the one before."""

    @property
    def key(self) -> bytes:
        return self.kv.key

    @property
    def value(self) -> bytes:
        return self.kv.value

    @property
    def revision(self) -> int:
        return self.kv.mod_revision

    @property
    def is_put(self) -> bool:
        return self.type is EventType.PUT

    @property
    def is_delete(self) -> bool:
        return self.type is EventType.DELETE


class WatchCanceledError(ClientError):
    """The server refused or canceled the watch for a reason a retry will not fix
    (``message`` is its ``cancel_reason``)."""


class WatchCompactedError(CompactedError):
    """The history the watch needs is compacted; ``compact_revision`` is the oldest revision
    still kept. Read the current state, then watch again from its revision + 1."""

    def __init__(self, message: str, *, compact_revision: int = 0, **kwargs: Any) -> None:
        self.compact_revision = compact_revision
        super().__init__(message, **kwargs)

    def _copy(self, **changes: Any) -> ClientError:
        fields: dict[str, Any] = dict(
            code=self.code,
            http_status=self.http_status,
            endpoint=self.endpoint,
            operation=self.operation,
            attempts=self.attempts,
            compact_revision=self.compact_revision,
        )
        fields.update(changes)
        return type(self)(self.message, **fields)

    def __reduce__(self):
        return (
            _rebuild_compacted,
            (self.message, self.compact_revision, self.endpoint, self.operation),
        )


def _rebuild_compacted(message, compact_revision, endpoint, operation):
    return WatchCompactedError(
        message, compact_revision=compact_revision, endpoint=endpoint, operation=operation
    )


def _decode_event(raw: Any) -> WatchEvent:
    if not isinstance(raw, dict):
        raise ResponseFormatError(f"watch event: expected a JSON object, got {raw!r:.60}")
    kind = raw.get("type", "PUT")
    if kind in ("PUT", 0, None):
        etype = EventType.PUT
    elif kind in ("DELETE", 1):
        etype = EventType.DELETE
    else:
        raise ResponseFormatError(f"watch event: unknown type {kind!r:.40}")
    prev = raw.get("prev_kv", raw.get("prevKv"))
    return WatchEvent(
        etype, codec.decode_kv(raw.get("kv")), None if prev is None else codec.decode_kv(prev)
    )


def _flag(doc: dict, name: str) -> bool:
    value = doc.get(name, False)
    if not isinstance(value, bool):
        raise ResponseFormatError(f"watch response: field {name!r}: expected true/false")
    return value


def decode_watch_response(raw: Any) -> WatchResponse:
    """The ``result`` object of one line (lenient like ``codec``: snake_case or camelCase,
    integers as strings or numbers)."""
    if not isinstance(raw, dict):
        raise ResponseFormatError(f"watch response: expected a JSON object, got {raw!r:.60}")

    def get(name: str, camel: str) -> Any:
        return raw.get(name, raw.get(camel))

    events = get("events", "events") or []
    if not isinstance(events, list):
        raise ResponseFormatError("watch response: field 'events': expected a JSON list")
    reason = get("cancel_reason", "cancelReason") or ""
    if not isinstance(reason, str):
        raise ResponseFormatError("watch response: field 'cancel_reason': expected text")
    return WatchResponse(
        header=codec.decode_header(raw.get("header")),
        watch_id=codec.to_int(get("watch_id", "watchId"), "watch_id"),
        created=_flag(raw, "created"),
        canceled=_flag(raw, "canceled"),
        compact_revision=codec.to_int(
            get("compact_revision", "compactRevision"), "compact_revision"
        ),
        cancel_reason=reason,
        fragment=_flag(raw, "fragment"),
        events=tuple(_decode_event(e) for e in events),
    )


def _stream_error(doc: Any, endpoint: str) -> ClientError:
    """A grpc-gateway stream error line ``{"error": {"grpc_code", "message", ...}}``."""
    code: GrpcCode | None = None
    message = "stream error"
    http_status = None
    if isinstance(doc, dict):
        if isinstance(doc.get("message"), str):
            message = doc["message"]
        raw_code = doc.get("grpc_code", doc.get("code"))
        if isinstance(raw_code, int) and not isinstance(raw_code, bool):
            try:
                code = GrpcCode(raw_code)
            except ValueError:
                code = None
        if isinstance(doc.get("http_code"), int):
            http_status = doc["http_code"]
    cls = error_class(code, http_status, message)
    return cls(message, code=code, http_status=http_status, endpoint=endpoint)


# ---------------------------------------------------------------------------------------------
# The asyncio iterator


class _Reconnect(Exception):
    """The current stream is unusable; make a new one (``error`` says why)."""

    def __init__(self, error: ClientError) -> None:
        super().__init__(error.message)
        self.error = error


class AsyncWatch:
    """``async for event in watch`` (see the module docstring). Made by
    ``AsyncClient.watch``; belongs to that client's event loop."""

    def __init__(
        self,
        retry: RetryEngine,
        key: KeyLike,
        range_end: KeyLike | None = None,
        *,
        prefix: bool = False,
        start_revision: int = 0,
        prev_kv: bool = False,
        filters: Sequence[str] = (),
        progress_notify: bool = False,
        reconnect_timeout_s: float = DEFAULT_RECONNECT_TIMEOUT_S,
        max_line_bytes: int = MAX_LINE_BYTES,
    ) -> None:
        if start_revision < 0:
            raise ValueError(f"start_revision must be >= 0, got {start_revision}")
        if not reconnect_timeout_s > 0:
            raise ValueError(f"reconnect_timeout_s must be > 0, got {reconnect_timeout_s!r}")
        bad = [f for f in filters if f not in _FILTER_NAMES]
        if bad:
            raise ValueError(f"unknown watch filter(s) {bad}: use 'NOPUT' and/or 'NODELETE'")
        self._retry = retry
        self._key, self._range_end = key_range(key, range_end, prefix)
        if not self._key:
            raise ValueError("key must not be empty (use prefix=True with '' for every key)")
        self._prev_kv = prev_kv
        self._filters = tuple(dict.fromkeys(filters))
        self._progress_notify = progress_notify
        self._reconnect_timeout_s = float(reconnect_timeout_s)
        self._max_line_bytes = max_line_bytes
        # invariant: every event with mod_revision < _next_rev has been received (0: none
        # yet, and the watch starts "now")
        self._next_rev = start_revision
        self._pending: deque[WatchEvent] = deque()
        self._fragments: list[WatchEvent] = []  # events of a fragmented response so far
        self._resp: aiohttp.ClientResponse | None = None
        self._buf = bytearray()
        self._closed = False
        self._created = False  # a server has created the watcher at least once
        self._failed: BaseException | None = None
        self._endpoint: str | None = None
        self._what = f"watch {self._key!r:.60}" + (" --prefix" if prefix else "")
        self.reconnects = 0  # streams made after the first
        self.responses = 0  # responses received

    # --- public ---------------------------------------------------------------------------------

    @property
    def next_revision(self) -> int:
        """Every event below this revision has been received (0: nothing known yet)."""
        return self._next_rev

    @property
    def endpoint(self) -> str | None:
        """The endpoint serving the current stream."""
        return self._endpoint

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        """End the iteration and the HTTP request (the server drops the watcher)."""
        self._closed = True
        self._pending.clear()
        self._drop()

    async def start(self) -> AsyncWatch:
        """Connect and wait until the server has created the watcher (iterating starts it
        too). After it returns, a watch from "now" (``start_revision=0``) sees every change
        made after this moment. Raises like iteration does (``WatchCanceledError`` when the
        server refuses the watch)."""
        while not self._created and not self._pending:
            if self._closed:
                return self
            await self._guarded_step()
        return self

    async def __aenter__(self) -> AsyncWatch:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    def __aiter__(self) -> AsyncWatch:
        return self

    async def __anext__(self) -> WatchEvent:
        while not self._pending:
            if self._closed:
                raise StopAsyncIteration
            await self._guarded_step()
        return self._pending.popleft()

    async def _guarded_step(self) -> None:
        if self._failed is not None:
            raise self._failed
        try:
            await self._step()
        except ClientError as err:
            self._failed = err  # the watch stays failed: later calls raise it again
            self._drop()
            raise

    def __repr__(self) -> str:
        return (
            f"AsyncWatch({self._key!r}, range_end={self._range_end!r}, "
            f"next_revision={self._next_rev}, endpoint={self._endpoint!r})"
        )

    # --- internals ------------------------------------------------------------------------------

    def _drop(self) -> None:
        resp, self._resp = self._resp, None
        self._buf.clear()
        self._fragments.clear()  # the server sends the whole response again after a resume
        if resp is not None:
            resp.close()  # closes the connection: the server notices and frees the watcher

    def _request_body(self) -> bytes:
        create: dict[str, Any] = {"key": codec.b64(self._key)}
        if self._range_end:
            create["range_end"] = codec.b64(self._range_end)
        if self._next_rev:
            create["start_revision"] = str(self._next_rev)
        if self._prev_kv:
            create["prev_kv"] = True
        if self._filters:
            create["filters"] = list(self._filters)
        if self._progress_notify:
            create["progress_notify"] = True
        return json.dumps({"create_request": create}, separators=(",", ":")).encode()

    async def _step(self) -> None:
        """Read one response (connecting first if needed) into ``_pending``."""
        if self._resp is None:
            await self._connect()
            if self._resp is None:
                return  # closed meanwhile
        endpoint = self._endpoint or ""
        try:
            line = await self._read_line()
            if line is None:
                raise _Reconnect(
                    ConnectionFailedError(
                        "the watch stream ended", endpoints=(endpoint,), endpoint=endpoint
                    )
                )
            try:
                doc = json.loads(line)
            except ValueError:
                raise ResponseFormatError(
                    f"watch line is not JSON: {bytes(line[:80])!r}", endpoint=endpoint
                ) from None
            if not isinstance(doc, dict):
                raise ResponseFormatError("watch line: expected a JSON object", endpoint=endpoint)
            if "result" not in doc and "error" in doc:
                err = _stream_error(doc["error"], endpoint)
                if err.retryable:
                    raise _Reconnect(err)
                raise err.with_context(self._what, ())
            self._handle(decode_watch_response(doc.get("result")))
        except _Reconnect as why:
            log.debug(
                "%s: stream from %s broke (%s); resuming from revision %d",
                self._what,
                endpoint,
                why.error.message,
                self._next_rev,
            )
            self._retry.note_failure(endpoint, why.error)
            self._drop()

    def _handle(self, resp: WatchResponse) -> None:
        self.responses += 1
        endpoint = self._endpoint or ""
        if resp.created and resp.canceled:  # refused at creation
            raise WatchCanceledError(
                resp.cancel_reason or "watch refused", endpoint=endpoint, operation=self._what
            )
        if resp.created:
            self._created = True
            if self._next_rev == 0:
                self._next_rev = resp.header.revision + 1
            return
        if resp.events:
            # decode_watch_response builds every event as a WatchEvent
            events = cast("tuple[WatchEvent, ...]", resp.events)
            if resp.fragment:  # a revision may continue in the next part: wait for the last
                self._fragments.extend(events)
                return
            if self._fragments:
                events = (*self._fragments, *events)
                self._fragments.clear()
            floor = self._next_rev
            top = floor
            for ev in events:
                rev = ev.kv.mod_revision
                if rev < floor:
                    continue  # a revision already received (never expected; a safety net)
                self._pending.append(ev)
                top = max(top, rev + 1)
            self._next_rev = top
        if resp.canceled:
            if resp.compact_revision:
                self._closed = True
                self._drop()
                raise WatchCompactedError(
                    f"required revision {self._next_rev} has been compacted "
                    f"(compact revision {resp.compact_revision})",
                    compact_revision=resp.compact_revision,
                    code=GrpcCode.OUT_OF_RANGE,
                    endpoint=endpoint,
                    operation=self._what,
                )
            # Too slow, server stopping, or canceled by someone else: resume elsewhere.
            raise _Reconnect(
                UnavailableError(
                    f"watch canceled by the server: {resp.cancel_reason or 'no reason given'}",
                    endpoint=endpoint,
                )
            )
        if resp.is_progress_notify and resp.header.revision + 1 > self._next_rev:
            self._next_rev = resp.header.revision + 1

    async def _connect(self) -> None:
        # Creating the watch is a call like any other (the client's timeout); once it ran,
        # losing the stream gets the longer reconnect budget.
        budget_s = (
            self._reconnect_timeout_s
            if self._created
            else min(self._reconnect_timeout_s, self._retry.timeout_s)
        )
        try:
            endpoint, resp = await self._retry.run(
                self._what,
                self._open,
                Route.LEADER,
                timeout_s=budget_s,
                # A watch re-authenticates only when its token is rejected; unary calls also
                # when auth was enabled after the client found it off.
                reauthenticate_on=(INVALID_AUTH_TOKEN,),
                stopped=lambda: self._closed,
            )
        except Stopped:
            return
        self._resp = resp
        self._buf.clear()
        if self._endpoint is not None:
            self.reconnects += 1
        self._endpoint = endpoint

    async def _open(
        self, endpoint: str, timeout_s: float, auth_headers: dict[str, str]
    ) -> tuple[str, aiohttp.ClientResponse]:
        """POST the create request; the stream once a 200 answer starts, else a typed error."""
        headers = {"Content-Type": "application/json", **auth_headers}
        resp = await self._retry.transport.open_stream(
            endpoint, WATCH_PATH, self._request_body(), headers, timeout_s
        )
        return endpoint, resp

    async def _read_line(self) -> bytearray | None:
        """The next line of the stream, or None at its end; a broken connection raises
        ``_Reconnect``."""
        resp = self._resp
        assert resp is not None
        buf = self._buf
        endpoint = self._endpoint or ""
        scanned = 0
        while True:
            nl = buf.find(b"\n", scanned)
            if nl >= 0:
                line = buf[:nl]
                del buf[: nl + 1]
                if line.strip():
                    return line
                scanned = 0
                continue
            scanned = len(buf)
            if len(buf) > self._max_line_bytes:
                raise ResponseFormatError(
                    f"a watch line is over {self._max_line_bytes} bytes", endpoint=endpoint
                )
            try:
                chunk = await resp.content.readany()
            except (aiohttp.ClientError, ConnectionError, asyncio.IncompleteReadError) as exc:
                raise _Reconnect(
                    ConnectionFailedError(
                        f"connection lost: {exc or type(exc).__name__}",
                        endpoints=(endpoint,),
                        endpoint=endpoint,
                    )
                ) from None
            if not chunk:
                if buf.strip():
                    line = bytearray(buf)
                    buf.clear()
                    return line
                return None
            buf += chunk


# ---------------------------------------------------------------------------------------------
# The blocking iterator


class SyncWatch:
    """The blocking twin of ``AsyncWatch`` (made by ``Client.watch``, which returns once the
    server has created the watcher): ``for event in w``, ``w.get(timeout_s)``, ``w.close()``;
    usable as a context manager. Runs on the client's loop thread."""

    _POLL_S = 0.5  # the calling thread wakes this often, so Ctrl-C is noticed

    def __init__(self, loop: asyncio.AbstractEventLoop, awatch: AsyncWatch) -> None:
        self._loop = loop
        self._awatch = awatch
        # The read a timed-out get left running, taken up by the next call. Cancelling it
        # instead raced the next call's read: the cancellation reaches the loop later than
        # a new read may start, and aiohttp refuses a second reader of one stream.
        self._inflight: concurrent.futures.Future[WatchEvent | None] | None = None

    @property
    def next_revision(self) -> int:
        return self._awatch.next_revision

    @property
    def endpoint(self) -> str | None:
        return self._awatch.endpoint

    @property
    def reconnects(self) -> int:
        return self._awatch.reconnects

    def __iter__(self) -> SyncWatch:
        return self

    def __next__(self) -> WatchEvent:
        event = self._next(None)
        if event is None:
            raise StopIteration
        return event

    def get(self, timeout_s: float | None = None) -> WatchEvent | None:
        """The next event; ``None`` when the watch is closed; ``TimeoutError`` if none came
        within ``timeout_s``."""
        return self._next(timeout_s)

    def _next(self, timeout_s: float | None) -> WatchEvent | None:
        async def one() -> WatchEvent | None:
            try:
                return await self._awatch.__anext__()
            except StopAsyncIteration:
                return None

        future = self._inflight
        if future is None:
            future = self._inflight = asyncio.run_coroutine_threadsafe(one(), self._loop)
        waited_s = 0.0
        while True:
            step = self._POLL_S if timeout_s is None else min(self._POLL_S, timeout_s - waited_s)
            try:
                event = future.result(max(step, 0.0))
            except concurrent.futures.TimeoutError:
                if future.done():  # the watch itself raised it
                    self._inflight = None
                    raise
                waited_s += step
                if timeout_s is not None and waited_s >= timeout_s:
                    # the read goes on: its event is the next call's
                    raise TimeoutError(f"no watch event within {timeout_s:g} s") from None
                continue
            except BaseException:
                if not future.done():
                    future.cancel()  # interrupted (Ctrl-C): no one will take its event
                self._inflight = None
                raise
            self._inflight = None
            return event

    def close(self) -> None:
        if self._loop.is_closed():
            return
        future, self._inflight = self._inflight, None
        if future is not None and not future.done():
            future.cancel()
        try:
            asyncio.run_coroutine_threadsafe(self._awatch.close(), self._loop).result(5.0)
        except (concurrent.futures.TimeoutError, RuntimeError):
            pass

    def __enter__(self) -> SyncWatch:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
