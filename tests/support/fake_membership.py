"""``LocalMembership``: the member API without raft, for ``tests/api/fakes.LocalKV`` and the
API tests.

Every change applies at once through the same registry (``MemberRegistry``) and the same
checks (``kvserver.membership.reconfig``) as the real service; every member counts as connected
and as in sync with the leader (``unsynced`` lists learners that are not).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from kvserver.kvpb.kv import ResponseHeader
from kvserver.kvpb.member import (
    Member,
    MemberAddResponse,
    MemberChangeResponse,
    MemberListResponse,
)
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


class LocalMembership:
    """The membership API without raft (see the module docstring)."""

    def __init__(self, local: Member, cluster_id: int, term: Callable[[], int] = lambda: 1):
        self.registry = MemberRegistry([local])
        self.local_id = local.id
        self.cluster_id = cluster_id
        self.unsynced: set[int] = set()
        self._term = term
        self._conf = ConfState(voters=(local.id,))
        self.registry.reconcile(self._conf)

    def _header(self) -> ResponseHeader:
        return ResponseHeader(self.cluster_id, self.local_id, 0, self._term())

    def _apply(self, cc: ConfChange) -> None:
        voters, learners = set(self._conf.voters), set(self._conf.learners)
        if cc.type == ConfChangeType.ADD_NODE:
            learners.discard(cc.node_id)
            voters.add(cc.node_id)
        elif cc.type == ConfChangeType.ADD_LEARNER_NODE:
            learners.add(cc.node_id)
        elif cc.type == ConfChangeType.REMOVE_NODE and voters - {cc.node_id}:
            voters.discard(cc.node_id)
            learners.discard(cc.node_id)
        self._conf = ConfState(voters=tuple(sorted(voters)), learners=tuple(sorted(learners)))
        self.registry.apply(cc, self._conf)

    async def member_list(self) -> MemberListResponse:
        return MemberListResponse(self._header(), self.registry.list())

    async def member_add(self, peer_urls, is_learner: bool = False) -> MemberAddResponse:
        urls = check_peer_urls(peer_urls)
        mid = new_member_id(self.registry)
        check_add(self.registry, urls, is_learner, mid, lambda _: True)
        member = Member(mid, "", urls, (), is_learner)
        kind = ConfChangeType.ADD_LEARNER_NODE if is_learner else ConfChangeType.ADD_NODE
        self._apply(ConfChange(kind, mid, json.dumps(member.to_json()).encode()))
        return MemberAddResponse(self._header(), self.registry.get(mid), self.registry.list())

    async def member_remove(self, mid: int) -> MemberChangeResponse:
        check_remove(self.registry, mid, self.local_id, lambda _: True, lambda _: True)
        self._apply(ConfChange(ConfChangeType.REMOVE_NODE, mid))
        return MemberChangeResponse(self._header(), self.registry.list())

    async def member_promote(self, mid: int) -> MemberChangeResponse:
        check_promote(self.registry, mid, None if mid in self.unsynced else 1, 1)
        self._apply(ConfChange(ConfChangeType.ADD_NODE, mid))
        return MemberChangeResponse(self._header(), self.registry.list())

    async def member_update(self, mid: int, peer_urls) -> MemberChangeResponse:
        urls = check_peer_urls(peer_urls)
        check_update(self.registry, mid, urls)
        self._apply(
            ConfChange(
                ConfChangeType.UPDATE_NODE,
                mid,
                json.dumps({"id": mid, "peerURLs": list(urls)}).encode(),
            )
        )
        return MemberChangeResponse(self._header(), self.registry.list())
