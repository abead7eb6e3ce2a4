"""Membership calls of the client: etcd's Cluster service over the JSON gateway.

``member_add(peer_urls, is_learner=...)`` -> ``MemberAddResult`` (the new member, with the ID the
leader chose, and the members after the change); ``member_remove(id)`` and ``member_promote(id)``
-> ``MemberChangeResult`` (the members after the change). They go to the leader (a follower
would forward them anyway). A change is not idempotent: a retry after an ambiguous failure
(a timeout) may be told ``etcdserver: Peer URLs already exists`` / ``member not found`` although
the first attempt did it — check ``member_list`` then. ``member_list`` stays in ``aio``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvserver.client import codec
from kvserver.client.errors import ResponseFormatError
from kvserver.client.types import Member
from kvserver.kvpb.kv import ResponseHeader

ADD_PATH = "/v3/cluster/member/add"
REMOVE_PATH = "/v3/cluster/member/remove"
PROMOTE_PATH = "/v3/cluster/member/promote"


@dataclass(frozen=True, slots=True)
class MemberAddResult:
    header: ResponseHeader
    member: Member
    members: tuple[Member, ...]


@dataclass(frozen=True, slots=True)
class MemberChangeResult:
    header: ResponseHeader
    members: tuple[Member, ...]


def encode_add(peer_urls: Sequence[str], is_learner: bool) -> dict[str, Any]:
    if isinstance(peer_urls, str):
        peer_urls = [u for u in peer_urls.split(",") if u]
    urls = [str(u) for u in peer_urls]
    if not urls:
        raise ValueError("member add needs at least one peer URL")
    body: dict[str, Any] = {"peerURLs": urls}
    if is_learner:
        body["isLearner"] = True
    return body


def encode_id(member_id: int) -> dict[str, Any]:
    if not 0 < member_id < 1 << 64:
        raise ValueError(f"bad member id {member_id}")
    return {"ID": str(member_id)}


def _doc(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise ResponseFormatError("member response: expected a JSON object")
    return raw


def decode_add(raw: Any) -> MemberAddResult:
    doc = _doc(raw)
    return MemberAddResult(
        codec.decode_header(doc.get("header")),
        codec.decode_member(doc.get("member")),
        codec.decode_members(doc),
    )


def decode_change(raw: Any) -> MemberChangeResult:
    doc = _doc(raw)
    return MemberChangeResult(codec.decode_header(doc.get("header")), codec.decode_members(doc))


def parse_member_id(text: str) -> int:
    """A member ID as the CLI takes it: hexadecimal, as ``member list`` shows it (etcdctl's
    form)."""
    text = text.strip().lower()
    try:
        value = int(text, 16)
    except ValueError:
        raise ValueError(f"bad member id {text!r}: want hexadecimal") from None
    if not 0 < value < 1 << 64:
        raise ValueError(f"bad member id {text!r}")
    return value
