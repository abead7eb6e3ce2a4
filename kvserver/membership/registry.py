"""Cluster membership: member IDs, the replicated member registry, and the membership service.

Identity. ``--initial-cluster`` is ``name1=http://127.0.0.1:2380,name2=http://...``. An initial
member's ID is a hash of its sorted peer URLs and the cluster token, so every node computes the
same IDs from the same flags without talking to the others; the cluster ID is a hash of the
sorted initial member IDs. IDs are non-zero 64-bit integers (raft uses 0 for "none"). Peers
check the cluster ID on every connection, so nodes of two clusters never exchange messages. A
member added later gets a fresh random ID from the leader (``member add`` answers it); the new
node, started with ``--initial-cluster-state existing``, learns its own ID and the cluster ID
from the running members (``discover_cluster``: ``GET /raft/members`` on their peer URLs,
matching its own peer URLs, as etcd does). A restarted node takes both from its WAL metadata
(``read_wal_identity``), never from the flags.

Registry (``MemberRegistry``): member ID -> name, peer URLs, client URLs, learner flag. It is
replicated state: it changes only when a conf-change entry is applied, identically on every
node. The entry's ``context`` carries the member as JSON (etcd's shape: ``{"id", "name",
"peerURLs", "clientURLs", "isLearner"}``): ADD_NODE / ADD_LEARNER_NODE add (or promote) a member,
REMOVE_NODE removes it for good (its ID can never come back), UPDATE_NODE changes attributes
(name and client URLs published by the member, or peer URLs). Which IDs are members, and which
of them are learners, always follows the raft ``ConfState`` the change produced (so a change
raft ignored is ignored here too). Entries without context (the bootstrap entries of a new
cluster) take names and peer URLs from ``--initial-cluster``.

Snapshots. The registry travels in the state machine snapshot as a frame in front of the rest:
``MEMBERS_FRAME_MAGIC | len (uint32 big-endian) | JSON``. A snapshot without the frame (made
before the registry existed) still restores: the registry is rebuilt from the snapshot's
ConfState and ``--initial-cluster`` (``split_members_frame`` returns ``None`` for it).

Attributes. A member's name and client URLs reach the registry through the leader: every peer
stream carries the sender's name and client URLs in its headers, and the leader proposes an
UPDATE_NODE for any member whose registry entry differs (its own included). One proposer (the
leader's ``MembershipService``, under one lock) means publications never collide with client
conf changes under raft's one-pending-change rule. A member is *started* once it has a name.

Service (``MembershipService``): ``member_list`` is answered by any member from its registry;
``member_add|remove|promote|update`` are answered by the leader (a follower raises etcd's
``not leader``, retryable) after etcd's checks with etcd's texts (``--strict-reconfig-check``
semantics: quorum of started members, all voters connected, a learner must be within 90 % of
the leader's log before promotion, at most ``MAX_LEARNERS`` learners), then propose the conf
change and answer once it is applied on the leader. The service keeps the peer transport in
step with the registry (connect to a new member, close a removed one) and sets ``removed``
when this member is removed (it applied its own removal, or a peer refused it with 410): the
server then stops with etcd's message ``the member has been permanently removed from the
cluster``; a removed leader first waits (bounded) until it has handed leadership over.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from kvserver.kvpb import service_errors as errors
from kvserver.kvpb.kv import ResponseHeader
from kvserver.kvpb.service_errors import GrpcCode, ServiceError
from raft import ConfChange, ConfChangeType, ConfState

log = logging.getLogger(__name__)

MEMBERS_FRAME_MAGIC = b"RKVMEMB1"
_FRAME_HEADER_BYTES = len(MEMBERS_FRAME_MAGIC) + 4
REGISTRY_FORMAT = 1
MAX_LEARNERS = 1  # etcd 3.4's limit
LEARNER_READY_PERCENT = 0.9  # etcd: a learner within 90 % of the leader's match
PUBLISH_INTERVAL_S = 0.2  # the leader's look at members' attributes
REMOVED_MESSAGE = "the member has been permanently removed from the cluster"

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


def not_leader() -> ServiceError:
    return ServiceError(GrpcCode.UNAVAILABLE, "etcdserver: not leader", retryable=True)


class ClusterConfigError(ValueError):
    """The --initial-cluster / URL flags are malformed or inconsistent."""


@dataclass(frozen=True, slots=True)
class Member:
    id: int
    name: str
    peer_urls: tuple[str, ...]
    client_urls: tuple[str, ...] = ()
    is_learner: bool = False

    def to_json(self) -> dict:
        """etcd's membership.Member JSON (the conf-change context)."""
        return {
            "id": self.id,
            "name": self.name,
            "peerURLs": list(self.peer_urls),
            "clientURLs": list(self.client_urls),
            "isLearner": self.is_learner,
        }

    @staticmethod
    def from_json(obj: dict) -> Member:
        return Member(
            int(obj["id"]),
            str(obj.get("name") or ""),
            tuple(obj.get("peerURLs") or ()),
            tuple(obj.get("clientURLs") or ()),
            bool(obj.get("isLearner", False)),
        )


def _hash64(*parts: bytes) -> int:
    digest = hashlib.sha1(b"".join(parts)).digest()
    value = int.from_bytes(digest[:8], "big")
    return value or 1


def member_id(peer_urls: tuple[str, ...] | list[str], cluster_token: str) -> int:
    urls = "".join(sorted(peer_urls)).encode()
    return _hash64(urls, cluster_token.encode())


def cluster_id(member_ids) -> int:
    return _hash64(*(i.to_bytes(8, "big") for i in sorted(member_ids)))


def check_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or not parts.port:
        raise ClusterConfigError(f"bad URL {url!r}: want scheme://host:port")
    return url.rstrip("/")


def parse_initial_cluster(text: str, cluster_token: str) -> list[Member]:
    """Parse ``name=url[,name=url...]`` (a name may repeat to give several URLs)."""
    urls_by_name: dict[str, list[str]] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, url = item.partition("=")
        if not sep or not name:
            raise ClusterConfigError(f"bad --initial-cluster item {item!r}: want name=url")
        urls_by_name.setdefault(name, []).append(check_url(url))
    if not urls_by_name:
        raise ClusterConfigError("--initial-cluster is empty")
    members = [
        Member(member_id(urls, cluster_token), name, tuple(urls))
        for name, urls in urls_by_name.items()
    ]
    if len({m.id for m in members}) != len(members):
        raise ClusterConfigError("two members of --initial-cluster share the same peer URLs")
    return sorted(members, key=lambda m: m.id)


# --- snapshot frame -------------------------------------------------------------------------


class MembersFrameError(ValueError):
    """A snapshot's member frame is truncated or unreadable."""


def frame_members(blob: bytes) -> bytes:
    return MEMBERS_FRAME_MAGIC + len(blob).to_bytes(4, "big") + blob


def split_members_frame(data: bytes | memoryview) -> tuple[bytes | None, memoryview]:
    """``(registry blob, rest)``; ``(None, data)`` for a snapshot without the frame."""
    view = memoryview(data)
    if view[: len(MEMBERS_FRAME_MAGIC)] != MEMBERS_FRAME_MAGIC:
        return None, view
    if len(view) < _FRAME_HEADER_BYTES:
        raise MembersFrameError("truncated member frame")
    n = int.from_bytes(view[len(MEMBERS_FRAME_MAGIC) : _FRAME_HEADER_BYTES], "big")
    end = _FRAME_HEADER_BYTES + n
    if len(view) < end:
        raise MembersFrameError("truncated member frame")
    return bytes(view[_FRAME_HEADER_BYTES:end]), view[end:]


# --- the replicated registry ------------------------------------------------------------------


class MemberRegistry:
    """Replicated member table; see the module docstring. Not thread-safe (raft task only)."""

    def __init__(self, known: Iterable[Member] = ()):
        # Attributes for IDs that appear in conf changes without context (bootstrap entries).
        self.known: dict[int, Member] = {m.id: m for m in known}
        self.members: dict[int, Member] = {}
        self.removed: set[int] = set()

    def list(self) -> tuple[Member, ...]:
        return tuple(self.members[i] for i in sorted(self.members))

    def get(self, mid: int) -> Member | None:
        return self.members.get(mid)

    def _placeholder(self, mid: int) -> Member:
        return self.known.get(mid) or Member(mid, "", ())

    def apply(self, cc: ConfChange, conf_state: ConfState) -> None:
        """Apply a committed conf change; ``conf_state`` is what raft made of it."""
        ctx = None
        if cc.context:
            try:
                obj = json.loads(cc.context)
                ctx = obj if isinstance(obj, dict) else None
            except ValueError:
                log.warning("conf change %s: unreadable context ignored", cc)
        mid = cc.node_id
        if cc.type == ConfChangeType.UPDATE_NODE:
            m = self.members.get(mid)
            if m is not None and ctx is not None:
                self.members[mid] = _merge(m, ctx)
        elif cc.type in (ConfChangeType.ADD_NODE, ConfChangeType.ADD_LEARNER_NODE):
            m = self.members.get(mid) or self._placeholder(mid)
            if ctx is not None:
                m = _merge(m, ctx)
            if mid in conf_state.voters or mid in conf_state.learners:
                self.members[mid] = m
                self.removed.discard(mid)
        elif cc.type == ConfChangeType.REMOVE_NODE:
            if mid not in conf_state.voters and mid not in conf_state.learners and mid:
                self.members.pop(mid, None)
                self.removed.add(mid)
        self.reconcile(conf_state)

    def reconcile(self, conf_state: ConfState) -> None:
        """Make the set of members and learner flags agree with ``conf_state``."""
        ids = set(conf_state.voters) | set(conf_state.learners)
        for mid in list(self.members):
            if mid not in ids:
                del self.members[mid]
        for mid in ids:
            m = self.members.get(mid) or self._placeholder(mid)
            learner = mid in conf_state.learners
            if m.is_learner != learner or mid not in self.members:
                self.members[mid] = replace(m, is_learner=learner)

    def snapshot(self) -> bytes:
        return json.dumps(
            {
                "format": REGISTRY_FORMAT,
                "members": [m.to_json() for m in self.list()],
                "removed": sorted(self.removed),
            },
            separators=(",", ":"),
        ).encode()

    def restore(self, blob: bytes | None, conf_state: ConfState) -> None:
        """Replace the table with a snapshot's (``None``: a snapshot made before the
        registry existed: rebuilt from ``conf_state`` and the known attributes)."""
        self.members = {}
        if blob is not None:
            try:
                obj = json.loads(blob)
                if obj.get("format") != REGISTRY_FORMAT:
                    raise ValueError(f"unknown registry format {obj.get('format')!r}")
                members = [Member.from_json(m) for m in obj["members"]]
                removed = {int(i) for i in obj.get("removed", ())}
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise MembersFrameError(f"bad member registry in snapshot: {exc}") from None
            self.members = {m.id: m for m in members}
            self.removed = removed
        self.reconcile(conf_state)

    def is_started(self, mid: int) -> bool:
        m = self.members.get(mid)
        return m is not None and bool(m.name)

    def voters(self) -> list[Member]:
        return [m for m in self.list() if not m.is_learner]

    def learners(self) -> list[Member]:
        return [m for m in self.list() if m.is_learner]


def _merge(m: Member, ctx: dict) -> Member:
    """``m`` with the attributes present in a conf-change context."""

    def urls(key, old):
        value = ctx.get(key)
        return tuple(str(u) for u in value) if isinstance(value, list) else old

    name = ctx.get("name")
    return replace(
        m,
        name=str(name) if isinstance(name, str) and name else m.name,
        peer_urls=urls("peerURLs", m.peer_urls),
        client_urls=urls("clientURLs", m.client_urls),
    )


# --- etcd's checks (pure, so they are testable without a cluster) --------------------------


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


# --- responses ------------------------------------------------------------------------------


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


def new_member_id(registry: MemberRegistry) -> int:
    """A fresh ID (etcd hashes the URLs with the time; a random one is as unique)."""
    while True:
        mid = int.from_bytes(os.urandom(8), "big")
        if mid and mid not in registry.members and mid not in registry.removed:
            return mid


# --- identity of a joining or restarted node -------------------------------------------------


def read_wal_identity(wal_dir: str) -> tuple[int, int] | None:
    """``(member_id, cluster_id)`` from the WAL's metadata record, or None without a WAL."""
    from kvserver.server.node_storage import decode_metadata
    from wal.decoder import iter_raw_records

    try:
        names = sorted(n for n in os.listdir(wal_dir) if n.endswith(".wal"))
    except FileNotFoundError:
        return None
    for name in names:
        with open(os.path.join(wal_dir, name), "rb") as f:
            head = f.read(1 << 16)
        try:
            for rec in iter_raw_records(head):
                if rec.type == 1 and rec.data is not None:
                    return decode_metadata(rec.data)
        except Exception:  # a damaged head: let storage recovery report it
            continue
    return None


# How long members may keep answering without this member before joining fails: a `member
# add` is answered once the leader applied it, and the others apply it a moment later.
NOT_LISTED_GRACE_S = 5.0


async def discover_cluster(
    local_peer_urls: tuple[str, ...],
    peer_urls: Iterable[str],
    timeout_s: float = 30.0,
    *,
    peer_ssl=None,
) -> tuple[int, int, list[Member]]:
    """Ask running members (``GET /raft/members`` on their peer URLs) for the cluster:
    returns ``(local member id, cluster id, members)``; the local ID is the member whose
    peer URLs are ours (it was added with ``member add``)."""
    import aiohttp

    urls = [u for u in peer_urls if u not in local_peer_urls]
    if not urls:
        raise ClusterConfigError(
            "--initial-cluster-state existing: --initial-cluster names no other member to join"
        )
    deadline = asyncio.get_running_loop().time() + timeout_s
    not_listed_since: float | None = None  # when a member first answered without us
    last_error = "no answer"
    # peer_ssl: the member's peer TLS dial context (kvserver.tls) for https peer URLs
    async with aiohttp.ClientSession(
        timeout=aiohttp.ClientTimeout(total=2.0),
        connector=aiohttp.TCPConnector(ssl=True if peer_ssl is None else peer_ssl),
    ) as session:
        while True:
            for url in urls:
                try:
                    async with session.get(url.rstrip("/") + "/raft/members") as resp:
                        if resp.status != 200:
                            last_error = f"{url}: HTTP {resp.status}"
                            continue
                        body = await resp.json()
                    members = [Member.from_json(m) for m in body["members"]]
                    cid = int(body["cluster_id"])
                except (
                    aiohttp.ClientError,
                    OSError,
                    TimeoutError,
                    ValueError,
                    KeyError,
                    TypeError,
                ) as exc:
                    last_error = f"{url}: {exc}"
                    continue
                mine = set(local_peer_urls)
                for m in members:
                    if set(m.peer_urls) == mine:
                        return m.id, cid, members
                # Not final: a member that has not applied the `member add` yet (it was just
                # committed) lists the cluster without us; ask the others, and again.
                if not_listed_since is None:
                    not_listed_since = asyncio.get_running_loop().time()
            now = asyncio.get_running_loop().time()
            if not_listed_since is not None and now - not_listed_since >= NOT_LISTED_GRACE_S:
                raise ClusterConfigError(
                    f"this member's peer URLs {','.join(local_peer_urls)} are not in the "
                    f"cluster's member list (add it first: raftkv member add NAME "
                    f"--peer-urls {','.join(local_peer_urls)})"
                )
            if now >= deadline:
                raise ClusterConfigError(f"cannot reach the existing cluster: {last_error}")
            await asyncio.sleep(0.2)


# --- the runtime service ----------------------------------------------------------------------


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
        self._lock: asyncio.Lock | None = None
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
        self._lock = asyncio.Lock()
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
            m = replace(self.registry.get(mid), is_learner=False)
            await self._propose(
                ConfChange(ConfChangeType.ADD_NODE, mid, json.dumps(m.to_json()).encode())
            )
        return MemberChangeResponse(self._header(), self.registry.list())

    async def member_update(self, mid: int, peer_urls: Iterable[str]) -> MemberChangeResponse:
        urls = check_peer_urls(peer_urls)
        self._require_leader()
        async with self._lock:
            self._require_leader()
            if self.registry.get(mid) is None:
                raise member_not_found()
            taken = {u for m in self.registry.list() if m.id != mid for u in m.peer_urls}
            if taken & set(urls):
                raise _precondition(MSG_PEER_URL_EXIST)
            ctx = {"id": mid, "peerURLs": list(urls)}
            await self._propose(
                ConfChange(ConfChangeType.UPDATE_NODE, mid, json.dumps(ctx).encode())
            )
        return MemberChangeResponse(self._header(), self.registry.list())


async def resolve_identity(
    cfg, derived_member_id: int, derived_cluster_id: int, *, peer_ssl=None
) -> tuple[int, int, list[Member]]:
    """``(member id, cluster id, known members)`` of the member ``cfg`` describes: from its
    WAL when it has one (a restart: the flags are not consulted, as etcd), else from the
    running cluster for ``--initial-cluster-state existing``, else derived from the flags."""
    # Seeds must be what every node derives alike (no client URLs: those are published
    # through raft), or the registries of the members would differ.
    local = Member(derived_member_id, cfg.name, tuple(cfg.initial_advertise_peer_urls))
    known = [m for m in cfg.members if m.name != cfg.name]
    ident = read_wal_identity(cfg.wal_dir)
    if ident is not None:
        mid, cid = ident
        return mid, cid, [*known, replace(local, id=mid)]
    if cfg.initial_cluster_state == "existing":
        peer_urls = [u for m in cfg.members if m.name != cfg.name for u in m.peer_urls]
        mid, cid, remote = await discover_cluster(local.peer_urls, peer_urls, peer_ssl=peer_ssl)
        log.info("joining cluster %x as member %x (%d members)", cid, mid, len(remote))
        return mid, cid, remote
    return derived_member_id, derived_cluster_id, [*known, local]


class LocalMembership:
    """The membership API without raft, for ``tests/api/fakes.LocalKV`` and API tests: every
    change applies at once through the same registry and the same checks; every member counts
    as connected and as in sync with the leader (``unsynced`` lists learners that are not)."""

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
        if self.registry.get(mid) is None:
            raise member_not_found()
        if {u for m in self.registry.list() if m.id != mid for u in m.peer_urls} & set(urls):
            raise _precondition(MSG_PEER_URL_EXIST)
        self._apply(
            ConfChange(
                ConfChangeType.UPDATE_NODE,
                mid,
                json.dumps({"id": mid, "peerURLs": list(urls)}).encode(),
            )
        )
        return MemberChangeResponse(self._header(), self.registry.list())
