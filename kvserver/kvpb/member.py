"""Member messages (etcd's etcdserverpb Cluster service) that a client sends or receives.

``Member`` is one member of the cluster: its ID (a non-zero 64-bit integer), name (empty until
the member has started and published it), peer URLs, client URLs and whether it is a learner.
``Member.to_json`` / ``from_json`` give etcd's ``membership.Member`` JSON (``{"id", "name",
"peerURLs", "clientURLs", "isLearner"}``), the shape a conf-change entry's context and a peer's
``GET /raft/members`` carry too. The responses list the members after the request, sorted by
ID; ``MemberAddResponse.member`` is the member just added.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvserver.kvpb.kv import ResponseHeader

__all__ = ["Member", "MemberAddResponse", "MemberChangeResponse", "MemberListResponse"]


@dataclass(frozen=True, slots=True)
class Member:
    id: int
    name: str
    peer_urls: tuple[str, ...]
    client_urls: tuple[str, ...] = ()
    is_learner: bool = False

    def to_json(self) -> dict[str, Any]:
        """etcd's membership.Member JSON (the conf-change context)."""
        return {
            "id": self.id,
            "name": self.name,
            "peerURLs": list(self.peer_urls),
            "clientURLs": list(self.client_urls),
            "isLearner": self.is_learner,
        }

    @staticmethod
    def from_json(obj: dict[str, Any]) -> Member:
        return Member(
            int(obj["id"]),
            str(obj.get("name") or ""),
            tuple(obj.get("peerURLs") or ()),
            tuple(obj.get("clientURLs") or ()),
            bool(obj.get("isLearner", False)),
        )


@dataclass(frozen=True, slots=True)
class MemberListResponse:
    header: ResponseHeader
    members: tuple[Member, ...]


@dataclass(frozen=True, slots=True)
class MemberAddResponse:
    header: ResponseHeader
    member: Member
    members: tuple[Member, ...]


@dataclass(frozen=True, slots=True)
class MemberChangeResponse:
    """member/remove, member/promote, member/update: the members after the change."""

    header: ResponseHeader
    members: tuple[Member, ...] = field(default=())
