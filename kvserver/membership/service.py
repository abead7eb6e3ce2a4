"""The membership service: the member API of one member, over its registry, raft node and peer
transport (``MembershipService``, one per member).

Requests. ``member_list`` is answered by any member from its registry;
``member_add|remove|promote|update`` are answered by the leader (a follower raises etcd's
``not leader``, retryable; no leader at all: ``no leader``) after etcd's checks
(``kvserver.membership.reconfig``), then the service proposes the conf change and answers once
it is applied on the leader. One lock serializes the proposals, so they never collide under
raft's one-pending-change rule; a leader that has not applied its predecessors' entries yet
answers ``leader changed`` (retryable).

Attributes. A member's name and client URLs reach the registry through the leader: every peer
stream carries the sender's name and client URLs in its headers, and the leader proposes an
UPDATE_NODE for any member whose registry entry differs (its own included), under the same
lock as client changes.

Peers and removal. The service keeps the peer transport in step with the registry (connect to
a new member, close a removed one) and sets ``removed`` when this member is removed (it applied
its own removal, or a peer refused it with 410): the server then stops with etcd's message
``REMOVED_MESSAGE``; a removed leader first waits (bounded, ``wait_handed_over``) until it has
handed leadership over.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from kvserver.kvpb import service_errors as errors
from kvserver.kvpb.kv import ResponseHeader
from kvserver.kvpb.member import (
    Member,
    MemberAddResponse,
    MemberChangeResponse,
    MemberListResponse,
)
from kvserver.kvpb.service_errors import GrpcCode, ServiceError
from kvserver.membership.reconfig import (
    check_add,
    check_peer_urls,
    check_promote,
    check_remove,
    check_update,
    new_member_id,
)
from kvserver.membership.registry import MemberRegistry
from raft import ConfChange, ConfChangeType, ConfState

__all__ = ["PUBLISH_INTERVAL_S", "REMOVED_MESSAGE", "MembershipService", "not_leader"]

log = logging.getLogger(__name__)

PUBLISH_INTERVAL_S = 0.2  # the leader's look at members' attributes
REMOVED_MESSAGE = "the member has been permanently removed from the cluster"


def not_leader() -> ServiceError:
    return ServiceError(GrpcCode.UNAVAILABLE, "etcdserver: not leader", retryable=True)


class MembershipService:
    """Glue between the registry, the raft node and the peer transport (one per member).

    ``node`` (given at construction) must offer ``propose_conf_change(cc)``, ``is_leader``,
    ``leader``, ``term``, ``applied``, ``conf_change_ready`` and ``raw.status()``; the peer
    ``transport`` (given to ``start``, built after this service because it asks it who was
    removed) offers ``set_peers``, ``is_connected``, ``ever_connected`` and
    ``peer_attributes``. Before ``start`` the service only restores and snapshots.
    """

    def __init__(
        self,
        *,
        registry: MemberRegistry,
        node: Any,
        local_id: int,
        cluster_id: int,
        name: str,
        client_urls: tuple[str, ...],
        on_change: Callable[[tuple[Member, ...]], None] | None = None,
    ):
        self.registry = registry
        self.local_id = local_id
        self.cluster_id = cluster_id
        self.name = name
        self.client_urls = tuple(client_urls)
        self.node = node
        self.transport: Any = None  # given to start()
        self._on_change = on_change
        self.removed = asyncio.Event()
        self._lock = asyncio.Lock()  # one member change at a time
        self._task: asyncio.Task | None = None
        self._conf_state = ConfState()

    # hooks the node calls (raft task) --------------------------------------------------------

    def on_conf_change(self, cc: ConfChange, conf_state: ConfState) -> None:
        self._conf_state = conf_state
        self.registry.apply(cc, conf_state)
        if (
            cc.type == ConfChangeType.REMOVE_NODE
            and cc.node_id == self.local_id
            and self.local_id in self.registry.removed
        ):
            log.warning("member %x: %s", self.local_id, REMOVED_MESSAGE)
            self.removed.set()
        self._changed()

    def snapshot(self) -> bytes:
        return self.registry.snapshot()

    def restore(self, blob: bytes | None, conf_state: ConfState) -> None:
        self._conf_state = conf_state
        self.registry.restore(blob, conf_state)
        self._changed()

    def _changed(self) -> None:
        if self.transport is not None:
            members = list(self.registry.list())
            if self.local_id not in self.registry.members:
                # Not in the configuration yet (a joining node catching up, or a fresh one
                # before bootstrap): keep talking to the members we were told about.
                members += [
                    m for m in self.registry.known.values() if m.id not in self.registry.members
                ]
            self.transport.set_peers(
                {m.id: m.peer_urls[0] for m in members if m.peer_urls and m.id != self.local_id}
            )
        if self._on_change is not None:
            self._on_change(self.registry.list())

    def peer_removed(self) -> None:
        """A peer refused this member as removed (HTTP 410)."""
        if not self.removed.is_set():
            log.warning("member %x: a peer says %s", self.local_id, REMOVED_MESSAGE)
            self.removed.set()

    def members_json(self) -> dict:
        """``GET /raft/members`` (peer port): what a joining node needs."""
        return {
            "cluster_id": str(self.cluster_id),
            "members": [m.to_json() for m in self.registry.list()],
        }

    # lifecycle ---------------------------------------------------------------------------------

    def start(self, transport: Any) -> None:
        """Connect to the known members through ``transport`` and publish attributes."""
        self.transport = transport
        self._changed()
        self._task = asyncio.get_running_loop().create_task(
            self._publish_loop(), name=f"members-{self.local_id:x}"
        )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    async def wait_handed_over(self, timeout_s: float) -> None:
        """A removed leader keeps leading until the others have its log (raft core); give
        it that moment before the process exits."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.node.is_leader and loop.time() < deadline:
            await asyncio.sleep(0.02)

    async def _publish_loop(self) -> None:
        """Leader only: propose UPDATE_NODE for members whose attributes changed."""
        while True:
            await asyncio.sleep(PUBLISH_INTERVAL_S * (0.5 + random.random()))
            node = self.node
            if not node.is_leader or not node.conf_change_ready:
                continue
            for m in self.registry.list():
                if m.id == self.local_id:
                    attrs = (self.name, self.client_urls)
                else:
                    attrs = self.transport.peer_attributes.get(m.id)
                if attrs is None or (m.name, m.client_urls) == attrs:
                    continue
                ctx = {"id": m.id, "name": attrs[0], "clientURLs": list(attrs[1])}
                try:
                    async with self._lock:
                        await self._propose(
                            ConfChange(ConfChangeType.UPDATE_NODE, m.id, json.dumps(ctx).encode())
                        )
                except Exception as exc:  # tried again next round
                    log.debug("publishing attributes of %x failed: %s", m.id, exc)
                break  # one at a time; the registry is looked at again next round

    # client requests -------------------------------------------------------------------------

    def _header(self) -> ResponseHeader:
        return ResponseHeader(self.cluster_id, self.local_id, 0, self.node.term)

    async def member_list(self) -> MemberListResponse:
        return MemberListResponse(self._header(), self.registry.list())

    def _require_leader(self) -> None:
        if not self.node.is_leader:
            raise errors.no_leader() if self.node.leader == 0 else not_leader()

    async def _propose(self, cc: ConfChange) -> None:
        node = self.node
        if not node.conf_change_ready:
            # A new leader must apply its predecessors' entries before it may change the
            # configuration (raft would turn the proposal into a no-op).
            raise errors.ServiceError(
                GrpcCode.UNAVAILABLE, "etcdserver: leader changed", retryable=True
            )
        await node.propose_conf_change(cc)

    def _connected(self, mid: int) -> bool:
        if mid == self.local_id:
            return True
        return self.transport is not None and self.transport.is_connected(mid)

    def _ever_connected(self, mid: int) -> bool:
        return self.transport is not None and self.transport.ever_connected(mid)

    async def member_add(
        self, peer_urls: Iterable[str], is_learner: bool = False
    ) -> MemberAddResponse:
        urls = check_peer_urls(peer_urls)
        self._require_leader()
        async with self._lock:
            self._require_leader()
            mid = new_member_id(self.registry)
            check_add(self.registry, urls, is_learner, mid, self._connected)
            member = Member(mid, "", urls, (), is_learner)
            kind = ConfChangeType.ADD_LEARNER_NODE if is_learner else ConfChangeType.ADD_NODE
            await self._propose(ConfChange(kind, mid, json.dumps(member.to_json()).encode()))
        return MemberAddResponse(
            self._header(), self.registry.get(mid) or member, self.registry.list()
        )

    async def member_remove(self, mid: int) -> MemberChangeResponse:
        self._require_leader()
        async with self._lock:
            self._require_leader()
            check_remove(self.registry, mid, self.local_id, self._connected, self._ever_connected)
            await self._propose(ConfChange(ConfChangeType.REMOVE_NODE, mid))
        return MemberChangeResponse(self._header(), self.registry.list())

    async def member_promote(self, mid: int) -> MemberChangeResponse:
        self._require_leader()
        async with self._lock:
            self._require_leader()
            status = self.node.raw.status()
            progress = status.progress.get(mid)
            leader = status.progress.get(self.local_id)
            check_promote(
                self.registry,
                mid,
                progress.match if progress else None,
                leader.match if leader else 0,
            )
            learner = self.registry.get(mid)
            assert learner is not None  # check_promote refused an unknown member
            m = replace(learner, is_learner=False)
            await self._propose(
                ConfChange(ConfChangeType.ADD_NODE, mid, json.dumps(m.to_json()).encode())
            )
        return MemberChangeResponse(self._header(), self.registry.list())

    async def member_update(self, mid: int, peer_urls: Iterable[str]) -> MemberChangeResponse:
        urls = check_peer_urls(peer_urls)
        self._require_leader()
        async with self._lock:
            self._require_leader()
            check_update(self.registry, mid, urls)
            ctx = {"id": mid, "peerURLs": list(urls)}
            await self._propose(
                ConfChange(ConfChangeType.UPDATE_NODE, mid, json.dumps(ctx).encode())
            )
        return MemberChangeResponse(self._header(), self.registry.list())
