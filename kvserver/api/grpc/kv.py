"""etcd's KV service over gRPC (``etcdserverpb.KV``: Range, Put, DeleteRange, Txn, Compact).

Each call is decode (by gRPC) -> convert -> check -> one ``KVService`` call -> convert, in the
same order as the JSON gateway: etcd's stateless checks (``validate_request``; bad input never
reaches the log), the request size against ``--max-request-bytes`` (``etcdserver: request is
too large``), the caller's key permissions with auth enabled, then the service. Errors carry
etcd's status codes and texts (``Calls.run``).

A range answer of more than ``ENCODE_IN_THREAD_KVS`` keys is converted and serialized in a
worker thread, ``ENCODE_STEP_KVS`` keys per protobuf call, so that no single call holds the
interpreter (and the event loop) for long; the handler then returns the serialized bytes,
which the response serializer (``rpc.serialize``) passes through unchanged. Repeated fields of a protobuf message may be
written in several pieces, so the pieces concatenate into one valid ``RangeResponse``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kvserver.api.shared.request_size import request_size_bytes
from kvserver.etcdpb import rpc_pb2
from kvserver.kvpb import kv as K
from kvserver.kvpb.service_errors import request_too_large
from kvserver.mvcc.validate import validate_request
from kvserver.server.service import KVService

from . import convert
from .calls import Calls, service_handler
from .rpc import Method, RpcContext

ENCODE_IN_THREAD_KVS = 10_000
ENCODE_STEP_KVS = 2_048


def encode_range_in_steps(r: K.RangeResponse, step: int = ENCODE_STEP_KVS) -> bytes:
    """A ``RangeResponse`` serialized in pieces of ``step`` kvs (for a worker thread)."""
    # In field-number order, as one message would be written: header, kvs, more, count.
    parts = [rpc_pb2.RangeResponse(header=convert.header_to_pb(r.header)).SerializeToString()]
    kvs = r.kvs
    for start in range(0, len(kvs), step):
        part = rpc_pb2.RangeResponse(kvs=convert.kvs_to_pb(kvs[start : start + step]))
        parts.append(part.SerializeToString())
    parts.append(rpc_pb2.RangeResponse(more=r.more, count=r.count).SerializeToString())
    return b"".join(parts)


class KVServicer:
    def __init__(self, service: KVService, calls: Calls):
        self.service = service
        self.calls = calls

    def _checked(self, context: RpcContext, req: Any) -> Any:
        validate_request(req)
        if request_size_bytes(req) > self.calls.max_request_bytes:
            raise request_too_large()
        user = self.calls.user(context)
        auth = self.calls.auth
        if user is not None and auth is not None:
            auth.check_request(user, req)
        return req

    async def _range(self, request: rpc_pb2.RangeRequest, context: RpcContext) -> Any:
        req = self._checked(context, convert.range_from_pb(request))
        resp = await self.service.range(req)
        if len(resp.kvs) > ENCODE_IN_THREAD_KVS:
            return await asyncio.to_thread(encode_range_in_steps, resp)
        return convert.range_to_pb(resp)

    async def _put(self, request: rpc_pb2.PutRequest, context: RpcContext) -> Any:
        req = self._checked(context, convert.put_from_pb(request))
        return convert.put_to_pb(await self.service.put(req))

    async def _delete(self, request: rpc_pb2.DeleteRangeRequest, context: RpcContext) -> Any:
        req = self._checked(context, convert.delete_from_pb(request))
        return convert.delete_to_pb(await self.service.delete_range(req))

    async def _txn(self, request: rpc_pb2.TxnRequest, context: RpcContext) -> Any:
        req = self._checked(context, convert.txn_from_pb(request))
        return convert.txn_to_pb(await self.service.txn(req))

    async def _compact(self, request: rpc_pb2.CompactionRequest, context: RpcContext) -> Any:
        req = self._checked(context, convert.compaction_from_pb(request))
        return convert.compaction_to_pb(await self.service.compact(req))

    def methods(self) -> dict[str, Method]:
        u = self.calls.unary
        return service_handler(
            "etcdserverpb.KV",
            {
                "Range": (u(self._range), rpc_pb2.RangeRequest),
                "Put": (u(self._put), rpc_pb2.PutRequest),
                "DeleteRange": (u(self._delete), rpc_pb2.DeleteRangeRequest),
                "Txn": (u(self._txn), rpc_pb2.TxnRequest),
                "Compact": (u(self._compact), rpc_pb2.CompactionRequest),
            },
        )
