"""The register workload's two requests over etcd's gRPC API, in ``kvhttp``'s shapes.

``put`` and ``get`` take a member's client URL (the same URL serves both dialects) and return
``(status, body)`` as ``kvhttp`` does: 200 and the answer as the gateway's JSON (protobuf's
JSON mapping: int64 as strings, bytes base64), or the gRPC status code and etcd's error
shape. No answer (Unavailable without etcd's text, a deadline, a reset) raises
``kvhttp.NoAnswer``: the write may still take effect. One channel per URL, shared by the
workload's threads (grpc channels are thread-safe and reconnect by themselves).
"""

from __future__ import annotations

import threading

import grpc
from google.protobuf import json_format

from kvserver.etcdpb import rpc_pb2, rpc_pb2_grpc
from tests.chaos.kvhttp import NoAnswer

_channels: dict[str, grpc.Channel] = {}
_lock = threading.Lock()


def _kv(url: str) -> rpc_pb2_grpc.KVStub:
    with _lock:
        channel = _channels.get(url)
        if channel is None:
            channel = _channels[url] = grpc.insecure_channel(url.removeprefix("http://"))
    return rpc_pb2_grpc.KVStub(channel)


def close_all() -> None:
    with _lock:
        for channel in _channels.values():
            channel.close()
        _channels.clear()


def _call(what: str, url: str, method, request, timeout_s: float) -> tuple[int, dict]:  # noqa: ANN001
    try:
        answer = method(request, timeout=timeout_s)
    except grpc.RpcError as err:
        code, details = err.code(), err.details() or ""  # type: ignore[attr-defined]
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) or (
            code is grpc.StatusCode.CANCELLED
        ):
            raise NoAnswer(f"{what} via {url}: {code.name}: {details}") from None
        return code.value[0], {"error": details, "code": code.value[0]}
    return 200, json_format.MessageToDict(answer, preserving_proto_field_name=True)


def put(url: str, key: str, value: str, timeout_s: float) -> tuple[int, dict]:
    request = rpc_pb2.PutRequest(key=key.encode(), value=value.encode())
    return _call("put", url, _kv(url).Put, request, timeout_s)


def get(url: str, key: str, timeout_s: float) -> tuple[int, dict]:
    return _call("range", url, _kv(url).Range, rpc_pb2.RangeRequest(key=key.encode()), timeout_s)
