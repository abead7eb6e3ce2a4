"""The size of a request as the request limit (``--max-request-bytes``) counts it."""

from __future__ import annotations

from kvserver.kvpb.kv import DeleteRangeRequest, PutRequest, RangeRequest, TxnRequest

_MESSAGE_OVERHEAD_BYTES = 16  # tags, lengths and small integers of one request message


def request_size_bytes(req: object) -> int:
    """Approximate encoded size of a request (the figure compared with max_request_bytes)."""
    kind = type(req)
    if kind is PutRequest:
        return len(req.key) + len(req.value) + _MESSAGE_OVERHEAD_BYTES  # type: ignore[attr-defined]
    if kind is RangeRequest or kind is DeleteRangeRequest:
        keys = len(req.key) + len(req.range_end)  # type: ignore[attr-defined]
        return keys + _MESSAGE_OVERHEAD_BYTES
    if kind is TxnRequest:
        size = _MESSAGE_OVERHEAD_BYTES
        for c in req.compare:  # type: ignore[attr-defined]
            size += len(c.key) + len(c.value) + len(c.range_end) + _MESSAGE_OVERHEAD_BYTES
        for op in req.success + req.failure:  # type: ignore[attr-defined]
            inner = op.request_put or op.request_range or op.request_delete_range or op.request_txn
            size += request_size_bytes(inner) if inner is not None else 2
        return size
    return _MESSAGE_OVERHEAD_BYTES
