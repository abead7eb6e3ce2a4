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

Leader-only calls. Only the leader renews leases and knows their remaining TTL, so
KeepAlive and TimeToLive on a follower (the service raises ``etcdserver: not leader``) are
forwarded to the leader, as etcd forwards them; ``kvserver.api.grpc.cluster`` forwards member
changes the same way (``LeaderForwarder``):

- over gRPC, to the leader's first client URL from the member registry, on one grpc.aio
  channel kept for the current leader (a new leader's URL replaces it and closes the old);
- a forwarded call carries the metadata ``x-raftkv-forwarded: 1`` and the client's ``token``;
  on the receiving member it acts by that token only (the connection's certificate is the
  forwarding member's, not the client's), and a forwarded call that finds no leader there is
  answered ``not leader``, never forwarded again, so calls cannot loop;
- a KeepAlive stream on a follower opens one stream to the leader when its first request
  needs it and sends each such request on it (a new leader: a new stream);
- the leader's answer is relayed with this member's header, as etcd's gRPC layer fills it on
  the member that was asked (``cluster_id``, ``member_id``, ``raft_term``; the revision stays
  the leader's, except in a keep-alive answer, whose header etcd takes before the renewal:
  this member's revision); the leader's error status is relayed as is. When no other leader
  is known, or it cannot be reached (a transport failure: Unavailable without an
  ``etcdserver:`` text, or no answer within ``FORWARD_TIMEOUT_S``), the call is answered the
  original ``not leader`` (Unavailable: etcd's clients retry it).

An https leader URL needs the member's client TLS credentials: ``calls.forward_credentials``
(a ``grpc.ChannelCredentials``) when the server provides it; without them such a call is
answered ``not leader`` rather than dialled in the clear.

This is gRPC to the client URL rather than the gateway's HTTP forwarding
(``kvserver.api.http.forward``) because the answers and errors are then relayed without a
second translation, and a keep-alive stream stays one stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from kvserver.api.http.forward import FORWARD_TIMEOUT_S, MSG_NOT_LEADER, leader_client_url
from kvserver.etcdpb import rpc_pb2
from kvserver.kvpb import kv as K
from kvserver.kvpb import lease as L
from kvserver.kvpb.errors import EtcdError, LeaseNotFoundError
from kvserver.kvpb.service_errors import GrpcCode, ServiceError

from . import convert
from .calls import Calls, service_handler

FORWARDED_KEY = "x-raftkv-forwarded"
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


def _metadata(context: grpc.aio.ServicerContext, name: str) -> str | None:
    for key, value in context.invocation_metadata() or ():
        if key == name:
            return value if isinstance(value, str) else value.decode("utf-8", "replace")
    return None


def is_forwarded(context: grpc.aio.ServicerContext) -> bool:
    return _metadata(context, FORWARDED_KEY) is not None


def caller_user(calls: Calls, context: grpc.aio.ServicerContext) -> str | None:
    """``Calls.user``, except that a forwarded call acts by its token only."""
    if not is_forwarded(context):
        return calls.user(context)
    calls.caller(context)  # still only through a client URL
    auth = calls.auth
    if auth is None or not auth.enabled:
        return None
    return auth.user_for(_metadata(context, "token"))  # no token: user name is empty


def _relayed(code: grpc.StatusCode, details: str | None, refused: EtcdError) -> EtcdError:
    """What to answer for the leader's status: its own error, or ``refused`` when the leader
    was not reached or did not answer (a transport failure has no ``etcdserver:`` text)."""
    details = details or ""
    if code in (grpc.StatusCode.OK, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
        return refused
    if code is grpc.StatusCode.UNAVAILABLE and not details.startswith("etcdserver:"):
        return refused
    return ServiceError(GrpcCode(code.value[0]), details)


class LeaderForwarder:
    """Calls the leader's gRPC services on behalf of this member (see the module docstring)."""

    def __init__(self, service: Any, credentials: grpc.ChannelCredentials | None = None):
        self.service = service
        self.credentials = credentials
        self.url: str | None = None
        self.channel: grpc.aio.Channel | None = None
        self.forwarded = 0  # calls and keep-alive requests sent to a leader (for tests)

    def can_forward(self, exc: EtcdError, context: grpc.aio.ServicerContext) -> bool:
        return (
            isinstance(exc, ServiceError)
            and exc.message == MSG_NOT_LEADER
            and not is_forwarded(context)
        )

    def _dial(self, url: str) -> grpc.aio.Channel | None:
        scheme, _, rest = url.partition("://")
        hostport = rest.split("/", 1)[0]
        if scheme == "http":
            return grpc.aio.insecure_channel(hostport)
        if scheme == "https" and self.credentials is not None:
            return grpc.aio.secure_channel(hostport, self.credentials)
        return None  # https without credentials, or a scheme gRPC cannot dial

    async def leader_channel(self) -> tuple[str, grpc.aio.Channel] | None:
        """The channel to the current leader's client URL (None: no leader to forward to)."""
        url = leader_client_url(self.service)
        if url is None:
            return None
        if url != self.url or self.channel is None:
            channel = self._dial(url)
            if channel is None:
                return None
            old, self.url, self.channel = self.channel, url, channel
            if old is not None:  # the former leader's: its calls end (they would be refused)
                await old.close()
        assert self.channel is not None
        return url, self.channel

    def as_local(self, answer: Any, revision: int | None = None) -> Any:
        """``answer`` (a leader's) with this member's header fields, as etcd fills them."""
        h = answer.header
        h.cluster_id, h.member_id = self.service.cluster_id, self.service.member_id
        h.raft_term = self.service.raft_term
        if revision is not None:
            h.revision = revision
        return answer

    @staticmethod
    def metadata(context: grpc.aio.ServicerContext) -> tuple[tuple[str, str], ...]:
        token = _metadata(context, "token")
        return ((FORWARDED_KEY, "1"),) + ((("token", token),) if token else ())

    @staticmethod
    def timeout_s(context: grpc.aio.ServicerContext) -> float:
        remaining = context.time_remaining()
        return FORWARD_TIMEOUT_S if remaining is None else min(remaining, FORWARD_TIMEOUT_S)

    async def unary(
        self,
        context: grpc.aio.ServicerContext,
        method: str,
        request: Any,
        response_class: Any,
        refused: EtcdError,
    ) -> Any:
        """``/service/method`` on the leader: its answer; its error status is raised as a
        ``ServiceError`` with the same code and text, a transport failure as ``refused``."""
        target = await self.leader_channel()
        if target is None:
            raise refused
        call = target[1].unary_unary(
            method,
            request_serializer=type(request).SerializeToString,
            response_deserializer=response_class.FromString,
        )
        self.forwarded += 1
        try:
            answer = await call(
                request, metadata=self.metadata(context), timeout=self.timeout_s(context)
            )
        except grpc.aio.AioRpcError as err:
            raise _relayed(err.code(), err.details(), refused) from None
        return self.as_local(answer)


class _KeepAliveUpstream:
    """A follower's keep-alive stream to the leader, for one client stream."""

    def __init__(self, forwarder: LeaderForwarder, context: grpc.aio.ServicerContext):
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
            )(metadata=LeaderForwarder.metadata(self.context))
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
            raise _relayed(err.code(), err.details(), refused) from None
        if answer is grpc.aio.EOF:  # the leader ended the stream: its status says why
            self.close()
            code, details = await call.code(), await call.details()
            raise _relayed(code, details, refused)
        return self.forwarder.as_local(answer, revision)


# --- the servicer -----------------------------------------------------------------------------


class LeaseServicer:
    def __init__(self, service: Any, calls: Calls):
        self.service = service
        self.calls = calls
        # The member's client TLS credentials for an https leader, when the server gives them.
        self.forwarder = LeaderForwarder(service, getattr(calls, "forward_credentials", None))

    def _check_revoke(self, user: str | None, lease_id: int) -> None:
        """etcd: revoking a lease needs write permission on every key attached to it."""
        auth = self.calls.auth
        if user is None or auth is None or not auth.enabled:
            return
        store = getattr(self.service, "store", None)
        for key in store.keys_with_lease(lease_id) if store is not None else ():
            auth.check_write(user, key)

    async def LeaseGrant(
        self, request: rpc_pb2.LeaseGrantRequest, context: grpc.aio.ServicerContext
    ) -> Any:
        return await self.calls.run(context, self._grant(request, context))

    async def _grant(
        self, request: rpc_pb2.LeaseGrantRequest, context: grpc.aio.ServicerContext
    ) -> Any:
        caller_user(self.calls, context)
        return lease_grant_to_pb(await self.service.lease_grant(request.TTL, request.ID))

    async def LeaseRevoke(
        self, request: rpc_pb2.LeaseRevokeRequest, context: grpc.aio.ServicerContext
    ) -> Any:
        return await self.calls.run(context, self._revoke(request, context))

    async def _revoke(
        self, request: rpc_pb2.LeaseRevokeRequest, context: grpc.aio.ServicerContext
    ) -> Any:
        self._check_revoke(caller_user(self.calls, context), request.ID)
        return lease_revoke_to_pb(await self.service.lease_revoke(request.ID))

    async def LeaseTimeToLive(
        self, request: rpc_pb2.LeaseTimeToLiveRequest, context: grpc.aio.ServicerContext
    ) -> Any:
        return await self.calls.run(context, self._time_to_live(request, context))

    async def _time_to_live(
        self, request: rpc_pb2.LeaseTimeToLiveRequest, context: grpc.aio.ServicerContext
    ) -> Any:
        caller_user(self.calls, context)
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

    async def LeaseLeases(
        self, request: rpc_pb2.LeaseLeasesRequest, context: grpc.aio.ServicerContext
    ) -> Any:
        return await self.calls.run(context, self._leases(context))

    async def _leases(self, context: grpc.aio.ServicerContext) -> Any:
        caller_user(self.calls, context)
        return lease_leases_to_pb(await self.service.lease_leases())

    async def LeaseKeepAlive(
        self,
        requests: AsyncIterator[rpc_pb2.LeaseKeepAliveRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[Any]:
        await self.calls.run(context, self._stream_user(context))
        upstream = _KeepAliveUpstream(self.forwarder, context)
        try:
            async for request in requests:
                yield await self.calls.run(context, self._renew(request, context, upstream))
        finally:
            upstream.close()

    async def _stream_user(self, context: grpc.aio.ServicerContext) -> str | None:
        return caller_user(self.calls, context)

    async def _renew(
        self,
        request: rpc_pb2.LeaseKeepAliveRequest,
        context: grpc.aio.ServicerContext,
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

    def handler(self) -> grpc.GenericRpcHandler:
        return service_handler(
            SERVICE,
            {
                "LeaseGrant": (self.LeaseGrant, rpc_pb2.LeaseGrantRequest),
                "LeaseRevoke": (self.LeaseRevoke, rpc_pb2.LeaseRevokeRequest),
                "LeaseKeepAlive": (
                    self.LeaseKeepAlive,
                    rpc_pb2.LeaseKeepAliveRequest,
                    "stream_stream",
                ),
                "LeaseTimeToLive": (self.LeaseTimeToLive, rpc_pb2.LeaseTimeToLiveRequest),
                "LeaseLeases": (self.LeaseLeases, rpc_pb2.LeaseLeasesRequest),
            },
        )
