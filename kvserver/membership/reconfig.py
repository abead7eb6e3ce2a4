"""etcd's reconfiguration checks, with etcd's texts and the gRPC codes its gateway answers.

Pure functions of the registry (so they are testable without a cluster): the leader's
membership service runs them before it proposes a conf change, and so does the test double of
the member API. They follow etcd's ``--strict-reconfig-check``: adding or promoting a voter
needs a quorum of *started* members (a name published) in the configuration after the change,
and every voter connected; removing a voter must leave a quorum of started and of connected
members (a member that never connected may always be removed); a learner must be within
``LEARNER_READY_PERCENT`` of the leader's log before promotion; at most ``MAX_LEARNERS``
learners. Each check raises ``kvserver.kvpb.service_errors.ServiceError`` with etcd's text
(``MSG_*``); ``new_member_id`` picks the ID of a member to add.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from kvserver.kvpb.service_errors import GrpcCode, ServiceError
from kvserver.membership.identity import ClusterConfigError, check_url
from kvserver.membership.registry import MemberRegistry

__all__ = [
    "MAX_LEARNERS",
    "check_add",
    "check_peer_urls",
    "check_promote",
    "check_remove",
    "check_update",
    "member_not_found",
    "new_member_id",
]

MAX_LEARNERS = 1  # etcd 3.4's limit
LEARNER_READY_PERCENT = 0.9  # etcd: a learner within 90 % of the leader's match

# etcd's texts (api/v3rpc/rpctypes/error.go) and the codes its gateway answers them with.
MSG_MEMBER_NOT_FOUND = "etcdserver: member not found"
MSG_MEMBER_EXIST = "etcdserver: member ID already exist"
MSG_PEER_URL_EXIST = "etcdserver: Peer URLs already exists"
MSG_BAD_URLS = "etcdserver: given member URLs are invalid"
MSG_NOT_ENOUGH_STARTED = "etcdserver: re-configuration failed due to not enough started members"
MSG_LEARNER_NOT_READY = "etcdserver: can only promote a learner member which is in sync with leader"
MSG_NOT_LEARNER = "etcdserver: can only promote a learner member"
MSG_TOO_MANY_LEARNERS = "etcdserver: too many learner members in cluster"
MSG_UNHEALTHY = "etcdserver: unhealthy cluster"


def member_not_found() -> ServiceError:
    return ServiceError(GrpcCode.NOT_FOUND, MSG_MEMBER_NOT_FOUND)


def _precondition(message: str) -> ServiceError:
    return ServiceError(GrpcCode.FAILED_PRECONDITION, message)


def check_peer_urls(peer_urls: Iterable[str]) -> tuple[str, ...]:
    out = []
    for url in peer_urls:
        try:
            out.append(check_url(url))
        except (ClusterConfigError, ValueError):
            raise ServiceError(GrpcCode.INVALID_ARGUMENT, MSG_BAD_URLS) from None
    if not out:
        raise ServiceError(GrpcCode.INVALID_ARGUMENT, MSG_BAD_URLS)
    return tuple(out)


def _quorum_ok(
    registry: MemberRegistry, *, plus_new: bool = False, new_started: bool = False, skip: int = 0
) -> bool:
    """etcd's IsReadyTo{Add,Remove,Promote}VotingMember: enough *started* voters for a
    quorum of the configuration after the change."""
    voters = [m for m in registry.voters() if m.id != skip]
    nmembers = len(voters) + int(plus_new)
    nstarted = sum(1 for m in voters if m.name) + int(plus_new and new_started)
    if plus_new and nmembers == 2 and nstarted == 1 + int(new_started):
        return True  # etcd: growing a one-member cluster (restoring from a backup)
    return nstarted >= nmembers // 2 + 1


def check_add(
    registry: MemberRegistry,
    peer_urls: tuple[str, ...],
    is_learner: bool,
    new_id: int,
    connected: Callable[[int], bool],
) -> None:
    """etcd's ValidateConfigurationChange + mayAddMember for a new member."""
    if new_id in registry.members or new_id in registry.removed:
        raise _precondition(MSG_MEMBER_EXIST)
    taken = {u for m in registry.list() for u in m.peer_urls}
    if taken & set(peer_urls):
        raise _precondition(MSG_PEER_URL_EXIST)
    if is_learner and len(registry.learners()) >= MAX_LEARNERS:
        raise _precondition(MSG_TOO_MANY_LEARNERS)
    if not is_learner and not _quorum_ok(registry, plus_new=True):
        raise ServiceError(GrpcCode.UNKNOWN, MSG_NOT_ENOUGH_STARTED)
    if not all(connected(m.id) for m in registry.voters()):
        raise ServiceError(GrpcCode.UNAVAILABLE, MSG_UNHEALTHY)


def check_remove(
    registry: MemberRegistry,
    mid: int,
    local_id: int,
    connected: Callable[[int], bool],
    ever_connected: Callable[[int], bool],
) -> None:
    """etcd's ValidateConfigurationChange + mayRemoveMember."""
    m = registry.get(mid)
    if m is None:
        raise member_not_found()
    if m.is_learner:
        return  # a learner is not part of any quorum
    if not _quorum_ok(registry, skip=mid):
        raise ServiceError(GrpcCode.UNKNOWN, MSG_NOT_ENOUGH_STARTED)
    if mid != local_id and not ever_connected(mid):
        return  # a member that never came up is safe to remove
    voters = registry.voters()
    active = sum(1 for v in voters if connected(v.id))
    if active - 1 < 1 + (len(voters) - 1) // 2:
        raise ServiceError(GrpcCode.UNAVAILABLE, MSG_UNHEALTHY)


def check_promote(
    registry: MemberRegistry, mid: int, learner_match: int | None, leader_match: int
) -> None:
    """etcd's mayPromoteMember: a learner, in sync with the leader, with a started quorum."""
    m = registry.get(mid)
    if m is None:
        raise member_not_found()
    if not m.is_learner:
        raise _precondition(MSG_NOT_LEARNER)
    if learner_match is None or learner_match < leader_match * LEARNER_READY_PERCENT:
        raise _precondition(MSG_LEARNER_NOT_READY)
    if not _quorum_ok(registry, plus_new=True, new_started=True, skip=mid):
        raise ServiceError(GrpcCode.UNKNOWN, MSG_NOT_ENOUGH_STARTED)


def check_update(registry: MemberRegistry, mid: int, peer_urls: tuple[str, ...]) -> None:
    """etcd's ValidateConfigurationChange for new peer URLs of an existing member."""
    if registry.get(mid) is None:
        raise member_not_found()
    taken = {u for m in registry.list() if m.id != mid for u in m.peer_urls}
    if taken & set(peer_urls):
        raise _precondition(MSG_PEER_URL_EXIST)


def new_member_id(registry: MemberRegistry) -> int:
    """A fresh ID (etcd hashes the URLs with the time; a random one is as unique)."""
    while True:
        mid = int.from_bytes(os.urandom(8), "big")
        if mid and mid not in registry.members and mid not in registry.removed:
            return mid
