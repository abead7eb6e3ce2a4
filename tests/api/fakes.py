"""``LocalKV``: a ``KVService`` that applies requests directly to an ``MVCCStore`` (no raft).

For tests of the HTTP API and of the client library: every request is applied at once, in
call order, with the store's own validation and request-id deduplication (the lessor's for
lease grants and revokes), and answered with a full header (``cluster_id``, ``member_id``,
``revision``, ``raft_term``). A failed request raises the store's ``EtcdError`` and changes
nothing.

Knobs a test may turn (plain attributes):
- ``leader`` (0 = no leader), ``raft_term``, ``raft_index``, ``raft_applied_index`` — what
  ``status()`` reports (each write advances both indexes by one);
- ``fail_with`` — an exception every service call raises before touching the store (e.g.
  ``kvserver.kvpb.service_errors.no_leader()`` for failover tests, ``RuntimeError`` for a bug);
- ``calls`` — a ``Counter`` of request type names that reached the store;
- ``lessor`` — a primary ``kvserver.lease.lessor.Lessor`` on ``clock`` (inject a fake one to expire
  leases without sleeping; ``expire_leases()`` revokes what expired, like the leader's task).
  It deletes keys from the store on revoke but only decides which leases exist for puts when
  ``bind_leases=True`` (otherwise the store's own ``lease_exists`` stays, as before leases).
- ``watch_hub`` — a ``kvserver.watch.hub.WatchHub`` over the store (limits from ``watch_limits``),
  notified after every write and lease revoke that produced events, as ``RaftKV`` does;
  ``replace_store(store)`` swaps the store as a snapshot restore would (``hub.reset``).
- ``hash_kv`` hashes the store (``kvserver.mvcc.hashkv``) at once; ``move_leader`` checks as
  ``RaftKV`` does and then sets ``leader`` to the target;
- ``membership`` — a ``tests.support.fake_membership.LocalMembership`` (the member API without raft:
  changes apply at once with etcd's checks; ``membership.unsynced`` marks learners that are
  not in sync); the ``member_*`` calls go to it.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from kvserver.kvpb.alarm import AlarmAction, AlarmRequest, AlarmResponse
from kvserver.kvpb.kv import (
    CompactionRequest,
    CompactionResponse,
    DeleteRangeRequest,
    DeleteRangeResponse,
    PutRequest,
    PutResponse,
    RangeRequest,
    RangeResponse,
    ResponseHeader,
    TxnRequest,
    TxnResponse,
)
from kvserver.kvpb.lease import (
    LeaseGrantRequest,
    LeaseGrantResponse,
    LeaseKeepAliveResponse,
    LeaseLeasesResponse,
    LeaseRevokeRequest,
    LeaseRevokeResponse,
    LeaseTimeToLiveResponse,
)
from kvserver.kvpb.member import Member
from kvserver.kvpb.service_errors import GrpcCode, ServiceError
from kvserver.lease.lessor import LeaseIdGenerator, Lessor
from kvserver.mvcc.hashkv import HashKVResponse, hash_kv
from kvserver.mvcc.store import MVCCStore
from kvserver.server.alarms import AlarmStore
from kvserver.server.service import MemberInfo, NodeStatus
from kvserver.watch.hub import WatchHub, WatchLimits, WatchStream
from tests.support.fake_membership import LocalMembership

DEFAULT_CLUSTER_ID = 0xCDF818194E3A8C32
DEFAULT_MEMBER_ID = 0x8E9E05C52164694D


class LocalKV:
    """A single-node, in-memory ``KVService`` (see the module docstring)."""

    def __init__(
        self,
        *,
        store: MVCCStore | None = None,
        cluster_id: int = DEFAULT_CLUSTER_ID,
        member_id: int = DEFAULT_MEMBER_ID,
        name: str = "local",
        raft_term: int = 2,
        client_url: str = "http://127.0.0.1:2379",
        peer_url: str = "http://127.0.0.1:2380",
        clock: Callable[[], float] = time.monotonic,
        bind_leases: bool = False,
        watch_limits: WatchLimits | None = None,
    ) -> None:
        self.store = store if store is not None else MVCCStore()
        self.cluster_id = cluster_id
        self.member_id = member_id
        self.name = name
        self.raft_term = raft_term
        self.leader = member_id
        self.raft_index = 1
        self.raft_applied_index = 1
        self.fail_with: BaseException | None = None
        self.calls: Counter[str] = Counter()
        self.members = (MemberInfo(member_id, name, (peer_url,), (client_url,)),)
        self._bytes_written = 0
        self.lessor = Lessor(clock=clock)
        if bind_leases:
            self.lessor.bind(self.store)
        else:
            self.lessor.store = self.store
        self.lessor.promote(0.0)
        self.lease_ids = LeaseIdGenerator(member_id, 1_700_000_000_000)
        self.watch_hub = WatchHub(self.store, watch_limits)
        self.alarms = AlarmStore()
        self.membership = LocalMembership(
            Member(member_id, name, (peer_url,), (client_url,)), cluster_id, lambda: self.raft_term
        )

    def watch_stream(self, max_watchers: int | None = None) -> WatchStream:
        if self.fail_with is not None:
            raise self.fail_with
        return self.watch_hub.open_stream(max_watchers)

    async def wait_recovered(self) -> None:
        pass  # an in-memory store that never restarts

    def replace_store(self, store: MVCCStore) -> None:
        """What a snapshot restore does: a new store, watchers continue from its history."""
        self.store = store
        self.lessor.store = store
        self.watch_hub.reset(store)

    def _header(self) -> ResponseHeader:
        return ResponseHeader(self.cluster_id, self.member_id, self.store.revision, self.raft_term)

    def _lease_apply(self, request: Any, client_id: int = 0, request_id: int = 0) -> Any:
        self.calls[type(request).__name__] += 1
        self.raft_index += 1
        self.raft_applied_index = self.raft_index
        result = self.lessor.apply(request, client_id, request_id)
        if result.events:
            self.watch_hub.notify(result.revision, result.events)
        if result.error is not None:
            raise result.error
        # the response's own revision: a de-duplicated retry answers the first one's
        header = ResponseHeader(
            self.cluster_id, self.member_id, result.response.header.revision, self.raft_term
        )
        return replace(result.response, header=header)

    async def lease_grant(
        self, ttl_s: int, lease_id: int = 0, *, client_id: int = 0, request_id: int = 0
    ) -> LeaseGrantResponse:
        if self.fail_with is not None:
            raise self.fail_with
        req = self.lessor.prepare_grant(
            LeaseGrantRequest(ttl_s, lease_id),
            self.lease_ids,
            client_id=client_id,
            request_id=request_id,
        )
        return self._lease_apply(req, client_id, request_id)

    async def lease_revoke(
        self, lease_id: int, *, client_id: int = 0, request_id: int = 0
    ) -> LeaseRevokeResponse:
        if self.fail_with is not None:
            raise self.fail_with
        return self._lease_apply(LeaseRevokeRequest(lease_id), client_id, request_id)

    async def lease_keepalive(self, lease_id: int) -> LeaseKeepAliveResponse:
        if self.fail_with is not None:
            raise self.fail_with
        self.calls["LeaseKeepAliveRequest"] += 1
        ttl_s = self.lessor.keepalive(lease_id)
        return LeaseKeepAliveResponse(self._header(), lease_id, ttl_s)

    async def lease_time_to_live(
        self, lease_id: int, keys: bool = False
    ) -> LeaseTimeToLiveResponse:
        if self.fail_with is not None:
            raise self.fail_with
        return replace(self.lessor.time_to_live(lease_id, keys), header=self._header())

    async def lease_leases(self) -> LeaseLeasesResponse:
        if self.fail_with is not None:
            raise self.fail_with
        return replace(self.lessor.leases(), header=self._header())

    async def alarm(self, req: AlarmRequest) -> AlarmResponse:
        self.calls["AlarmRequest"] += 1
        if self.fail_with is not None:
            raise self.fail_with
        if req.action == AlarmAction.GET:
            return AlarmResponse(self._header(), self.alarms.get(req.alarm))
        return AlarmResponse(self._header(), self.alarms.apply(req))

    async def hash_kv(self, revision: int = 0) -> HashKVResponse:
        if self.fail_with is not None:
            raise self.fail_with
        self.calls["HashKVRequest"] += 1
        return replace(hash_kv(self.store, revision), header=self._header())

    async def move_leader(self, transferee: int) -> None:
        """``RaftKV.move_leader``'s checks; a transfer to another voter happens at once."""
        if self.fail_with is not None:
            raise self.fail_with
        self.calls["MoveLeaderRequest"] += 1
        if self.leader != self.member_id:
            raise ServiceError(GrpcCode.FAILED_PRECONDITION, "etcdserver: not leader")
        voters = {m.id for m in (await self.member_list()).members if not m.is_learner}
        if transferee not in voters:
            raise ServiceError(GrpcCode.FAILED_PRECONDITION, "etcdserver: bad leader transferee")
        self.leader = transferee

    def expire_leases(self) -> list[int]:
        """Revoke every expired lease (what the leader's expiry task proposes)."""
        expired = self.lessor.expired()
        for lease_id in expired:
            self._lease_apply(LeaseRevokeRequest(lease_id))
        return expired

    def _apply(self, request: Any, client_id: int = 0, request_id: int = 0) -> Any:
        if self.fail_with is not None:
            raise self.fail_with
        self.calls[type(request).__name__] += 1
        result = self.store.apply(request, client_id, request_id)
        if result.events:
            self.watch_hub.notify(result.revision, result.events)
        if type(request) is not RangeRequest:
            self.raft_index += 1  # a write is one log entry, applied at once
            self.raft_applied_index = self.raft_index
        if result.error is not None:
            raise result.error
        response = result.response
        if type(request) is PutRequest:
            self._bytes_written += len(request.key) + len(request.value)
        header = ResponseHeader(
            self.cluster_id, self.member_id, response.header.revision, self.raft_term
        )
        return replace(response, header=header)

    async def range(self, req: RangeRequest) -> RangeResponse:
        return self._apply(req)

    async def put(self, req: PutRequest, *, client_id: int = 0, request_id: int = 0) -> PutResponse:
        return self._apply(req, client_id, request_id)

    async def delete_range(
        self, req: DeleteRangeRequest, *, client_id: int = 0, request_id: int = 0
    ) -> DeleteRangeResponse:
        return self._apply(req, client_id, request_id)

    async def txn(self, req: TxnRequest, *, client_id: int = 0, request_id: int = 0) -> TxnResponse:
        return self._apply(req, client_id, request_id)

    async def compact(self, req: CompactionRequest) -> CompactionResponse:
        return self._apply(req)

    async def _member(self, op: str, *args: Any) -> Any:
        if self.fail_with is not None:
            raise self.fail_with
        return await getattr(self.membership, op)(*args)

    async def member_list(self) -> Any:
        return await self._member("member_list")

    async def member_add(self, peer_urls: Any, is_learner: bool = False) -> Any:
        return await self._member("member_add", peer_urls, is_learner)

    async def member_remove(self, member_id: int) -> Any:
        return await self._member("member_remove", member_id)

    async def member_promote(self, member_id: int) -> Any:
        return await self._member("member_promote", member_id)

    async def member_update(self, member_id: int, peer_urls: Any) -> Any:
        return await self._member("member_update", member_id, peer_urls)

    def status(self) -> NodeStatus:
        if self.fail_with is not None:
            raise self.fail_with
        return NodeStatus(
            member_id=self.member_id,
            cluster_id=self.cluster_id,
            name=self.name,
            leader=self.leader,
            raft_term=self.raft_term,
            raft_index=self.raft_index,
            raft_applied_index=self.raft_applied_index,
            revision=self.store.revision,
            compact_revision=self.store.compact_revision,
            db_size_bytes=4096 + self._bytes_written,
            is_learner=False,
            members=self.members,
        )
