"""raftkv client library: asyncio ``AsyncClient`` and blocking ``Client``.

They speak etcd's v3 JSON gateway dialect, so they work against raftkv and against etcd.
Both take a list of endpoints and find the leader, fail over between nodes, retry what is
safe to retry (writes carry a client id and a request id, the same on every retry, so raftkv
applies them once), bound every call by a deadline, return typed results and raise typed
errors::

    from kvserver.client import Client, Cmp, Op, Txn

    with Client(["http://127.0.0.1:2379", "http://127.0.0.1:22379"]) as kv:
        kv.put("jobs/1", "running")
        kv.get("jobs/1").value                          # b"running"
        kv.range("jobs/", prefix=True).kvs              # (KeyValue(...), ...)
        kv.txn(Txn().when(Cmp.version("lock") == 0).then(Op.put("lock", "me")))
        lease = kv.lease_grant(10)                      # Lease(id, ttl_s)
        with kv.keep_alive(lease.id):                   # refreshed every ~TTL/3 meanwhile
            kv.put("workers/me", "alive", lease=lease.id)
        for event in kv.watch("jobs/", prefix=True):    # blocks; reconnects and resumes
            print(event.type.name, event.key, event.value)

Modules: ``aio`` (the asyncio client's calls), ``retry`` (endpoints, leader discovery,
failover, backoff, deadlines and re-authentication, for every call and every watch),
``transport`` (one HTTP attempt and the connection pool), ``sync`` (the blocking wrapper),
``txn`` (the txn builder), ``types`` (results), ``errors`` (failures), ``codec`` (the JSON),
``watch`` (watch iterators), ``columnar`` (range answers as Arrow columns, keys by rank;
pyarrow and numpy loaded on first use), ``leases`` (lease calls and keep-alive), ``members`` (member
calls), ``alarms`` (alarm list and disarm). The client imports only ``kvserver.kvpb`` (the wire types) and ``kvserver.tls`` of
the rest of raftkv, so importing it loads no server code.
"""

from kvserver.client.aio import DEFAULT_ENDPOINT, AsyncClient
from kvserver.client.errors import (
    Attempt,
    ClientError,
    CompactedError,
    ConnectionFailedError,
    FailedPreconditionError,
    FutureRevisionError,
    InvalidArgumentError,
    LeaderChangedError,
    LeaseExistsError,
    LeaseNotFoundError,
    NoLeaderError,
    NoSpaceError,
    NotFoundError,
    OutOfRangeError,
    RequestTimeoutError,
    ResponseFormatError,
    UnavailableError,
    UnimplementedError,
)
from kvserver.client.leases import KeepAlive, SyncKeepAlive
from kvserver.client.retry import normalize_endpoints
from kvserver.client.sync import Client
from kvserver.client.txn import Cmp, Op, Txn
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
    ResponseHeader,
    Status,
    TxnResult,
)
from kvserver.client.watch import (
    AsyncWatch,
    SyncWatch,
    WatchCanceledError,
    WatchCompactedError,
    WatchEvent,
)
from kvserver.kvpb.kv import EventType, SortOrder, SortTarget
from kvserver.kvpb.watch import WatchResponse

__all__ = [
    "DEFAULT_ENDPOINT",
    "AsyncClient",
    "AsyncWatch",
    "Attempt",
    "Client",
    "ClientError",
    "Cmp",
    "CompactResult",
    "CompactedError",
    "ConnectionFailedError",
    "DeleteResult",
    "EndpointStatus",
    "EventType",
    "FailedPreconditionError",
    "FutureRevisionError",
    "InvalidArgumentError",
    "KeepAlive",
    "KeyValue",
    "LeaderChangedError",
    "Lease",
    "LeaseExistsError",
    "LeaseList",
    "LeaseNotFoundError",
    "LeaseRevokeResult",
    "LeaseTimeToLive",
    "Member",
    "NoLeaderError",
    "NoSpaceError",
    "NotFoundError",
    "Op",
    "OutOfRangeError",
    "PutResult",
    "RangeResult",
    "RequestTimeoutError",
    "ResponseFormatError",
    "ResponseHeader",
    "SortOrder",
    "SortTarget",
    "Status",
    "SyncKeepAlive",
    "SyncWatch",
    "Txn",
    "TxnResult",
    "UnavailableError",
    "UnimplementedError",
    "WatchCanceledError",
    "WatchCompactedError",
    "WatchEvent",
    "WatchResponse",
    "normalize_endpoints",
]
