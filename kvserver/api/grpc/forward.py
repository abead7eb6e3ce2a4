"""Forwarding a gRPC call to the leader, for the calls only the leader answers.

Only the leader renews leases and knows their remaining TTL, and membership changes are
proposed by the leader; raftkv's service raises ``etcdserver: not leader`` on a follower for
those. etcd forwards them inside the cluster, so its clients may call any member; the gRPC
dialect does the same with one ``LeaderForwarder`` per member (``GrpcServer`` owns it and
closes it at stop):

- over gRPC, to the leader's first client URL from the member registry, on one grpc.aio
  channel kept for the current leader (a new leader's URL replaces it and closes the old);
- a forwarded call carries the metadata ``x-raftkv-forwarded: 1`` and the client's ``token``;
  on the receiving member it acts by that token only (``Calls.user``: the connection's
  certificate is the forwarding member's, not the client's), and a forwarded call that finds
  no leader there is answered ``not leader``, never forwarded again, so calls cannot loop;
- the leader's answer is relayed with this member's header, as etcd's gRPC layer fills it on
  the member that was asked (``cluster_id``, ``member_id``, ``raft_term``; the revision stays
  the leader's); the leader's error status is relayed as is. When no other leader is known,
  or it cannot be reached (a transport failure: Unavailable without an ``etcdserver:`` text,
  or no answer within ``FORWARD_TIMEOUT_S``), the call is answered the original ``not
  leader`` (Unavailable: etcd's clients retry it).

An https leader URL needs this member's client TLS credentials (``credentials``, built from
``--trusted-ca-file``, ``--cert-file`` and ``--key-file``); without them (e.g. auto-TLS,
whose certificates no CA signs) such a call is answered ``not leader`` rather than dialled in
the clear.

This is gRPC to the client URL rather than the gateway's HTTP forwarding
(``kvserver.api.http.forward``) because the answers and errors are then relayed without a
second translation, and a keep-alive stream stays one stream.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc

from kvserver.api.shared.leader import FORWARD_TIMEOUT_S, MSG_NOT_LEADER, leader_client_url
from kvserver.kvpb.errors import EtcdError
from kvserver.kvpb.service_errors import GrpcCode, ServiceError

from .calls import FORWARDED_KEY, is_forwarded, metadata_value
from .rpc import RpcContext

PUBLISH_WAIT_S = 2.0
PUBLISH_POLL_S = 0.05


def forwarded_metadata(context: RpcContext) -> tuple[tuple[str, str], ...]:
    """The metadata of a call forwarded on behalf of ``context``'s caller."""
    token = metadata_value(context, "token")
    return ((FORWARDED_KEY, "1"),) + ((("token", token),) if token else ())


def relayed(code: grpc.StatusCode, details: str | None, refused: EtcdError) -> EtcdError:
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

    def can_forward(self, exc: EtcdError, context: RpcContext) -> bool:
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

    async def _leader_url(self) -> str | None:
        """The leader's client URL. A member publishes its client URLs through the log after
        it starts, so a leader that just came up may not have one yet: wait for it a little
        (``PUBLISH_WAIT_S``, bounded) rather than refuse a call etcd would forward."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PUBLISH_WAIT_S
        while True:
            url = leader_client_url(self.service)
            status = self.service.status()
            unpublished = status.leader not in (0, status.member_id)
            if url is not None or not unpublished or loop.time() >= deadline:
                return url
            await asyncio.sleep(PUBLISH_POLL_S)

    async def leader_channel(self) -> tuple[str, grpc.aio.Channel] | None:
        """The channel to the current leader's client URL (None: no leader to forward to)."""
        url = await self._leader_url()
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
    def timeout_s(context: RpcContext) -> float:
        remaining = context.time_remaining()
        return FORWARD_TIMEOUT_S if remaining is None else min(remaining, FORWARD_TIMEOUT_S)

    async def unary(
        self,
        context: RpcContext,
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
                request, metadata=forwarded_metadata(context), timeout=self.timeout_s(context)
            )
        except grpc.aio.AioRpcError as err:
            raise relayed(err.code(), err.details(), refused) from None
        return self.as_local(answer)

    async def close(self) -> None:
        channel, self.channel, self.url = self.channel, None, None
        if channel is not None:
            await channel.close()
