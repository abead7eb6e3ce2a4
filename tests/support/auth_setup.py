"""Auth turned on in a running cluster, for tests of what it then allows and refuses.

``enable_auth(member, app=...)`` proposes through ``member``'s auth service, in this order:
user ``root`` (password ``rootpw``) with role ``root``; role ``app`` with the permissions
``app`` (when ``app`` is given, even empty); user ``alice`` (password ``alicepw``), holding
role ``app`` when there is one and no role otherwise; then AuthEnable. Each proposal must
succeed. It returns ``Tokens(root, alice)``: a fresh simple token for each, as
Authenticate answers (gRPC clients send one as ``token`` metadata).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from kvserver.assembly.member import Member
from kvserver.auth import store as S
from kvserver.auth.perms import Permission
from tests.support.wait import async_wait_for


class Tokens(NamedTuple):
    root: str
    alice: str


async def enable_auth(member: Member, app: Iterable[Permission] | None = None) -> Tokens:
    assert member.kv is not None, "a started member"
    auth = member.kv.auth
    requests: list[object] = [
        S.UserAdd("root", await auth.hash_password("rootpw")),
        S.UserGrantRole("root", "root"),
    ]
    if app is not None:
        requests.append(S.RoleAdd("app"))
        requests.extend(S.RoleGrantPermission("app", perm) for perm in app)
    requests.append(S.UserAdd("alice", await auth.hash_password("alicepw")))
    if app is not None:
        requests.append(S.UserGrantRole("alice", "app"))
    requests.append(S.AuthEnable())
    for req in requests:
        result = await auth.propose(req)
        assert not isinstance(result, Exception), (req, result)
    root = await auth.authenticate("root", "rootpw", "127.0.0.1")
    alice = await auth.authenticate("alice", "alicepw", "127.0.0.1")
    return Tokens(root, alice)


async def caught_up(member: Member, leader: Member, timeout_s: float = 15.0) -> None:
    """Until ``member`` has applied all the leader has: the tokens ``enable_auth`` returns are
    entries of their own, after auth was enabled, and a member that has not applied them
    answers their holder as an unknown token's."""
    applied = leader.node.applied
    await async_wait_for(lambda: member.node.applied >= applied, timeout_s, "caught up")
