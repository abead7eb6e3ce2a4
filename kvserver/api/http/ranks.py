"""``POST /v1/ranks``: the keys at given ranks of a range, for planning parallel reads.

A raftkv extension (etcd has no such call). A reader that splits a range into N parts of
equal key counts asks for the keys at ranks ``count * i / N`` instead of reading every key::

    POST /v1/ranks  {"key": b64, "range_end": b64, "ranks": ["0", "250000", ...],
                     "revision": "0", "serializable": false}
    200 {"header": {...}, "count": "1000000", "keys": [b64 | null, ...], "exact": true}

``key``/``range_end`` follow etcd's range convention (``range_end`` absent: just ``key``;
``"AA=="`` (``\\0``): every key >= ``key``). ``keys[i]`` is the live key at 0-based position
``ranks[i]`` of the range in key order, ``null`` when ``ranks[i] >= count``; ``count`` is the
number of live keys in the range. At most ``MAX_RANKS`` ranks per call, each non-negative.

Cost: O(log N) per rank, from the store's order-statistics index of the live keys at its
current revision; no key outside the answer is visited. The read is linearizable (a read
barrier, as a range's) unless ``serializable``.

Revisions. The index describes the current revision only. ``revision`` 0 (or the current
one) answers exactly there, ``"exact": true``. A ``revision`` below the compact revision is
refused as a range is (``etcdserver: mvcc: required revision has been compacted``), one above
the current revision too (``... is a future revision``). A revision in between is answered
**at the current revision**, ``"exact": false``, and ``header.revision`` says which one: an
exact answer there would walk every key of the range, and split points do not need to be
exact — any keys cut a range into disjoint parts whose union is the range; only the balance
of the parts depends on them.

Auth: with auth enabled, as every ``/v1`` path but ``/v1/status``, it needs root; the
read permission on the range is checked as well.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from kvserver.kvpb.errors import CompactedError, FutureRevisionError
from kvserver.kvpb.kv import RangeRequest, ResponseHeader
from kvserver.kvpb.service_errors import GrpcCode, ServiceError

from . import auth, gateway_json
from .common import LIMITS_KEY, SERVICE_KEY, dumps, json_response, read_body

PATH = "/v1/ranks"
MAX_RANKS = 4096
_FIELDS = ("key", "range_end", "ranks", "revision", "serializable")


def _invalid(message: str) -> ServiceError:
    return ServiceError(GrpcCode.INVALID_ARGUMENT, "raftkv: " + message)


def decode(body: bytes) -> tuple[bytes, bytes, list[int], int, bool]:
    """(key, range_end, ranks, revision, serializable) of a request body."""
    obj = gateway_json.parse_json(body)
    if type(obj) is not dict:
        raise _invalid("body: expected a JSON object")
    unknown = [k for k in obj if k not in _FIELDS]
    if unknown:
        raise _invalid(f"body: unknown field {unknown[0][:40]!r}")
    key = gateway_json._bytes(obj.get("key", ""), "key")
    if not key:
        raise _invalid("key is not provided")
    range_end = gateway_json._bytes(obj.get("range_end", ""), "range_end")
    raw_ranks = obj.get("ranks", [])
    if type(raw_ranks) is not list:
        raise _invalid('field "ranks": expected a list')
    if len(raw_ranks) > MAX_RANKS:
        raise _invalid(f'field "ranks": {len(raw_ranks)} ranks, at most {MAX_RANKS} per call')
    ranks = [gateway_json._int64(r, f"ranks[{i}]") for i, r in enumerate(raw_ranks)]
    if any(r < 0 for r in ranks):
        raise _invalid('field "ranks": a rank is negative')
    revision = gateway_json._int64(obj.get("revision", 0), "revision")
    serializable = obj.get("serializable", False)
    if type(serializable) is not bool:
        raise _invalid('field "serializable": expected true or false')
    return key, range_end, ranks, revision, serializable


async def key_ranks(request: web.Request) -> web.Response:
    body = await read_body(request, request.app[LIMITS_KEY].max_body_bytes)
    key, range_end, ranks, revision, serializable = decode(body)
    auth.check_request(request, RangeRequest(key=key, range_end=range_end))
    service = request.app[SERVICE_KEY]
    store: Any = getattr(service, "store", None)
    if store is None:
        raise ServiceError(GrpcCode.UNIMPLEMENTED, "raftkv: this member cannot rank keys")
    # The barrier: a one-key range at the current revision (O(log N)), linearizable unless
    # serializable. Its answer's header is this member's, at least as new as the request.
    head = await service.range(
        RangeRequest(
            key=key, range_end=range_end, limit=1, keys_only=True, serializable=serializable
        )
    )
    # No await from here on: the store does not change while the answer is computed.
    current = store.revision
    if revision > current:
        raise FutureRevisionError()
    if 0 < revision < store.compact_revision:
        raise CompactedError(compact_revision=store.compact_revision)
    count, keys = store.key_ranks(key, range_end, ranks)
    h = head.header
    header = ResponseHeader(h.cluster_id, h.member_id, current, h.raft_term)
    fields = {
        "header": gateway_json.header(header),
        "count": str(count),
        "keys": [None if k is None else gateway_json.b64(k) for k in keys],
        "exact": revision in (0, current),
    }
    return json_response(dumps(fields).encode("ascii"))
