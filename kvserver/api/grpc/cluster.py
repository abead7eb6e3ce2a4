"""etcd's Cluster service over gRPC (``etcdserverpb.Cluster``).

Methods: MemberAdd (``peerURLs``, ``isLearner``), MemberRemove, MemberUpdate (``ID``,
``peerURLs``), MemberList, MemberPromote. A ``Member`` carries ``ID``, ``name`` (empty until
the member has started), ``peerURLs``, ``clientURLs`` (empty until then too) and
``isLearner``; the lists are sorted by ID. Headers carry cluster, member and raft term, no
revision (etcd's cluster answers have none).

Auth, as the JSON gateway's cluster endpoints and etcd 3.4: with auth enabled the changes
need the root role (no user: ``etcdserver: user name is empty``; another user:
``etcdserver: permission denied``); MemberList needs no user at all (a token sent with it is
not even checked), only a connection through a client URL.

MemberList is answered by any member from its applied registry; ``linearizable`` (etcd 3.5's
flag) is accepted and ignored, as the gateway ignores it. The changes are answered by the
leader once the conf change is applied; on a follower (``etcdserver: not leader``) they are
forwarded to the leader over gRPC, once, as
(``kvserver.api.grpc.forward``); the answer then carries this member's header, as etcd's (where any
member proposes a conf change and answers with its own header). Errors are
etcd's texts and codes (``kvserver.membership.reconfig``): ``etcdserver: member not found``,
``etcdserver: Peer URLs already exists``, ``etcdserver: given member URLs are invalid``,
``etcdserver: too many learner members in cluster``, ``etcdserver: can only promote a
learner member which is in sync with leader``, ``etcdserver: can only promote a learner
member``, ``etcdserver: re-configuration failed due to not enough started members``,
``etcdserver: unhealthy cluster``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from kvserver.etcdpb import rpc_pb2
from kvserver.kvpb.errors import EtcdError
from kvserver.kvpb.member import Member

from . import convert
from .calls import Calls, service_handler
from .forward import LeaderForwarder
from .rpc import Method, RpcContext

SERVICE = "etcdserverpb.Cluster"


# --- conversions ------------------------------------------------------------------------------


def member_to_pb(m: Member) -> rpc_pb2.Member:
    return rpc_pb2.Member(
        ID=m.id,
        name=m.name,
        peerURLs=list(m.peer_urls),
        clientURLs=list(m.client_urls),
        isLearner=m.is_learner,
    )


def members_to_pb(r: Any, kind: Any) -> Any:
    """A response of class ``kind`` (header, members; MemberAdd's also ``member``)."""
    out = kind(header=convert.header_to_pb(r.header), members=[member_to_pb(m) for m in r.members])
    member = getattr(r, "member", None)
    if member is not None:
        out.member.CopyFrom(member_to_pb(member))
    return out


# --- the servicer -----------------------------------------------------------------------------


class ClusterServicer:
    def __init__(self, service: Any, calls: Calls, forwarder: LeaderForwarder):
        self.service = service
        self.calls = calls
        self.forwarder = forwarder

    async def MemberList(self, request: rpc_pb2.MemberListRequest, context: RpcContext) -> Any:
        return await self.calls.run(context, self._list(context))

    async def _list(self, context: RpcContext) -> Any:
        self.calls.caller(context)  # through a client URL; no user needed
        return members_to_pb(await self.service.member_list(), rpc_pb2.MemberListResponse)

    async def _change(
        self,
        context: RpcContext,
        method: str,
        request: Any,
        kind: Any,
        call: Callable[[], Awaitable[Any]],
    ) -> Any:
        """Root only; one service call; on a follower, forwarded once to the leader."""
        user = self.calls.user(context)
        auth = self.calls.auth
        if auth is not None:
            auth.check_admin(user)
        try:
            resp = await call()
        except EtcdError as exc:
            if not self.forwarder.can_forward(exc, context):
                raise
            return await self.forwarder.unary(context, f"/{SERVICE}/{method}", request, kind, exc)
        return members_to_pb(resp, kind)

    async def MemberAdd(self, request: rpc_pb2.MemberAddRequest, context: RpcContext) -> Any:
        urls, learner = list(request.peerURLs), request.isLearner
        return await self.calls.run(
            context,
            self._change(
                context,
                "MemberAdd",
                request,
                rpc_pb2.MemberAddResponse,
                lambda: self.service.member_add(urls, learner),
            ),
        )

    async def MemberRemove(self, request: rpc_pb2.MemberRemoveRequest, context: RpcContext) -> Any:
        member_id = request.ID
        return await self.calls.run(
            context,
            self._change(
                context,
                "MemberRemove",
                request,
                rpc_pb2.MemberRemoveResponse,
                lambda: self.service.member_remove(member_id),
            ),
        )

    async def MemberUpdate(self, request: rpc_pb2.MemberUpdateRequest, context: RpcContext) -> Any:
        member_id, urls = request.ID, list(request.peerURLs)
        return await self.calls.run(
            context,
            self._change(
                context,
                "MemberUpdate",
                request,
                rpc_pb2.MemberUpdateResponse,
                lambda: self.service.member_update(member_id, urls),
            ),
        )

    async def MemberPromote(
        self, request: rpc_pb2.MemberPromoteRequest, context: RpcContext
    ) -> Any:
        member_id = request.ID
        return await self.calls.run(
            context,
            self._change(
                context,
                "MemberPromote",
                request,
                rpc_pb2.MemberPromoteResponse,
                lambda: self.service.member_promote(member_id),
            ),
        )

    def methods(self) -> dict[str, Method]:
        return service_handler(
            SERVICE,
            {
                "MemberAdd": (self.MemberAdd, rpc_pb2.MemberAddRequest),
                "MemberRemove": (self.MemberRemove, rpc_pb2.MemberRemoveRequest),
                "MemberUpdate": (self.MemberUpdate, rpc_pb2.MemberUpdateRequest),
                "MemberList": (self.MemberList, rpc_pb2.MemberListRequest),
                "MemberPromote": (self.MemberPromote, rpc_pb2.MemberPromoteRequest),
            },
        )
