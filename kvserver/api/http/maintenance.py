"""``POST /v3/maintenance/snapshot``: stream a consistent copy of this member's state.

etcd's gateway shape: a chunked response of one ``{"result": {...}}`` JSON object per line,
each ``{"header", "remaining_bytes", "blob"}`` with ``blob`` base64; concatenating the
decoded blobs gives the snapshot file, whose last 32 bytes are the SHA-256 of everything
before them (etcd sends its hash the same way). Two files, chosen by the request body's
``"format"``:

* ``"etcd"`` (the default, what etcd's gateway sends): etcd's bolt database
  (``capture_etcd``: ``kvserver.etcdsnap``), which ``etcdctl snapshot status|restore`` and
  ``raftkv snapshot restore`` read. ``remaining_bytes`` is exact.
* ``"raftkv"`` (``raftkv snapshot save`` asks for it): raftkv's own file
  (``kvserver.archive.snapfile``: header, state image, SHA-256), streamed as it is produced.

Consistency: the raised alarms, the auth state (users, roles, permissions, enabled; never
tokens), the lease table, the MVCC view (``MVCCStore.capture``), the applied index and
the revision are all taken in one synchronous step on the event loop, which is where the
raft task applies entries, so they describe one applied index. The store keeps applying
while the chunks are serialized and sent (the view is immutable), and the response is
produced as it is sent, never built whole, one chunk of the store's stream per loop turn
(``MVCCStore.serialize`` bounds the work of a chunk, and so of a turn). ``remaining_bytes`` is an estimate (from the
store's size) until the last line, which says 0; a client that wants the truth checks the
hash, which ``raftkv snapshot save`` does.

The bolt file is built from the same captured state: the image is spilled to a file (a
chunk of the store per loop turn, ``snap.spill``), then converted by a child process
(``kvserver.etcdsnap.convert``), so the member's event loop never runs the conversion.

A failure after the stream started ends it with one ``{"error": {...}}`` line (the file a
client has then lacks its hash and is refused). An unknown ``format`` is refused with
InvalidArgument before anything is captured.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Iterator
from typing import Any

from aiohttp import web

from kvserver.api.http import gateway_json
from kvserver.api.http.common import SERVICE_KEY, SNAPSHOT_GATE_KEY
from kvserver.api.shared.snapshot_capture import (
    LINE_BLOB_BYTES,
    bolt_pieces,
    capture,
    capture_etcd,
)
from kvserver.archive import snapfile
from kvserver.kvpb.kv import ResponseHeader
from kvserver.kvpb.service_errors import GrpcCode, ServiceError

log = logging.getLogger(__name__)

FORMATS = ("etcd", "raftkv")


async def _format(request: web.Request) -> str:
    raw = await request.read()
    try:
        body = json.loads(raw or b"{}")
    except ValueError:
        body = None
    fmt = body.get("format", "etcd") if isinstance(body, dict) else None
    if fmt not in FORMATS:
        raise ServiceError(
            GrpcCode.INVALID_ARGUMENT, f"raftkv: snapshot format must be one of {FORMATS}"
        )
    return str(fmt)


def _line(header: ResponseHeader, remaining: int, blob: bytes) -> bytes:
    result = {"header": gateway_json.header(header), "blob": base64.b64encode(blob).decode("ascii")}
    if remaining:
        result["remaining_bytes"] = str(remaining)
    return (json.dumps({"result": result}, separators=(",", ":")) + "\n").encode("ascii")


async def snapshot(request: web.Request) -> web.StreamResponse:
    fmt = await _format(request)
    async with request.app[SNAPSHOT_GATE_KEY].stream():
        return await _snapshot(request, fmt)


async def _snapshot(request: web.Request, fmt: str) -> web.StreamResponse:
    service = request.app[SERVICE_KEY]
    if fmt == "etcd":
        file_header, db = await capture_etcd(service)
        pieces = bolt_pieces(db, LINE_BLOB_BYTES)
        try:
            return await _send(request, service, file_header, pieces, len(db) + 32)
        finally:
            pieces.close()
    file_header, image = capture(service)
    pieces = snapfile.encode(file_header, image)
    try:
        return await _send(request, service, file_header, pieces)
    finally:
        pieces.close()
        image.close()  # the store's stream: while it is open the store cuts no old versions


async def _send(
    request: web.Request,
    service: Any,
    file_header: dict[str, Any],
    pieces: Iterator[bytes],
    exact_size: int = 0,
) -> web.StreamResponse:
    """Stream ``pieces``; ``remaining_bytes`` is exact when ``exact_size`` is given, else an
    estimate from the store's size."""
    resp_header = ResponseHeader(
        service.cluster_id, service.member_id, file_header["revision"], file_header["raft_term"]
    )
    estimate = exact_size or max(
        1, int(getattr(getattr(service, "store", None), "db_size_bytes", 0))
    )
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.enable_chunked_encoding()
    await response.prepare(request)
    sent = 0
    pending = bytearray()
    try:
        for piece in pieces:
            pending += piece
            if len(pending) >= LINE_BLOB_BYTES:
                sent += len(pending)
                await response.write(_line(resp_header, max(1, estimate - sent), bytes(pending)))
                pending.clear()
            # A loop turn per piece, empty ones too: each is a bounded step of the store's
            # stream, and a stretch of keys that writes nothing must not run in one turn.
            await asyncio.sleep(0)
        await response.write(_line(resp_header, 0, bytes(pending)))
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    except Exception as exc:
        log.exception("snapshot stream failed")
        err = {
            "error": {
                "grpc_code": int(GrpcCode.INTERNAL),
                "http_code": 500,
                "message": f"raftkv: snapshot failed: {exc}",
                "http_status": "Internal Server Error",
            }
        }
        await response.write((json.dumps(err) + "\n").encode())
    await response.write_eof()
    return response


ROUTES = (("/maintenance/snapshot", snapshot),)
