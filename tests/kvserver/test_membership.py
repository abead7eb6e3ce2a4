"""Membership (``kvserver.membership``): the registry's conf-change application, its snapshot
frame and its compatibility with snapshots made before it, etcd's reconfiguration checks,
identity from the WAL and from the running cluster."""

import json

import pytest

from kvserver.kvpb.kv import PutRequest
from kvserver.kvpb.member import Member
from kvserver.kvpb.service_errors import ServiceError
from kvserver.membership import discovery
from kvserver.membership.discovery import discover_cluster, read_wal_identity
from kvserver.membership.identity import ClusterConfigError
from kvserver.membership.reconfig import (
    MSG_BAD_URLS,
    MSG_LEARNER_NOT_READY,
    MSG_MEMBER_EXIST,
    MSG_MEMBER_NOT_FOUND,
    MSG_NOT_ENOUGH_STARTED,
    MSG_NOT_LEARNER,
    MSG_PEER_URL_EXIST,
    MSG_TOO_MANY_LEARNERS,
    MSG_UNHEALTHY,
    check_add,
    check_peer_urls,
    check_promote,
    check_remove,
)
from kvserver.membership.registry import (
    MemberRegistry,
    MembersFrameError,
    frame_members,
    split_members_frame,
)
from kvserver.membership.service import MembershipService
from kvserver.mvcc.store import MVCCStore
from kvserver.server.node import Node
from raft import ConfChange, ConfChangeType, ConfState

A = Member(1, "a", ("http://h:1",))
B = Member(2, "b", ("http://h:2",))
C = Member(3, "c", ("http://h:3",))


def cs(voters=(), learners=()):
    return ConfState(voters=tuple(voters), learners=tuple(learners))


def ctx(m: Member) -> bytes:
    return json.dumps(m.to_json()).encode()


def bootstrapped() -> MemberRegistry:
    reg = MemberRegistry([A, B, C])
    for i, m in enumerate((A, B, C)):
        reg.apply(ConfChange(ConfChangeType.ADD_NODE, m.id), cs([1, 2, 3][: i + 1]))
    return reg


def test_bootstrap_entries_take_attributes_from_initial_cluster():
    reg = bootstrapped()
    assert reg.list() == (A, B, C)
    assert all(reg.is_started(m.id) for m in (A, B, C))


def test_add_learner_publish_promote_remove():
    reg = bootstrapped()
    d = Member(40, "", ("http://h:4",), (), True)
    reg.apply(ConfChange(ConfChangeType.ADD_LEARNER_NODE, 40, ctx(d)), cs([1, 2, 3], [40]))
    assert reg.get(40) == d and not reg.is_started(40) and reg.learners() == [d]
    attrs = json.dumps({"id": 40, "name": "d", "clientURLs": ["http://c:4"]}).encode()
    reg.apply(ConfChange(ConfChangeType.UPDATE_NODE, 40, attrs), cs([1, 2, 3], [40]))
    assert reg.get(40) == Member(40, "d", ("http://h:4",), ("http://c:4",), True)
    reg.apply(ConfChange(ConfChangeType.ADD_NODE, 40, b""), cs([1, 2, 3, 40]))
    assert not reg.get(40).is_learner and reg.get(40).name == "d"
    reg.apply(ConfChange(ConfChangeType.REMOVE_NODE, 2), cs([1, 3, 40]))
    assert [m.id for m in reg.list()] == [1, 3, 40] and 2 in reg.removed
    # an update of a removed member changes nothing
    reg.apply(ConfChange(ConfChangeType.UPDATE_NODE, 2, attrs), cs([1, 3, 40]))
    assert reg.get(2) is None


def test_a_change_raft_ignored_is_ignored_too():
    reg = MemberRegistry([A])
    reg.apply(ConfChange(ConfChangeType.ADD_NODE, 1), cs([1]))
    # removing the last voter: raft keeps it (ConfState unchanged), so do we
    reg.apply(ConfChange(ConfChangeType.REMOVE_NODE, 1), cs([1]))
    assert reg.list() == (A,) and not reg.removed
    # garbage context: the member is still added (from what is known)
    reg.apply(ConfChange(ConfChangeType.ADD_NODE, 2, b"{not json"), cs([1, 2]))
    assert reg.get(2) == Member(2, "", ())


def test_snapshot_round_trip_and_frame():
    reg = bootstrapped()
    reg.apply(
        ConfChange(
            ConfChangeType.ADD_LEARNER_NODE, 9, ctx(Member(9, "", ("http://h:9",), (), True))
        ),
        cs([1, 2, 3], [9]),
    )
    reg.apply(ConfChange(ConfChangeType.REMOVE_NODE, 2), cs([1, 3], [9]))
    blob = reg.snapshot()
    other = MemberRegistry()
    other.restore(blob, cs([1, 3], [9]))
    assert other.list() == reg.list() and other.removed == {2}

    data = frame_members(blob) + b"rest-of-the-state"
    got, rest = split_members_frame(data)
    assert got == blob and bytes(rest) == b"rest-of-the-state"
    with pytest.raises(MembersFrameError):
        split_members_frame(data[:10])
    with pytest.raises(MembersFrameError):
        split_members_frame(frame_members(b"x" * 100)[:50])
    with pytest.raises(MembersFrameError):
        other.restore(b'{"format": 99}', cs([1]))


def test_snapshot_without_frame_rebuilds_from_conf_state_and_flags():
    old = b"\x81\xa1x\x01"  # any state machine image (an MVCC stream starts with a map)
    blob, rest = split_members_frame(old)
    assert blob is None and bytes(rest) == old
    reg = MemberRegistry([A, B, C])
    reg.restore(None, cs([1, 3], [7]))
    assert reg.list() == (A, C, Member(7, "", (), (), True))


class _SM:
    """A state machine recording what it was restored from."""

    def __init__(self):
        self.store = MVCCStore()
        self.restored = None

    def snapshot_chunks(self, chunk_size_bytes=64 * 1024):
        yield from self.store.serialize(chunk_size_bytes)

    async def install_snapshot(self, data):
        self.restored = bytes(data)
        self.store = MVCCStore.restore([bytes(data)])


async def test_node_frames_the_registry_in_front_of_the_state_machine():
    sm = _SM()
    sm.store.apply(PutRequest(b"k", b"v"))
    reg = bootstrapped()
    node = Node.__new__(Node)  # only the snapshot-data helpers are exercised
    node.sm, node.members = (
        sm,
        MembershipService(
            registry=reg, node=None, local_id=1, cluster_id=5, name="a", client_urls=()
        ),
    )
    image = frame_members(reg.snapshot()) + b"".join(sm.snapshot_chunks())
    fresh = MembershipService(
        registry=MemberRegistry(), node=None, local_id=1, cluster_id=5, name="a", client_urls=()
    )
    node.members = fresh
    await node.restore_snapshot_data(image, cs([1, 2, 3]))
    assert fresh.registry.list() == reg.list()
    assert sm.restored == b"".join(MVCCStore.restore([sm.restored]).serialize())
    # an old image (no frame) goes to the state machine unchanged
    plain = b"".join(sm.snapshot_chunks())
    await node.restore_snapshot_data(plain, cs([1, 2, 3]))
    assert sm.restored == plain


def _registry(started=(1, 2, 3), voters=(1, 2, 3), learners=()):
    reg = MemberRegistry()
    for mid in (*voters, *learners):
        reg.members[mid] = Member(
            mid, f"m{mid}" if mid in started else "", (f"http://h:{mid}",), (), mid in learners
        )
    return reg


def _err(fn, *args):
    with pytest.raises(ServiceError) as exc:
        fn(*args)
    return exc.value.message


def test_add_checks():
    ok = lambda _: True  # noqa: E731
    reg = _registry()
    check_add(reg, ("http://h:9",), False, 9, ok)
    assert _err(check_add, reg, ("http://h:1",), True, 9, ok) == MSG_PEER_URL_EXIST
    assert _err(check_add, reg, ("http://h:9",), False, 1, ok) == MSG_MEMBER_EXIST
    assert (
        _err(check_add, _registry(started=(1,)), ("http://h:9",), False, 9, ok)
        == MSG_NOT_ENOUGH_STARTED
    )
    assert _err(check_add, reg, ("http://h:9",), True, 9, lambda m: m != 2) == MSG_UNHEALTHY
    with_learner = _registry(voters=(1, 2, 3), learners=(4,))
    assert _err(check_add, with_learner, ("http://h:9",), True, 9, ok) == MSG_TOO_MANY_LEARNERS
    check_add(_registry(voters=(1,), started=(1,)), ("http://h:9",), False, 9, ok)
    assert _err(check_peer_urls, ["ftp://x"]) == MSG_BAD_URLS
    assert _err(check_peer_urls, []) == MSG_BAD_URLS


def test_remove_checks():
    ok = lambda _: True  # noqa: E731
    reg = _registry()
    check_remove(reg, 2, 1, ok, ok)
    assert _err(check_remove, reg, 7, 1, ok, ok) == MSG_MEMBER_NOT_FOUND
    # 2 of 3 started; removing a started one leaves 1 of 2: not enough
    assert _err(check_remove, _registry(started=(1, 2)), 2, 1, ok, ok) == MSG_NOT_ENOUGH_STARTED
    # one voter down: removing another connected voter would leave no quorum connected
    down = lambda m: m != 3  # noqa: E731
    assert _err(check_remove, reg, 2, 1, down, ok) == MSG_UNHEALTHY
    # ... but the down member itself may go, and one that never connected too
    check_remove(reg, 3, 1, down, lambda m: m != 3)
    check_remove(_registry(learners=(4,)), 4, 1, lambda _: False, ok)  # learners: always


def test_promote_checks():
    reg = _registry(learners=(4,))
    check_promote(reg, 4, 90, 100)
    assert _err(check_promote, reg, 4, 89, 100) == MSG_LEARNER_NOT_READY
    assert _err(check_promote, reg, 4, None, 100) == MSG_LEARNER_NOT_READY
    assert _err(check_promote, reg, 1, 100, 100) == MSG_NOT_LEARNER
    assert _err(check_promote, reg, 8, 100, 100) == MSG_MEMBER_NOT_FOUND
    assert (
        _err(check_promote, _registry(started=(1,), learners=(4,)), 4, 100, 100)
        == MSG_NOT_ENOUGH_STARTED
    )


def test_wal_identity(tmp_path):
    import wal
    from kvserver.membership.identity import encode_metadata

    assert read_wal_identity(str(tmp_path / "none")) is None
    w = wal.create(str(tmp_path / "wal"), encode_metadata(0xABC, 0xDEF))
    w.close()
    assert read_wal_identity(str(tmp_path / "wal")) == (0xABC, 0xDEF)


async def test_discovery_refuses_an_unknown_member_and_gives_up_in_time():
    with pytest.raises(ClusterConfigError, match="no other member"):
        await discover_cluster(("http://h:1",), ["http://h:1"])
    with pytest.raises(ClusterConfigError, match="cannot reach"):
        await discover_cluster(("http://127.0.0.1:1",), ["http://127.0.0.1:9"], timeout_s=0.3)


async def test_discovery_waits_for_a_member_that_has_not_applied_the_add_yet(monkeypatch):
    """`member add` answers once the leader applied it; a member asked a moment later may
    still list the cluster without the newcomer. That answer is not final: the joiner asks
    again (and the others), and fails only if it stays unlisted for the grace period."""
    from aiohttp import web
    from aiohttp.test_utils import TestServer

    me = ("http://127.0.0.1:1",)
    old = [Member(1, "a", ("http://127.0.0.1:2",))]
    answers = {"count": 0}

    async def members(request):
        answers["count"] += 1
        listed = old + ([Member(9, "me", me)] if answers["count"] >= 3 else [])
        return web.json_response({"cluster_id": "77", "members": [m.to_json() for m in listed]})

    app = web.Application()
    app.router.add_get("/raft/members", members)
    async with TestServer(app, host="127.0.0.1") as server:
        url = str(server.make_url("")).rstrip("/")
        got = await discover_cluster(me, [url], timeout_s=10)
        assert got[0] == 9 and got[1] == 77 and answers["count"] == 3
        monkeypatch.setattr(discovery, "NOT_LISTED_GRACE_S", 0.5)
        answers["count"] = -(10**9)  # never listed from now on
        with pytest.raises(ClusterConfigError, match="not in the cluster's member list"):
            await discover_cluster(me, [url], timeout_s=10)
