"""etcd's Lease service over gRPC (``etcdserverpb.Lease``), and forwarding to the leader.

Methods: LeaseGrant (ID 0: the server chooses), LeaseRevoke, LeaseKeepAlive (a stream: one
answer per request, in order), LeaseTimeToLive (``keys``: the attached keys), LeaseLeases.
Each call is: the caller, then one ``KVService`` call, then the answer with its header, in the
JSON gateway's order and with its checks. With auth enabled every call needs a user (a valid
``token``, or a client certificate's common name; else ``etcdserver: user name is empty``),
as the gateway's lease endpoints do (etcd 3.4 itself lets a caller without a token grant,
renew and list leases). LeaseRevoke also needs write permission on every key attached to the
lease (etcd's ``checkLeasePuts``). Errors are etcd's texts and codes (``Calls.run``): a TTL
above etcd's maximum is ``etcdserver: too large lease TTL``, an ID in use ``etcdserver: lease
already exists``, revoking an unknown lease ``etcdserver: requested lease not found``.

etcd's gRPC layer answers a keep-alive of an unknown lease with ``TTL: 0`` (not an error: the
stream goes on), and a time-to-live of an unknown lease with ``TTL: -1``.

A KeepAlive stream with the ``hasleader: true`` metadata is refused, Unavailable ``etcdserver:
no leader``, on a member that knows no leader, and an open one ends with that status once the
member has lost its leader (etcd's stream interceptor; ``kvserver.api.grpc.leader_monitor``).

Leader-only calls. Only the leader renews leases and knows their remaining TTL, so
KeepAlive and TimeToLive on a follower (the service raises ``etcdserver: not leader``) are
forwarded to the leader (``kvserver.api.grpc.forward``). A KeepAlive stream on a follower
opens one stream to the leader when its first request needs it and sends each such request
on it (a new leader: a new stream). etcd takes a keep-alive answer's header before the
renewal, so it carries this member's revision.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from kvserver.api.shared.leader import FORWARD_TIMEOUT_S
from kvserver.etcdpb import rpc_pb2
from kvserver.kvpb import kv as K
from kvserver.kvpb import lease as L
from kvserver.kvpb.errors import EtcdError, LeaseNotFoundError
from kvserver.kvpb.service_errors import no_leader

from . import convert
from .calls import Calls, requires_leader, service_handler, status_of
from .forward import LeaderForwarder, forwarded_metadata, relayed
from .leader_monitor import LeaderMonitor
from .rpc import Method, RpcContext

SERVICE = "etcdserverpb.Lease"


# --- conversions ------------------------------------------------------------------------------


def lease_grant_to_pb(r: L.LeaseGrantResponse) -> rpc_pb2.LeaseGrantResponse:
    return rpc_pb2.LeaseGrantResponse(
        header=convert.header_to_pb(r.header), ID=r.lease_id, TTL=r.ttl_s
    )


def lease_revoke_to_pb(r: L.LeaseRevokeResponse) -> rpc_pb2.LeaseRevokeResponse:
    return rpc_pb2.LeaseRevokeResponse(header=convert.header_to_pb(r.header))


def lease_keepalive_to_pb(r: L.LeaseKeepAliveResponse) -> rpc_pb2.LeaseKeepAliveResponse:
    return rpc_pb2.LeaseKeepAliveResponse(
        header=convert.header_to_pb(r.header), ID=r.lease_id, TTL=r.ttl_s
    )


def lease_time_to_live_to_pb(r: L.LeaseTimeToLiveResponse) -> rpc_pb2.LeaseTimeToLiveResponse:
    return rpc_pb2.LeaseTimeToLiveResponse(
        header=convert.header_to_pb(r.header),
        ID=r.lease_id,
        TTL=r.ttl_s,
        grantedTTL=r.granted_ttl_s,
        keys=list(r.keys),
    )


def lease_leases_to_pb(r: L.LeaseLeasesResponse) -> rpc_pb2.LeaseLeasesResponse:
    return rpc_pb2.LeaseLeasesResponse(
        header=convert.header_to_pb(r.header),
        leases=[rpc_pb2.LeaseStatus(ID=lease_id) for lease_id in r.leases],
    )


# --- forwarding to the leader -----------------------------------------------------------------


class _KeepAliveUpstream:
    """A follower's keep-alive stream to the leader, for one client stream."""

    def __init__(self, forwarder: LeaderForwarder, context: RpcContext):
        self.forwarder = forwarder
        self.context = context
        self.url: str | None = None
        self.call: Any = None  # grpc.aio.StreamStreamCall

    def close(self) -> None:
        if self.call is not None:
            self.call.cancel()
        self.call = None
        self.url = None

    async def renew(self, request: rpc_pb2.LeaseKeepAliveRequest, refused: EtcdError) -> Any:
        revision = self.forwarder.service.status().revision  # etcd's header precedes the renewal
        target = await self.forwarder.leader_channel()
        if target is None:
            self.close()
            raise refused
        url, channel = target
        if self.call is None or url != self.url:
            self.close()
            self.call = channel.stream_stream(
                f"/{SERVICE}/LeaseKeepAlive",
                request_serializer=rpc_pb2.LeaseKeepAliveRequest.SerializeToString,
                response_deserializer=rpc_pb2.LeaseKeepAliveResponse.FromString,
            )(metadata=forwarded_metadata(self.context))
            self.url = url
        self.forwarder.forwarded += 1
        call = self.call
        try:
            await asyncio.wait_for(call.write(request), FORWARD_TIMEOUT_S)
            answer = await asyncio.wait_for(call.read(), FORWARD_TIMEOUT_S)
        except (TimeoutError, asyncio.InvalidStateError):  # no answer; the call is over
            self.close()
            raise refused from None
        except grpc.aio.AioRpcError as err:
            self.close()
            raise relayed(err.code(), err.details(), refused) from None
        if answer is grpc.aio.EOF:  # the leader ended the stream: its status says why
            self.close()
            code, details = await call.code(), await call.details()
            raise relayed(code, details, refused)
        return self.forwarder.as_local(answer, revision)


# --- the servicer -----------------------------------------------------------------------------


class _EndOnLeaderLoss:
    """A ``hasleader`` keep-alive stream, for the leader monitor: ends it with the error."""

    def __init__(self, context: RpcContext):
        self.context = context

    def fail(self, error: EtcdError) -> None:
        self.context.end(status_of(error.grpc_code), error.message)


class LeaseServicer:
    def __init__(self, service: Any, calls: Calls, forwarder: LeaderForwarder):
        self.service = service
        self.calls = calls
        self.forwarder = forwarder
        self.leader_monitor = LeaderMonitor(service, "grpc-lease-leader-monitor")

    def _check_revoke(self, user: str | None, lease_id: int) -> None:
        """etcd: revoking a lease needs write permission on every key attached to it."""
        auth = self.calls.auth
        if user is None or auth is None or not auth.enabled:
            return
        store = getattr(self.service, "store", None)
        for key in store.keys_with_lease(lease_id) if store is not None else ():
            auth.check_write(user, key)

    async def _grant(self, request: rpc_pb2.LeaseGrantRequest, context: RpcContext) -> Any:
        self.calls.user(context)
        return lease_grant_to_pb(await self.service.lease_grant(request.TTL, request.ID))

    async def _revoke(self, request: rpc_pb2.LeaseRevokeRequest, context: RpcContext) -> Any:
        self._check_revoke(self.calls.user(context), request.ID)
        return lease_revoke_to_pb(await self.service.lease_revoke(request.ID))

    async def _time_to_live(
        self, request: rpc_pb2.LeaseTimeToLiveRequest, context: RpcContext
    ) -> Any:
        self.calls.user(context)
        try:
            resp = await self.service.lease_time_to_live(request.ID, request.keys)
        except EtcdError as exc:
            if not self.forwarder.can_forward(exc, context):
                raise
            return await self.forwarder.unary(
                context,
                f"/{SERVICE}/LeaseTimeToLive",
                request,
                rpc_pb2.LeaseTimeToLiveResponse,
                exc,
            )
        return lease_time_to_live_to_pb(resp)

    async def _leases(self, request: rpc_pb2.LeaseLeasesRequest, context: RpcContext) -> Any:
        self.calls.user(context)
        return lease_leases_to_pb(await self.service.lease_leases())

    async def LeaseKeepAlive(
        self,
        requests: AsyncIterator[rpc_pb2.LeaseKeepAliveRequest],
        context: RpcContext,
    ) -> AsyncIterator[Any]:
        await self.calls.run(context, self._stream_user(context))
        watched = None
        if requires_leader(context):
            if self.service.status().leader == 0:
                await self.calls.abort(context, no_leader())  # etcd's stream interceptor
            watched = _EndOnLeaderLoss(context)
            self.leader_monitor.add(watched)
        upstream = _KeepAliveUpstream(self.forwarder, context)
        try:
            async for request in requests:
                yield await self.calls.run(context, self._renew(request, context, upstream))
        finally:
            upstream.close()
            if watched is not None:
                self.leader_monitor.discard(watched)

    async def _stream_user(self, context: RpcContext) -> str | None:
        return self.calls.user(context)

    async def _renew(
        self,
        request: rpc_pb2.LeaseKeepAliveRequest,
        context: RpcContext,
        upstream: _KeepAliveUpstream,
    ) -> Any:
        try:
            return lease_keepalive_to_pb(await self.service.lease_keepalive(request.ID))
        except LeaseNotFoundError:
            # etcd's gRPC layer: an unknown lease is an answer with TTL 0, the stream goes on.
            st = self.service.status()
            header = K.ResponseHeader(st.cluster_id, st.member_id, st.revision, st.raft_term)
            return lease_keepalive_to_pb(L.LeaseKeepAliveResponse(header, request.ID, 0))
        except EtcdError as exc:
            if not self.forwarder.can_forward(exc, context):
                raise
            return await upstream.renew(request, exc)

    def methods(self) -> dict[str, Method]:
        u = self.calls.unary
        return service_handler(
            SERVICE,
            {
                "LeaseGrant": (u(self._grant), rpc_pb2.LeaseGrantRequest),
                "LeaseRevoke": (u(self._revoke), rpc_pb2.LeaseRevokeRequest),
                "LeaseKeepAlive": (
                    self.LeaseKeepAlive,
                    rpc_pb2.LeaseKeepAliveRequest,
                    "stream_stream",
                ),
                "LeaseTimeToLive": (u(self._time_to_live), rpc_pb2.LeaseTimeToLiveRequest),
                "LeaseLeases": (u(self._leases), rpc_pb2.LeaseLeasesRequest),
            },
        )
