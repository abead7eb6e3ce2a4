"""``POST /v3/watch`` (and ``/v3beta/watch``): etcd's Watch stream through the JSON gateway.

What etcd 3.4's gateway does, and so what this does (checked with curl against etcd 3.4.23):

Request. The body is a stream of ``WatchRequest`` JSON objects, one after another (whitespace
between them allowed, none needed), each with at most one of ``create_request``,
``cancel_request``, ``progress_request`` (proto or lowerCamel names, as the rest of the
gateway). Usually it is one object: ``{"create_request": {"key": "<b64>", "range_end",
"start_revision", "prev_kv", "filters": ["NOPUT"|"NODELETE"|0|1], "progress_notify",
"watch_id", "fragment"}}``. Objects are read as they arrive, so a client that streams its
request body can create, cancel and ask for progress on one connection. An object with none of
the three (``{}``, unknown fields, ``null`` members) is ignored, as etcd does.

Response. ``200``, chunked, ``Content-Type: application/json``; one line per
``WatchResponse``: ``{"result": {"header": {...}, "watch_id", "created", "canceled",
"compact_revision", "cancel_reason", "fragment", "events": [{"type", "kv", "prev_kv"}]}}`` —
int64 as strings, bytes base64, defaults omitted (``watch_id`` 0, a ``PUT`` type, a false
flag, an empty list), ``header`` with ``cluster_id``, ``member_id``, ``revision`` (absent in a
compacted response, as etcd) and ``raft_term``. A deleted key's ``kv`` holds only ``key`` and
``mod_revision``. The semantics (history replay, filters, prev_kv, compaction, cancel,
progress, fragments, bounded buffers) are ``kvserver.watch.hub``'s; this module only moves bytes.
A response of more than ``ENCODE_STEP_EVENTS`` events (a revision that deleted a million keys
is one line, as etcd's gateway writes it, unless the client asked for ``fragment``) is
encoded and written ``ENCODE_STEP_EVENTS`` events at a time, yielding to the loop between
pieces, and its events are then handed back to the hub (``WatchStream.release``) to be
dropped a slice at a time: no step of writing it grows with the number of events.

Lifetime. The response stays open while a watcher is live or more requests may come. It ends
when the client disconnects (noticed within ``DISCONNECT_POLL_S`` even on an idle stream, by
one task that looks at every stream's connection: its watchers are removed and their memory
freed), when the request body has ended and every
watcher is done (canceled, compacted, too slow) — etcd keeps such a stream open forever,
which helps nobody since an HTTP/1.1 request body that ended cannot carry another request —
or when the server shuts down (a final error line, Unavailable, so clients reconnect
elsewhere).

Bad input. The first object is read before anything is sent: bad JSON, wrong types, bad
base64, an unknown filter name or an object over ``ApiLimits.max_body_bytes`` is an ordinary
error response (400 InvalidArgument, 413 for the size) and nothing is created. A bad object
later in the stream ends it with one line ``{"error": {"grpc_code", "http_code", "message",
"http_status"}}`` (grpc-gateway's stream error shape, as ``lease/keepalive`` uses). etcd 3.4
answers a bad first object with HTTP 500 and code 2 (Unknown) carrying Go's decoder text, and
silently stops reading at a bad later one; its error codes are not matched here.

Slow consumers. The handler writes as fast as the client reads (``response.write`` applies
TCP back-pressure); meanwhile responses queue in the hub, bounded per watcher. A watcher whose
queue would overflow is canceled with ``cancel_reason`` ``kvserver.watch.hub.MSG_WATCHER_TOO_SLOW``
after what was already queued; the client resumes from the last revision it saw + 1.

Auth. With auth enabled, a create request for a range the user may not read is refused as
etcd does (``created`` + ``canceled``, ``cancel_reason`` ``etcdserver: permission denied``);
after every auth change the stream re-checks its watchers and cancels, with that reason, any
whose range the user may no longer read (revoked permission or role, deleted user, ...).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import replace
from http import HTTPStatus
from operator import attrgetter
from typing import Any

from aiohttp import web

from kvserver.kvpb.kv import Event, EventType, ResponseHeader
from kvserver.kvpb.service_errors import GrpcCode, ServiceError
from kvserver.kvpb.watch import WatchCreateRequest, WatchFilter, WatchResponse
from kvserver.watch.hub import WatchStream

from . import auth as auth_api
from . import gateway_json
from .common import LIMITS_KEY, MSG_TOO_LARGE, SERVICE_KEY, HTTPStatusError, dumps, error_parts

log = logging.getLogger(__name__)

DISCONNECT_POLL_S = 0.5  # how often an idle stream checks that its client is still there
MAX_WRITE_BATCH_BYTES = 256 * 1024  # queued responses written together in one chunk
ENCODE_STEP_EVENTS = 1_000  # events of a response encoded per loop step
MSG_SERVER_STOPPED = "etcdserver: server stopped"

_WS = b" \t\r\n"


class _Session:
    """One watch request being served: its stream, and why it must end early."""

    __slots__ = ("request", "stream", "error", "auth", "user")

    def __init__(self, request: web.Request, stream: WatchStream) -> None:
        self.request = request
        self.stream = stream
        self.error: tuple[int, str, int] | None = None  # (grpc code, message, http status)
        # Auth (kvserver.api.http.auth): the user this stream acts as; None = auth disabled.
        self.auth = auth_api.auth_service(request)
        self.user = auth_api.user_of(request)

    def may_watch(self, key: bytes, range_end: bytes) -> bool:
        return self.auth is None or self.auth.can_read(self.user, key, range_end)

    def recheck(self) -> None:
        """Auth state changed: cancel every watcher whose range the user may no longer read
        (etcd's permission denied as the cancel reason)."""
        for w in self.stream.watchers.values():
            if not self.may_watch(w.key, w.range_end):
                w.cancel_with_reason(auth_api.MSG_PERMISSION_DENIED)

    def client_gone(self) -> bool:
        transport = self.request.transport
        return transport is None or transport.is_closing()

    def fail(self, code: int, message: str, http_status: int) -> None:
        """End the stream with an error line (queued responses are dropped)."""
        if self.error is None:
            self.error = (code, message, http_status)
        self.stream.close()


SESSIONS_KEY: web.AppKey[set[_Session]] = web.AppKey("raftkv_watch_sessions")  # closed at shutdown


def setup(app: web.Application) -> None:
    """Register the per-app state: one task notices disconnected clients of idle streams;
    open streams end with an error line at shutdown (before aiohttp waits for handlers), so a
    stopping member does not hang on its watchers."""
    app[SESSIONS_KEY] = set()
    app.cleanup_ctx.append(_reaper)
    app.on_shutdown.append(_on_shutdown)


async def _reaper(app: web.Application):  # type: ignore[no-untyped-def]
    """An idle stream (nothing to write, request body over) hears nothing when its client
    goes away: look at every stream's connection every ``DISCONNECT_POLL_S`` (one task for
    all streams) and close the streams of the ones that closed."""

    async def reap() -> None:
        while True:
            await asyncio.sleep(DISCONNECT_POLL_S)
            sessions = app[SESSIONS_KEY]
            for session in list(sessions):
                if session.client_gone():
                    session.stream.close()  # its handler ends and removes it

    task = asyncio.get_running_loop().create_task(reap(), name="watch-reaper")
    yield
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _on_shutdown(app: web.Application) -> None:
    sessions = app[SESSIONS_KEY]
    for session in list(sessions):
        session.fail(int(GrpcCode.UNAVAILABLE), MSG_SERVER_STOPPED, 503)


# ---------------------------------------------------------------------------------------------
# Requests


def _invalid(message: str) -> ServiceError:
    return ServiceError(GrpcCode.INVALID_ARGUMENT, "raftkv: " + message)


class _ObjectReader:
    """Splits a request body into top-level JSON objects as its bytes arrive.

    Scans for the end of each object (braces outside strings), so nothing waits for the body
    to end; an object longer than ``max_object_bytes`` is refused. Structural characters are
    ASCII, so scanning UTF-8 bytes is exact."""

    def __init__(self, content: Any, max_object_bytes: int) -> None:
        self._content = content
        self._max = max_object_bytes
        self._buf = bytearray()
        self._eof = False
        self.count = 0  # objects returned so far

    @property
    def eof(self) -> bool:
        return self._eof and not self._buf.strip(_WS)

    async def next_object(self) -> Any:
        """The next object (a dict), or ``None`` at the end of the body."""
        buf = self._buf
        scanned = 0  # bytes of buf already scanned for the current object
        depth = 0
        in_string = escape = False
        while True:
            # Skip whitespace between objects.
            if depth == 0 and scanned == 0:
                start = 0
                while start < len(buf) and buf[start] in _WS:
                    start += 1
                if start:
                    del buf[:start]
                if buf and buf[0] != 0x7B:  # "{"
                    raise self._not_an_object(buf[0])
            end = -1
            i = scanned
            n = len(buf)
            while i < n:
                c = buf[i]
                if in_string:
                    if escape:
                        escape = False
                    elif c == 0x5C:  # backslash
                        escape = True
                    elif c == 0x22:  # quote
                        in_string = False
                elif c == 0x22:
                    in_string = True
                elif c == 0x7B or c == 0x5B:  # { [
                    depth += 1
                elif c == 0x7D or c == 0x5D:  # } ]
                    depth -= 1
                    if depth == 0:
                        end = i + 1
                        break
                i += 1
            scanned = i
            if end > 0:
                raw = bytes(buf[:end])
                del buf[:end]
                self.count += 1
                return self._parse(raw)
            if len(buf) > self._max:
                raise HTTPStatusError(GrpcCode.INVALID_ARGUMENT, MSG_TOO_LARGE, 413)
            if self._eof:
                if buf.strip(_WS):
                    raise _invalid(f"invalid JSON body: request {self.count + 1} is cut short")
                return None
            chunk = await self._content.readany()
            if not chunk:
                self._eof = True
            else:
                buf += chunk

    def _not_an_object(self, first: int) -> ServiceError:
        kinds = {0x5B: "array", 0x22: "string", 0x74: "boolean", 0x66: "boolean", 0x6E: "null"}
        kind = kinds.get(first, "number" if chr(first) in "-0123456789" else "")
        where = f"request {self.count + 1}"
        if kind:
            return _invalid(f"invalid JSON body: {where}: expected a JSON object, got {kind}")
        return _invalid(f"invalid JSON body: {where}: unexpected character {chr(first)!r}")

    def _parse(self, raw: bytes) -> Any:
        try:
            return json.loads(raw)
        except RecursionError:
            raise _invalid("invalid JSON body: nested too deeply") from None
        except ValueError as exc:
            raise _invalid(f"invalid JSON body: request {self.count}: {exc}") from None


_FILTERS = {"NOPUT": WatchFilter.NOPUT, "NODELETE": WatchFilter.NODELETE}
_CREATE_FIELDS = {  # proto name -> kind
    "key": "bytes",
    "range_end": "bytes",
    "start_revision": "int",
    "progress_notify": "bool",
    "filters": "filters",
    "prev_kv": "bool",
    "watch_id": "int",
    "fragment": "bool",
}
_CREATE_NAMES = {
    **{name: name for name in _CREATE_FIELDS},
    **{gateway_json._lower_camel(name): name for name in _CREATE_FIELDS},
}
_REQUEST_NAMES = {
    "create_request": "create",
    "createRequest": "create",
    "cancel_request": "cancel",
    "cancelRequest": "cancel",
    "progress_request": "progress",
    "progressRequest": "progress",
}


def _filters(raw: Any, path: str) -> tuple[WatchFilter, ...]:
    if type(raw) is not list:
        raise _invalid(f'field "{path}": expected a JSON array, got {gateway_json._json_type(raw)}')
    out: list[WatchFilter] = []
    for i, item in enumerate(raw):
        if type(item) is str:
            f = _FILTERS.get(item)
            if f is None:
                raise _invalid(
                    f'field "{path}[{i}]": unknown value {gateway_json._show(item)} for enum '
                    "FilterType (one of NOPUT, NODELETE, or its number)"
                )
        elif type(item) is int:
            try:
                f = WatchFilter(item)
            except ValueError:
                continue  # etcd ignores filter numbers it does not know
        else:
            raise _invalid(
                f'field "{path}[{i}]": expected an enum name or number, got {gateway_json._show(item)}'
            )
        if f not in out:
            out.append(f)
    return tuple(out)


def _decode_create(obj: Any, path: str) -> WatchCreateRequest:
    if type(obj) is not dict:
        raise _invalid(
            f'field "{path}": expected a JSON object, got {gateway_json._json_type(obj)}'
        )
    kwargs: dict[str, Any] = {}
    for name, raw in obj.items():
        attr = _CREATE_NAMES.get(name)
        if attr is None or raw is None:
            continue  # unknown field (ignored, as etcd) or null (= default)
        kind = _CREATE_FIELDS[attr]
        where = f"{path}.{name}"
        if kind == "bytes":
            kwargs[attr] = gateway_json._bytes(raw, where)
        elif kind == "int":
            kwargs[attr] = gateway_json._int64(raw, where)
        elif kind == "bool":
            if raw is not True and raw is not False:
                raise _invalid(
                    f'field "{where}": expected true or false, got {gateway_json._show(raw)}'
                )
            kwargs[attr] = raw
        else:
            kwargs[attr] = _filters(raw, where)
    return WatchCreateRequest(**kwargs)


def _decode_watch_id(obj: Any, path: str) -> int:
    if type(obj) is not dict:
        raise _invalid(
            f'field "{path}": expected a JSON object, got {gateway_json._json_type(obj)}'
        )
    watch_id = 0
    for name in ("watch_id", "watchId"):
        raw = obj.get(name)
        if raw is not None:
            watch_id = gateway_json._int64(raw, f"{path}.{name}")
    return watch_id


def decode_watch_request(obj: Any) -> tuple[str, Any] | None:
    """One ``WatchRequest`` object -> ``("create", WatchCreateRequest)``, ``("cancel",
    watch_id)``, ``("progress", None)``, or ``None`` for an object that asks nothing."""
    if type(obj) is not dict:
        raise _invalid(f"body: expected a JSON object, got {gateway_json._json_type(obj)}")
    found: list[tuple[str, str, Any]] = [
        (_REQUEST_NAMES[name], name, raw)
        for name, raw in obj.items()
        if name in _REQUEST_NAMES and raw is not None
    ]
    if not found:
        return None
    if len(found) > 1:
        raise _invalid(
            "a watch request must set only one of create_request, cancel_request, progress_request"
        )
    kind, name, raw = found[0]
    if kind == "create":
        return kind, _decode_create(raw, name)
    if kind == "cancel":
        return kind, _decode_watch_id(raw, name)
    if type(raw) is not dict:
        raise _invalid(
            f'field "{name}": expected a JSON object, got {gateway_json._json_type(raw)}'
        )
    return kind, None


def _apply_request(
    stream: WatchStream, request: tuple[str, Any] | None, session: _Session | None = None
) -> None:
    if request is None:
        return
    kind, arg = request
    if kind == "create":
        if session is not None and not session.may_watch(arg.key, arg.range_end):
            # etcd: created + canceled, watch id -1, reason "permission denied".
            stream.refuse_create(auth_api.MSG_PERMISSION_DENIED)
            return
        stream.create(arg)
    elif kind == "cancel":
        stream.cancel(arg)
    else:
        stream.request_progress()


# ---------------------------------------------------------------------------------------------
# Responses


def event_json(ev: Event) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if ev.type is EventType.DELETE:
        out["type"] = "DELETE"
    out["kv"] = gateway_json.key_value(ev.kv)
    if ev.prev_kv is not None:
        out["prev_kv"] = gateway_json.key_value(ev.prev_kv)
    return out


def watch_response_fields(resp: WatchResponse) -> dict[str, Any]:
    """Every field but the header, etcd's order, defaults omitted."""
    out: dict[str, Any] = {}
    if resp.watch_id:
        out["watch_id"] = str(resp.watch_id)
    if resp.created:
        out["created"] = True
    if resp.canceled:
        out["canceled"] = True
    if resp.compact_revision:
        out["compact_revision"] = str(resp.compact_revision)
    if resp.cancel_reason:
        out["cancel_reason"] = resp.cancel_reason
    if resp.fragment:
        out["fragment"] = True
    if resp.events:
        out["events"] = [event_json(ev) for ev in resp.events]
    return out


# A PUT event without prev_kv whose KeyValue is the usual one (gateway_json's).
_PUT_EVENT_BYTES = b'{"kv":' + gateway_json.KV_BYTES + b"}"
_KV_OF = attrgetter("kv")
_PREV_KV = attrgetter("prev_kv")
_TYPE = attrgetter("type")


def events_json(events: Sequence[Event]) -> bytes:
    """``dumps([event_json(ev) for ev in events])[1:-1]`` as ASCII bytes; column by column
    when every event is a PUT without prev_kv of a usual KeyValue (what a load sends every
    watcher: a dozen Python operations per event less)."""
    if not any(map(_PREV_KV, events)) and EventType.DELETE not in map(_TYPE, events):
        usual = gateway_json.usual_key_values_json(list(map(_KV_OF, events)), _PUT_EVENT_BYTES)
        if usual is not None:
            return usual
    return dumps([event_json(ev) for ev in events])[1:-1].encode("ascii")


def _header_json(resp: WatchResponse, cluster_id: int, member_id: int, raft_term: int) -> str:
    return gateway_json.header_json(
        ResponseHeader(cluster_id, member_id, resp.header.revision, raft_term)
    )


def _head_to_events(resp: WatchResponse, header: str) -> bytes:
    """The line up to and including ``"events":[`` (``events`` is the last field)."""
    fields = watch_response_fields(replace(resp, events=()))
    rest = dumps(fields)[1:-1] + "," if fields else ""
    return ('{"result":{"header":' + header + "," + rest + '"events":[').encode("ascii")


def encode_watch_line(
    resp: WatchResponse, cluster_id: int, member_id: int, raft_term: int
) -> bytes:
    """``{"result": <WatchResponse>}`` and a newline, the header completed."""
    header = _header_json(resp, cluster_id, member_id, raft_term)
    if resp.events:  # made apart: the usual events are written column by column
        return _head_to_events(resp, header) + events_json(resp.events) + b"]}}\n"
    fields = watch_response_fields(resp)
    text = '{"result":{"header":' + header + ("," + dumps(fields)[1:] if fields else "}")
    return (text + "}\n").encode("ascii")


def encode_line_pieces(
    resp: WatchResponse,
    cluster_id: int,
    member_id: int,
    raft_term: int,
    step: int = ENCODE_STEP_EVENTS,
) -> Iterator[bytes]:
    """``encode_watch_line`` in pieces of at most ``step`` events each: their concatenation
    is the same line (``events`` is the last field). A consumer that yields to the loop
    between pieces never holds it for more than one piece's encoding."""
    events = resp.events
    if len(events) <= step:
        yield encode_watch_line(resp, cluster_id, member_id, raft_term)
        return
    yield _head_to_events(resp, _header_json(resp, cluster_id, member_id, raft_term))
    for start in range(0, len(events), step):
        piece = events_json(events[start : start + step])
        yield piece if start == 0 else b"," + piece
    yield b"]}}\n"


def error_line(code: int, message: str, http_status: int) -> bytes:
    return (
        dumps(
            {
                "error": {
                    "grpc_code": code,
                    "http_code": http_status,
                    "message": message,
                    "http_status": HTTPStatus(http_status).phrase,
                }
            }
        ).encode()
        + b"\n"
    )


# ---------------------------------------------------------------------------------------------
# The handler


async def _read_requests(reader: _ObjectReader, session: _Session) -> None:
    """Feed later request objects to the stream, then tell it the input has ended."""
    stream = session.stream
    try:
        while not reader.eof:
            obj = await reader.next_object()
            if obj is None:
                break
            _apply_request(stream, decode_watch_request(obj), session)
    except (ConnectionError, asyncio.IncompleteReadError):
        stream.close()  # the client went away mid-body
        return
    except Exception as exc:
        parts = error_parts(exc)
        if parts is None:
            log.exception("watch: reading a request failed")
            parts = (int(GrpcCode.INTERNAL), "raftkv: internal error", 500)
        session.fail(*parts)
        return
    stream.close_input()


async def _write_big(
    response: web.StreamResponse,
    stream: WatchStream,
    resp: WatchResponse,
    cluster_id: int,
    member_id: int,
    term: int,
) -> None:
    """A huge response's line, written as it is encoded, a slice of events per loop turn;
    then its events go back to the hub to be dropped a slice at a time."""
    try:
        for piece in encode_line_pieces(resp, cluster_id, member_id, term):
            await response.write(piece)
            await asyncio.sleep(0)  # the write may not have yielded: it had room
    finally:
        stream.release(resp)


async def _write_responses(response: web.StreamResponse, session: _Session, service: Any) -> None:
    stream = session.stream
    cluster_id, member_id = service.cluster_id, service.member_id
    async for first in stream:
        term = service.raft_term
        resp: WatchResponse | None = first
        del first
        while resp is not None:
            if len(resp.events) > ENCODE_STEP_EVENTS:
                await _write_big(response, stream, resp, cluster_id, member_id, term)
                resp = None
                break
            lines = [encode_watch_line(resp, cluster_id, member_id, term)]
            size = len(lines[0])
            resp = None
            while size < MAX_WRITE_BATCH_BYTES:  # whatever else is ready goes in the same chunk
                more = stream.poll()
                if more is None:
                    break
                if len(more.events) > ENCODE_STEP_EVENTS:
                    resp = more  # after this chunk, in pieces
                    break
                lines.append(encode_watch_line(more, cluster_id, member_id, term))
                size += len(lines[-1])
            more = None
            await response.write(b"".join(lines))


async def watch(request: web.Request) -> web.StreamResponse:
    service = request.app[SERVICE_KEY]
    reader = _ObjectReader(request.content, request.app[LIMITS_KEY].max_body_bytes)
    # The first request decides between an error response and a stream (as the gateway).
    try:
        first = await reader.next_object()
    except (ConnectionError, asyncio.IncompleteReadError):
        return web.Response(status=400)  # the client went away before asking anything
    first_request = None if first is None else decode_watch_request(first)
    # A restarted member replaying its log would report those old events as new ones.
    await service.wait_recovered()
    session = _Session(request, service.watch_stream())
    stream = session.stream
    sessions = request.app[SESSIONS_KEY]
    sessions.add(session)
    reader_task: asyncio.Task | None = None
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.enable_chunked_encoding()
    unsubscribe = session.auth.on_change(session.recheck) if session.user is not None else None
    try:
        _apply_request(stream, first_request, session)
        await response.prepare(request)
        reader_task = asyncio.get_running_loop().create_task(_read_requests(reader, session))
        try:
            await _write_responses(response, session, service)
            if session.error is not None:
                await response.write(error_line(*session.error))
            await response.write_eof()
        except ConnectionError:
            pass  # the client went away; its watchers go in the finally below
    except Exception:
        # Never an error response once the stream has started: log, end the stream.
        log.exception("watch: serving a stream failed")
    finally:
        sessions.discard(session)
        if unsubscribe is not None:
            unsubscribe()
        stream.close()  # every watcher of this stream leaves the hub
        if reader_task is not None:
            reader_task.cancel()
            await asyncio.gather(reader_task, return_exceptions=True)
    return response
