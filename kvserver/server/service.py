"""The service layer both HTTP dialects call: one interface over the replicated store.

``KVService`` is what a handler sees. Requests and responses are the MVCC store's typed
dataclasses (``kvserver.kvpb.kv``, etcd's etcdserverpb in snake_case); responses come back
with a complete ``header`` (cluster_id, member_id, revision, raft_term). Failures are raised
as ``kvserver.kvpb.errors.EtcdError`` subclasses (``kvserver.kvpb.service_errors.ServiceError`` for
cluster-level ones such as "no leader" or "request timed out"), carrying etcd's text, gRPC
code and HTTP status; a failed request changed nothing.

Writes carry an optional ``(client_id, request_id)``: a client that retries a write after a
timeout sends the same pair and the state machine applies it once. Over HTTP the pair travels
in the headers ``X-Raftkv-Client-Id`` and ``X-Raftkv-Request-Id`` (decimal uint64).

Reads are linearizable unless ``RangeRequest.serializable`` is set, in which case this node
answers from its local state at once (possibly stale).

Leases (etcd's Lease service, ``kvserver.kvpb.lease`` types): ``lease_grant`` and ``lease_revoke``
are replicated writes; ``lease_keepalive`` and ``lease_time_to_live`` are answered by the
leader only (a follower raises ``etcdserver: not leader``, Unavailable and retryable: try
another member); ``lease_leases`` is answered by any member from its applied state. An unknown
lease is ``etcdserver: requested lease not found`` (NotFound) for revoke and keep-alive;
time-to-live answers ``ttl_s == -1`` instead.

Alarms (etcd's Maintenance.Alarm, ``kvserver.kvpb.alarm`` types): ``alarm`` lists the raised
alarms (GET, linearizable) or raises/clears one through the log (ACTIVATE/DEACTIVATE). A put,
a txn with puts or a lease grant fails with ``etcdserver: mvcc: database space exceeded``
(ResourceExhausted) when the store is over its quota or a NOSPACE alarm is raised.

Maintenance (etcd's Maintenance service): ``hash_kv(revision)`` is this member's hash of its
keyspace up to ``revision`` (0: its current revision; ``kvserver.mvcc.hashkv`` says what is
hashed), from its applied state without a barrier, since members are compared with each
other; a compacted revision is ``etcdserver: mvcc: required revision has been compacted``,
one above the current revision ``etcdserver: mvcc: required revision is a future revision``
(both OutOfRange). ``move_leader(transferee)`` hands leadership to the voter ``transferee`` and
returns once this member sees it lead; it is answered by the leader only (``etcdserver: not
leader``, FailedPrecondition, elsewhere, not forwarded), refuses a target that is not a voter
with ``etcdserver: bad leader transferee`` (FailedPrecondition) and gives up with
``etcdserver: request timed out, leader transfer took too long`` (Unavailable).

Membership (etcd's Cluster service, ``kvserver.kvpb.member`` types): ``member_list`` is
answered by any member from its applied registry; ``member_add|remove|promote|update`` by the
leader once the conf change is applied (a follower raises ``etcdserver: not leader``).

Watch (``kvserver.watch.hub``): ``watch_stream()`` opens a ``WatchStream`` on this member's watch
hub (its applied state; any member serves watches). Its responses carry only a header revision;
the HTTP layer fills ``cluster_id``, ``member_id`` and ``raft_term`` (the current term). The
caller must ``close()`` the stream when its consumer goes away.
"""

from dataclasses import dataclass, field
from typing import Protocol

from kvserver.kvpb.alarm import AlarmRequest, AlarmResponse
from kvserver.kvpb.headers import RAFTKV_VERSION
from kvserver.kvpb.kv import (
    CompactionRequest,
    CompactionResponse,
    DeleteRangeRequest,
    DeleteRangeResponse,
    PutRequest,
    PutResponse,
    RangeRequest,
    RangeResponse,
    TxnRequest,
    TxnResponse,
)
from kvserver.kvpb.lease import (
    LeaseGrantResponse,
    LeaseKeepAliveResponse,
    LeaseLeasesResponse,
    LeaseRevokeResponse,
    LeaseTimeToLiveResponse,
)
from kvserver.kvpb.member import MemberAddResponse, MemberChangeResponse, MemberListResponse
from kvserver.mvcc.hashkv import HashKVResponse
from kvserver.watch.hub import WatchStream


@dataclass(frozen=True, slots=True)
class MemberInfo:
    id: int
    name: str
    peer_urls: tuple[str, ...]
    client_urls: tuple[str, ...]
    is_learner: bool = False


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """This node's view of itself and the cluster (/v3/maintenance/status, /v1/status,
    /health)."""

    member_id: int
    cluster_id: int
    name: str
    leader: int  # 0 = no leader known
    raft_term: int
    raft_index: int  # committed index
    raft_applied_index: int
    revision: int  # the store's current revision
    compact_revision: int
    db_size_bytes: int  # approximate size of the store's data
    is_learner: bool
    members: tuple[MemberInfo, ...] = field(default=())
    version: str = RAFTKV_VERSION
    problem: str = ""  # why the node is unhealthy beyond the two checks below
    archive_lag_entries: int | None = None  # --archive-url only (kvserver.archive.member)
    archive_lag_seconds: float | None = None
    quota_backend_bytes: int = 0  # --quota-backend-bytes in effect (0: not reported)
    # The raised alarms in etcd's StatusResponse.errors form: "memberID:<id> alarm:<TYPE> "
    errors: tuple[str, ...] = ()

    @property
    def healthy(self) -> bool:
        """Nothing is wrong with the raft loop, a leader is known (and, on a follower,
        confirmed by a heartbeat) and everything committed here has been applied."""
        return not self.problem and self.leader != 0 and self.raft_applied_index >= self.raft_index


class KVService(Protocol):
    cluster_id: int
    member_id: int

    async def range(self, req: RangeRequest) -> RangeResponse: ...

    async def put(
        self, req: PutRequest, *, client_id: int = 0, request_id: int = 0
    ) -> PutResponse: ...

    async def delete_range(
        self, req: DeleteRangeRequest, *, client_id: int = 0, request_id: int = 0
    ) -> DeleteRangeResponse: ...

    async def txn(
        self, req: TxnRequest, *, client_id: int = 0, request_id: int = 0
    ) -> TxnResponse: ...

    async def compact(self, req: CompactionRequest) -> CompactionResponse: ...

    async def lease_grant(
        self, ttl_s: int, lease_id: int = 0, *, client_id: int = 0, request_id: int = 0
    ) -> LeaseGrantResponse: ...

    async def lease_revoke(
        self, lease_id: int, *, client_id: int = 0, request_id: int = 0
    ) -> LeaseRevokeResponse: ...

    async def lease_keepalive(self, lease_id: int) -> LeaseKeepAliveResponse: ...

    async def lease_time_to_live(
        self, lease_id: int, keys: bool = False
    ) -> LeaseTimeToLiveResponse: ...

    async def lease_leases(self) -> LeaseLeasesResponse: ...

    async def alarm(self, req: AlarmRequest) -> AlarmResponse: ...

    async def hash_kv(self, revision: int = 0) -> HashKVResponse: ...

    async def move_leader(self, transferee: int) -> None: ...

    async def member_list(self) -> MemberListResponse: ...

    async def member_add(
        self, peer_urls: list[str], is_learner: bool = False
    ) -> MemberAddResponse: ...

    async def member_remove(self, member_id: int) -> MemberChangeResponse: ...

    async def member_promote(self, member_id: int) -> MemberChangeResponse: ...

    async def member_update(self, member_id: int, peer_urls: list[str]) -> MemberChangeResponse: ...

    @property
    def raft_term(self) -> int: ...

    def watch_stream(self, max_watchers: int | None = None) -> WatchStream: ...

    async def wait_recovered(self) -> None:
        """Return once this member's store is no older than before it (re)started."""

    def status(self) -> NodeStatus: ...


def serves_as_learner(service: object) -> bool:
    """Whether the member behind ``service`` is a learner now (it is promoted while it
    serves, so ask per request). A service without a raft node (a test double) is not."""
    node = getattr(service, "node", None)
    conf_state = getattr(node, "conf_state", None)
    member_id = getattr(service, "member_id", None)
    return conf_state is not None and member_id in conf_state.learners
