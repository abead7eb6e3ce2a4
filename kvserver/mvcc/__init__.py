"""kvserver.mvcc: the MVCC key-value store, raftkv's replicated state machine.

A pure, deterministic implementation of etcd's mvcc data model (revisions, per-key history
with generations, compaction, range/put/delete-range/txn, request-id deduplication, lease
hooks, watch replay, chunked snapshots). No I/O, asyncio or raft in here: the node driver
calls ``MVCCStore.apply`` with committed entries and the HTTP layer maps etcd's JSON onto the
request types.

Modules: ``types`` (requests/responses/KeyValue/Event, ``prefix_range_end``), ``errors``
(etcd's texts and gRPC codes), ``validate`` (etcd's request checks), ``store`` (the state
machine), ``dedup`` (request-id table), ``codec`` (msgpack log entries), ``snapshot``
(chunked snapshot stream).
"""

from kvserver.kvpb.errors import (
    CodecError,
    CompactedError,
    EtcdError,
    FutureRevisionError,
    GrpcCode,
    InvalidArgumentError,
    KeyNotFoundError,
    LeaseNotFoundError,
    SnapshotFormatError,
)
from kvserver.kvpb.kv import (
    ApplyResult,
    CompactionRequest,
    CompactionResponse,
    Compare,
    CompareResult,
    CompareTarget,
    DeleteRangeRequest,
    DeleteRangeResponse,
    Event,
    EventType,
    KeyValue,
    PutRequest,
    PutResponse,
    RangeRequest,
    RangeResponse,
    RequestOp,
    ResponseHeader,
    ResponseOp,
    SortOrder,
    SortTarget,
    TxnRequest,
    TxnResponse,
    key_in_range,
    prefix_range_end,
)
from kvserver.mvcc.codec import decode, decode_entry, encode, encode_entry
from kvserver.mvcc.dedup import DedupTable
from kvserver.mvcc.snapshot import SnapshotLoader
from kvserver.mvcc.store import MVCCStore
from kvserver.mvcc.validate import validate_request

__all__ = [
    "ApplyResult",
    "CodecError",
    "CompactedError",
    "CompactionRequest",
    "CompactionResponse",
    "Compare",
    "CompareResult",
    "CompareTarget",
    "DedupTable",
    "DeleteRangeRequest",
    "DeleteRangeResponse",
    "EtcdError",
    "Event",
    "EventType",
    "FutureRevisionError",
    "GrpcCode",
    "InvalidArgumentError",
    "KeyNotFoundError",
    "KeyValue",
    "LeaseNotFoundError",
    "MVCCStore",
    "PutRequest",
    "PutResponse",
    "RangeRequest",
    "RangeResponse",
    "RequestOp",
    "ResponseHeader",
    "ResponseOp",
    "SnapshotFormatError",
    "SnapshotLoader",
    "SortOrder",
    "SortTarget",
    "TxnRequest",
    "TxnResponse",
    "decode",
    "decode_entry",
    "encode",
    "encode_entry",
    "key_in_range",
    "prefix_range_end",
    "validate_request",
]
